"""Preflight: the catalogue of bad inputs, each refused with its own code and a message naming the fix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from common.report import Log, Problems
from configuration import config, settings
from conftest import ROOT, copy_sglang, kit_env
from entrypoint import doctor, preflight, weights
from helpers.sandbox import NEEDS_BWRAP, sandbox
from helpers.unprivileged import reachable_copy

SMI = ROOT / "tests" / "fixtures" / "nvidia-smi"
SHARDS = [
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
]


def make_model(folder: Path) -> Path:
    """A small stand-in for the GLM-5-NVFP4 folder layout: the files preflight reads, tiny shards."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"})
    )
    (folder / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt", "version": "0.37.0"},
                "quantization": {"quant_algo": "NVFP4", "group_size": 16},
            }
        )
    )
    weight_map = {f"model.layers.{i}.mlp.weight": SHARDS[i % 3] for i in range(9)}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    for shard in SHARDS:
        (folder / shard).write_bytes(b"\0" * 64)
    return folder


def values_for(model: Path, **extra: Any) -> dict[str, Any]:
    return config.resolve({"GLM5_MODEL_DIR": str(model)}).values | extra


def gpu_findings(name: str, environ: dict[str, str] | None = None) -> list[preflight.Finding]:
    return doctor.gpu_problems((SMI / name).read_text(), config.resolve({}).values, environ or {})


@pytest.mark.parametrize("name", ["ok-8x-workstation-596.csv", "ok-8x-server-580.csv", "ok-8x-maxq-590.csv"])
def test_real_rtx_pro_6000_machines_pass(name: str) -> None:
    assert gpu_findings(name) == []


GPU_CASES = [
    ("bad-4x-workstation.csv", doctor.GPU_COUNT, "4 GPU(s) visible"),
    ("bad-8x-h100.csv", doctor.GPU_PRODUCT, "is not an RTX PRO 6000"),
    ("bad-8x-h100.csv", doctor.GPU_COMPUTE_CAPABILITY, "compute capability 9.0"),
    ("bad-8x-h100.csv", doctor.GPU_DRIVER, "driver 570.133.20"),
    ("bad-8x-rtx6000-ada.csv", doctor.GPU_COMPUTE_CAPABILITY, "compute capability 8.9"),
    ("bad-8x-rtx6000-ada.csv", doctor.GPU_MEMORY, "49140 MiB"),
    ("bad-8x-rtx5090.csv", doctor.GPU_PRODUCT, "GeForce RTX 5090"),
    ("bad-8x-rtx5090.csv", doctor.GPU_MEMORY, "32607 MiB"),
    ("bad-8x-driver-570.csv", doctor.GPU_DRIVER, "upgrade the host driver"),
    ("bad-mixed-7-plus-1.csv", doctor.GPU_PRODUCT, "GPU 7 (00000000:E1:00.0"),
    ("bad-8x-vgpu-slice.csv", doctor.GPU_MEMORY, "no MIG, no vGPU"),
    ("bad-unreadable-row.csv", doctor.GPU_QUERY_UNREADABLE, "unreadable nvidia-smi row"),
    ("bad-no-devices.txt", doctor.NVIDIA_SMI_FAILED, "sees no GPU"),
    ("bad-old-header.csv", doctor.GPU_QUERY_UNREADABLE, "unexpected nvidia-smi header"),
]


@pytest.mark.parametrize(("name", "code", "message"), GPU_CASES)
def test_wrong_machines_are_refused(name: str, code: int, message: str) -> None:
    findings = gpu_findings(name)
    assert any(f.code == code and message in f.message for f in findings), [str(f) for f in findings]


def test_only_the_bad_gpu_is_named_in_a_mixed_box() -> None:
    findings = gpu_findings("bad-mixed-7-plus-1.csv")
    assert {f.message.split(" (")[0] for f in findings} == {"GPU 7"}


def test_gpu_count_names_visible_devices() -> None:
    findings = gpu_findings("bad-4x-workstation.csv", {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert "visible devices 0,1,2,3" in findings[0].message
    assert "0@00000000:01:00.0" in findings[0].message


MODEL_CASES: list[tuple[str, Callable[[Path], None], int, str]] = [
    (
        "folder missing",
        lambda m: None,
        preflight.MODEL_DIR_MISSING,
        "hf download nvidia/GLM-5-NVFP4 --local-dir",
    ),
    (
        "no config.json",
        lambda m: (m / "config.json").unlink(),
        preflight.MODEL_CONFIG,
        "config.json is missing",
    ),
    (
        "config.json broken",
        lambda m: (m / "config.json").write_text("{"),
        preflight.MODEL_CONFIG,
        "unreadable",
    ),
    (
        "wrong architecture",
        lambda m: (m / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]})),
        preflight.MODEL_ARCHITECTURE,
        "['DeepseekV3ForCausalLM'], not GlmMoeDsaForCausalLM",
    ),
    (
        "BF16 checkpoint",
        lambda m: (m / "hf_quant_config.json").unlink(),
        preflight.MODEL_QUANTIZATION,
        "not a ModelOpt NVFP4",
    ),
    (
        "FP8 checkpoint",
        lambda m: (m / "hf_quant_config.json").write_text(
            json.dumps({"quantization": {"quant_algo": "FP8"}})
        ),
        preflight.MODEL_QUANTIZATION,
        "quant_algo NVFP4",
    ),
    (
        "no index",
        lambda m: (m / "model.safetensors.index.json").unlink(),
        preflight.MODEL_INDEX,
        "download is incomplete",
    ),
    (
        "half-finished download",
        lambda m: (m / SHARDS[1]).unlink(),
        preflight.MODEL_SHARDS,
        "1 of 3 shards missing (model-00002",
    ),
    ("empty shard", lambda m: (m / SHARDS[2]).write_bytes(b""), preflight.MODEL_SHARDS, "1 empty"),
    (
        "hub leftovers",
        lambda m: (m / ".cache/huggingface/download").mkdir(parents=True)
        or (m / ".cache/huggingface/download/x.incomplete").write_text("x"),
        preflight.MODEL_SHARDS,
        "unfinished download",
    ),
]


@pytest.mark.parametrize(("case", "damage", "code", "message"), MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_bad_model_folders_are_refused(
    tmp_path: Path, case: str, damage: Callable[[Path], None], code: int, message: str
) -> None:
    model = tmp_path / "GLM-5-NVFP4"
    if case != "folder missing":
        make_model(model)
    damage(model)
    findings = preflight.check_model(values_for(model))
    assert [f.code for f in findings] == [code], [str(f) for f in findings]
    assert message in findings[0].message
    assert findings[0].setting == "GLM5_MODEL_DIR"


def test_a_complete_model_folder_passes(tmp_path: Path) -> None:
    assert preflight.check_model(values_for(make_model(tmp_path / "m"))) == []


def test_modelopt_quantization_config_in_config_json_is_accepted(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    (model / "hf_quant_config.json").unlink()
    cfg = json.loads((model / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    (model / "config.json").write_text(json.dumps(cfg))
    assert preflight.check_model(values_for(model)) == []


def test_shm_size_is_measured(tmp_path: Path) -> None:
    values = config.resolve({}).values
    assert doctor.shm_problems(values | {"min_shm_gib": 0}, tmp_path) == []
    findings = doctor.shm_problems(values | {"min_shm_gib": 10**9}, tmp_path)
    assert findings[0].code == doctor.SHM_TOO_SMALL and "ipc: host" in findings[0].message


@pytest.mark.boots
def test_flashinfer_check_uses_patches_verify(
    monkeypatch: pytest.MonkeyPatch,
    unpatched_tree: Path,
    patched_tree: Path,
    patched_sglang_tree: Path,
    fake_nvcc: Path,
    tmp_path: Path,
) -> None:
    """Each check patches/verify fails is a finding, named by what fixes it: the override's setting, or the FlashInfer
    or SGLang install. (patches/verify's own outcomes, malformed values included, are tests/test_patches.py's.)"""
    monkeypatch.setenv("PATH", f"{fake_nvcc / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("FLASHINFER_CUDA_VERSION", "12.9")
    monkeypatch.setenv("PYTHONPATH", f"{patched_tree}{os.pathsep}{patched_sglang_tree}")
    assert preflight.check_flashinfer() == []
    monkeypatch.setenv("FLASHINFER_CUDA_VERSION", "13.0")
    mismatch = preflight.check_flashinfer()
    assert [(f.code, f.setting) for f in mismatch] == [(preflight.FLASHINFER, "FLASHINFER_CUDA_VERSION")]
    assert "says 12.9" in mismatch[0].message
    monkeypatch.setenv("FLASHINFER_CUDA_VERSION", "12.9")
    monkeypatch.setenv("PYTHONPATH", f"{unpatched_tree}{os.pathsep}{patched_sglang_tree}")
    unpatched = preflight.check_flashinfer()
    assert [(f.code, f.setting) for f in unpatched] == [(preflight.FLASHINFER, "FlashInfer")]
    assert "run patches/apply" in unpatched[0].message
    monkeypatch.setenv("PYTHONPATH", f"{patched_tree}{os.pathsep}{copy_sglang(tmp_path / 'sglang')}")
    sglang = preflight.check_flashinfer()
    assert [(f.code, f.setting) for f in sglang] == [(preflight.FLASHINFER, "SGLang")] * 3
    assert all("run patches/apply" in f.message for f in sglang)


# torch 2.14.1 with transformers and triton, as the image
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
GLM5_CONFIG = ROOT / "tests" / "fixtures" / "glm5-config"


# entrypoint/resolve_flags.py's main once for each argv, in one process: sglang is imported once, not once an argv
# (about 9 CPU-seconds each). Each result: its exit code and what it wrote to stderr.
EACH_ARGV = """
import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import resolve_flags
results = []
for argv in json.loads(sys.argv[2]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = resolve_flags.main(argv)
        except SystemExit as exit:  # argparse's own refusal
            code = exit.code
    results.append({"code": code, "stderr": err.getvalue()})
print(json.dumps(results))
"""


@pytest.mark.skipif(not BENCH_PYTHON.exists(), reason="ci/setup-test-env bench makes .venv-bench")
@pytest.mark.boots
def test_server_flags_go_through_sglangs_own_resolution() -> None:
    """argparse, then resolve_once with the model's config and check_server_args: combinations only the
    resolution refuses fail at preflight, in seconds, not after the load. Through preflight.check_flags (one
    sglang import a call): the kit's flags pass, and a refusal of a flag from GLM5_EXTRA_ARGS names that setting.
    The other two layers' refusals through resolve_flags' main in one process (what check_flags runs; its last
    stderr line is the reason check_flags gives). A bare assertion's wording: the next test."""
    argv = config.resolve({"GLM5_MODEL_DIR": str(GLM5_CONFIG)}).public_argv()[3:]
    assert preflight.check_flags(argv, str(BENCH_PYTHON)) == []
    extra = ["--retraction-policy", "priority"]  # check_server_args
    found = preflight.check_flags([*argv, *extra], str(BENCH_PYTHON), extra_args=extra)
    assert [f.code for f in found] == [preflight.SERVER_FLAGS], found
    assert "requires --enable-priority-scheduling" in found[0].message, found[0].message
    assert found[0].setting == "GLM5_EXTRA_ARGS" and "fix or remove the flag" in found[0].message
    layers = [
        (["--no-such-flag"], 2, "unrecognized arguments: --no-such-flag"),  # argparse
        (["--context-length", "999999999"], 1, "is greater than the derived context_length (202752)"),
    ]
    done = subprocess.run(
        [str(BENCH_PYTHON), "-c", EACH_ARGV, str(ROOT / "entrypoint"),
         json.dumps([[*argv, *extra] for extra, _, _ in layers])],
        capture_output=True, text=True, check=False, timeout=300,
        env=dict(os.environ) | {"HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for (extra, code, said), result in zip(layers, json.loads(done.stdout), strict=True):
        last = [ln for ln in result["stderr"].strip().splitlines() if ln.strip()][-1]
        assert (result["code"], said in last) == (code, True), (extra, result)


def test_a_bare_assertion_of_the_resolution_is_worded(tmp_path: Path) -> None:
    """resolve_once asserts without a message in places (0.5.23 server_args.py: `--attn-dp-size 3` with tp 8):
    preflight's reason then says so rather than ending at `AssertionError: `. sglang stood in for by its two calls
    (prepare_server_args, then resolve_once on what it returns), as entrypoint/resolve_flags.py makes them, and a
    torch with a device (the box's, so nothing is stated for it)."""
    fake = tmp_path / "fake"
    (fake / "sglang" / "srt").mkdir(parents=True)
    (fake / "torch").mkdir()
    (fake / "torch" / "__init__.py").write_text(
        "class cuda:\n    is_available = staticmethod(lambda: True)\n"
    )
    for package in (fake / "sglang", fake / "sglang" / "srt"):
        (package / "__init__.py").write_text("")
    (fake / "sglang" / "srt" / "server_args.py").write_text(
        "class Args:\n"
        "    def resolve_once(self):\n        assert 3 % 2 == 0\n"
        "    def check_server_args(self):\n        pass\n"
        "def prepare_server_args(argv):\n    return Args()\n"
    )
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.base_prefix}/bin/python3 "$@"\n')
    python.chmod(0o755)
    (found,) = preflight.check_flags(["--attn-dp-size", "3"], str(python))
    assert found.code == preflight.SERVER_FLAGS, found
    assert (
        "sglang refused the server flags: AssertionError: (an assertion without a message)" in found.message
    )


@pytest.mark.boots
def test_sglang_that_cannot_be_imported_is_the_images_fault_not_extra_args(tmp_path: Path) -> None:
    """A preflight whose Python lacked sglang's dependencies said `[42] GLM5_EXTRA_ARGS: sglang refused the server
    flags: ModuleNotFoundError ...`, with GLM5_EXTRA_ARGS empty. Here a Python with no sglang at all stands in."""
    argv = config.resolve({"GLM5_MODEL_DIR": str(GLM5_CONFIG)}).public_argv()[3:]
    bare = tmp_path / "python"  # the system Python, without the kit's venvs on its path
    bare.write_text(f'#!/bin/sh\nexec env -u PYTHONPATH {sys.base_prefix}/bin/python3 -I "$@"\n')
    bare.chmod(0o755)
    (found,) = preflight.check_flags(argv, str(bare))
    assert found.code == preflight.SERVER_FLAGS and found.setting == "the image", found
    assert "ModuleNotFoundError: No module named" in found.message and "rebuild it" in found.fix


def test_the_preflight_exit_code_table_holds_each_code_of_preflight_and_the_doctor_once() -> None:
    """docs/reference.md's table is rendered from preflight.EXIT_CODES (ci/render): it lacked none of the codes,
    but a new one must not go missing from it."""
    listed = [code for codes, _, _ in preflight.EXIT_CODES for code in codes]
    constants = {
        value
        for module in (preflight, doctor)
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool) and 2 < value < 100
    }
    assert sorted(listed) == sorted(constants)


def test_skip_setting_is_validated_and_logged(tmp_path: Path) -> None:
    assert settings.resolve({"GLM5_SKIP_PREFLIGHT": "gpu,shm"})["skip_preflight"] == {"gpu", "shm"}
    every = settings.resolve({"GLM5_SKIP_PREFLIGHT": "all"})["skip_preflight"]
    assert every == {"gpu", "shm", "model", "flashinfer", "flags"}
    with pytest.raises(Problems) as err:
        settings.resolve({"GLM5_SKIP_PREFLIGHT": "gpus"})
    problem = err.value.problems[0]
    assert problem.code == preflight.SKIP_SETTING and "unknown check(s) gpus" in problem.message
    lines: list[str] = []
    log = Log("t")
    log.warning = lines.append  # type: ignore[method-assign]
    found = preflight.run(values_for(make_model(tmp_path / "m"), skip_preflight=every), {}, log, [])
    assert found == [] and len(lines) == 5 and "check 'gpu' skipped by GLM5_SKIP_PREFLIGHT" in lines[2]


def run_prepare(tmp_path: Path, smi_fixture: str, **env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat '{SMI / smi_fixture}'\n")
    smi.chmod(0o755)
    full = kit_env("FLASHINFER_") | {"PATH": f"{bin_dir}:{os.environ['PATH']}"} | env
    return subprocess.run(
        [str(ROOT / "entrypoint/launch"), "--prepare"],
        capture_output=True,
        text=True,
        env=full,
        check=False,
        timeout=300,
    )


def test_prepare_collects_every_problem_and_exits_with_the_first_code(tmp_path: Path) -> None:
    done = run_prepare(
        tmp_path,
        "bad-4x-workstation.csv",
        GLM5_MODEL_DIR=str(tmp_path / "absent"),
        GLM5_SKIP_PREFLIGHT="shm,flashinfer,flags",
    )
    assert done.returncode == doctor.GPU_COUNT
    assert "warning: preflight: check 'shm' skipped by GLM5_SKIP_PREFLIGHT" in done.stderr
    assert "[13] GPUs: 4 GPU(s) visible" in done.stderr
    assert "[30] GLM5_MODEL_DIR" in done.stderr
    assert "2 preflight problem(s)" in done.stderr


def test_prepare_passes_on_a_good_box(tmp_path: Path) -> None:
    model = make_model(tmp_path / "m")
    done = run_prepare(
        tmp_path,
        "ok-8x-server-580.csv",
        GLM5_MODEL_DIR=str(model),
        GLM5_SKIP_PREFLIGHT="shm,flashinfer,flags",
    )
    assert done.returncode == 0, done.stderr
    assert "preflight: ok" in done.stderr


DOWNLOAD = ROOT / "entrypoint" / "download"
HF_BIN = ROOT / ".venv-bench" / "bin"  # the image's huggingface_hub (1.33.0) and its `hf` command


def run_download(
    env: dict[str, str], *prefix: str, download: Path = DOWNLOAD
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GLM5_", "HF_"))}
    base["PATH"] = f"{HF_BIN}:{base['PATH']}"
    return subprocess.run(
        [*prefix, str(download)],
        env=base | env,
        cwd=download.parent.parent,  # python -m puts the working folder on the path: the kit's own, not this one
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_start_no_longer_downloads_and_names_the_step_that_does() -> None:
    with pytest.raises(Problems) as err:
        settings.resolve({"GLM5_DOWNLOAD": "1"})
    assert [str(p) for p in err.value.problems] == [
        "GLM5_DOWNLOAD: was removed; fix: download the weights as a step before the start: `docker compose run "
        "--rm download` (compose) or the weights Job (k8s/base/job-weights.yaml); a 410 GB download inside the "
        "start would outlast its 40-minute budget (startup_budget_seconds)"
    ]


@pytest.mark.boots
def test_download_runs_the_real_hf_with_the_token_in_its_environment_only(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("hf_secret_token_value\n")
    values = config.resolve({"GLM5_MODEL_DIR": str(tmp_path / "m"), "HF_TOKEN_FILE": str(token)}).values
    argv = weights.command(values)
    assert argv == ["hf", "download", "nvidia/GLM-5-NVFP4", "--local-dir", str(tmp_path / "m")]
    assert not any("hf_secret" in a for a in argv)
    env = weights.child_env({"HF_TOKEN_FILE": str(token), "PATH": "/bin"}, values["hf_token"])
    assert env == {"HF_TOKEN": "hf_secret_token_value", "PATH": "/bin"}
    # Every option we pass exists in the image's hf (the real CLI's --help).
    helped = subprocess.run(
        [str(HF_BIN / "hf"), "download", "--help"], capture_output=True, text=True, check=True, timeout=60
    )
    assert "--local-dir" in helped.stdout
    # The real hf, offline here: it fails, and the failure is named with the way to resume.
    done = run_download(
        {"GLM5_MODEL_DIR": str(tmp_path / "m"), "HF_TOKEN_FILE": str(token), "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == preflight.MODEL_DIR_MISSING, done.stderr
    assert "`hf download` exited" in done.stderr and "run it again to resume" in done.stderr
    assert "hf_secret_token_value" not in done.stdout + done.stderr


def test_download_of_a_folder_uid_1000_cannot_write_names_the_fix(request: pytest.FixtureRequest) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to drop to UID 1000 (setpriv)")
    host = Path(tempfile.mkdtemp(prefix="glm5-root-owned-"))  # /tmp: pytest's own folder is 0700
    host.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(host))
    kit = reachable_copy(
        "common", "configuration", "entrypoint", "kernels"
    )  # UID 1000 may not reach the checkout itself
    request.addfinalizer(lambda: shutil.rmtree(kit))
    done = run_download(
        {"GLM5_MODEL_DIR": str(host / "GLM-5-NVFP4")},
        "setpriv",
        "--reuid",
        "1000",
        "--regid",
        "1000",
        "--clear-groups",
        download=kit / "entrypoint" / "download",
    )
    assert done.returncode == preflight.MODEL_DIR_MISSING, done.stderr
    assert f"GLM5_MODEL_HOST_DIR: {host} is not writable by UID 1000" in done.stderr
    assert "sudo install -d -o 1000 -g 0" in done.stderr
    assert not (host / "GLM-5-NVFP4").exists()


@NEEDS_BWRAP
@pytest.mark.boots
def test_download_into_the_serving_services_read_only_weights_names_the_service_that_writes(
    tmp_path: Path,
) -> None:
    """`docker compose run --rm glm5 download`, once the glm5 service mounts the weights read-only: bubblewrap's
    read-only bind stands for the mount (root's write permission does not help on a read-only mount)."""
    weights = tmp_path / "GLM-5-NVFP4"
    weights.mkdir()
    done = run_download({"GLM5_MODEL_DIR": str(weights)}, *sandbox(ROOT, ("ro", weights)))
    assert done.returncode == preflight.MODEL_DIR_MISSING, done.stderr
    assert f"download: {weights} is mounted read-only" in done.stderr
    assert "`docker compose run --rm download`" in done.stderr
    assert not any(weights.iterdir())


@pytest.mark.boots
def test_download_checks_the_folder_as_preflight_does(tmp_path: Path) -> None:
    # Offline, the real hf returns an existing folder as it is ("Returning existing local_dir"), exit 0:
    # the completeness check after it is what tells a finished download from a broken one.
    model = make_model(tmp_path / "m")
    (model / SHARDS[1]).unlink()
    env = {"GLM5_MODEL_DIR": str(model), "HF_HUB_OFFLINE": "1"}
    done = run_download(env)
    assert done.returncode == preflight.MODEL_SHARDS, done.stderr
    assert "1 of 3 shards missing" in done.stderr
    make_model(model)
    done = run_download(env)
    assert done.returncode == 0, done.stderr
    assert "is complete in" in done.stderr


@pytest.mark.boots
def test_the_pods_init_container_waits_until_the_weights_are_complete(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GLM5_", "HF_"))}
    waiting = subprocess.Popen(
        [str(DOWNLOAD), "--wait", "--interval", "0.2"],
        env=base | {"GLM5_MODEL_DIR": str(model)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        assert waiting.poll() is None  # an empty folder: still waiting
        make_model(model)
        assert waiting.wait(timeout=30) == 0
    finally:
        waiting.kill()
    said = waiting.stderr.read() if waiting.stderr else ""
    assert said.count("waiting for the weights") == 1 and "is empty" in said  # said once, not every check
    assert "is complete: the server can start" in said


def test_mtp_is_refused_for_a_checkpoint_without_its_layer(tmp_path: Path) -> None:
    """SGLang loads into the draft model only the weights under model.layers.<num_hidden_layers>. and skips the rest
    without a word (deepseek_weight_loader.py): GLM5_SPECULATIVE=mtp on a checkpoint without them would serve with
    MTP that never fires."""
    model = make_model(tmp_path / "m")
    real = json.loads((ROOT / "tests/fixtures/glm5-config/config.json").read_text())
    (model / "config.json").write_text(json.dumps(real))  # num_hidden_layers 78, num_nextn_predict_layers 1
    values = values_for(model, speculative="mtp")
    (problem,) = preflight.check_model(values)
    assert problem.code == preflight.MODEL_MTP and problem.setting == "GLM5_SPECULATIVE"
    assert "model.layers.78.*" in problem.fix
    assert preflight.check_model(values_for(model)) == []  # without MTP the same folder passes
    index = model / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.layers.78.eh_proj.weight"] = SHARDS[0]
    index.write_text(json.dumps(data))
    assert preflight.check_model(values) == []
