"""Preflight: the catalogue of bad inputs, each refused with its own code and a message naming the fix."""

from __future__ import annotations

import dataclasses
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
from configuration import config, settings, state
from conftest import ROOT, copy_sglang, kit_env
from entrypoint import doctor, launch, preflight, resolution, weights
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


# SGLang 0.5.23 with its full dependencies, run on a CPU (tests/stubs/sglang_cpu: triton stubbed, SGLANG_USE_CPU_ENGINE)
SGLANG_CPU_PYTHON = ROOT / ".venv-sglang-cpu" / "bin" / "python"
SGLANG_CPU_ENV = {"PYTHONPATH": str(ROOT / "tests" / "stubs" / "sglang_cpu"), "SGLANG_USE_CPU_ENGINE": "1"}
GLM5_CONFIG = (
    ROOT / "tests" / "fixtures" / "glm5-config"
)  # the checkpoint's config.json and hf_quant_config.json
LATENCY: dict[str, str] = {}
THROUGHPUT_D4 = {"GLM5_PROFILE": "throughput", "GLM5_ATTN_DP_SIZE": "4"}


def effective_of(env: dict[str, str]) -> config.Effective:
    """A start's configuration with the checkpoint's config as the model folder."""
    return config.resolve({"GLM5_MODEL_DIR": str(GLM5_CONFIG), **env})


def server_args_of(effective: config.Effective) -> list[str]:
    return effective.public_argv()[len(config.SERVER_PROGRAM) :]


# entrypoint/resolve_flags.py's main once for each argv, in one process: sglang is imported once, not once an argv
# (about 6-11 CPU-seconds; each further resolution about 0.1 s). Each result: its exit code and what it printed, which
# resolution.answer reads as it reads the runner's process.
EACH_ARGV = """
import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import resolve_flags
results = []
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = resolve_flags.main(argv)
        except SystemExit as exit:  # argparse's own refusal
            code = exit.code
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print("EACH-ARGV " + json.dumps(results))
"""
REFUSED_EXTRA = ["--retraction-policy", "priority"]  # check_server_args refuses it
LAYERS = [
    (["--no-such-flag"], "usage", "unrecognized arguments: --no-such-flag"),  # argparse
    (["--context-length", "999999999"], "refused", "is greater than the derived context_length (202752)"),
]


@pytest.fixture(scope="module")
def sglang_answers() -> dict[str, resolution.Resolved | resolution.Failed]:
    """The real SGLang 0.5.23's answers, by the runner preflight runs, in the server's environment as launch --prepare
    gives it (launch.server_env): the latency profile, the throughput profile at D=4, and three refusals, one from each
    layer (check_server_args, argparse, resolve_once)."""
    if not SGLANG_CPU_PYTHON.exists():
        pytest.skip("ci/setup-test-env makes .venv-sglang-cpu")
    latency, throughput = effective_of(LATENCY), effective_of(THROUGHPUT_D4)
    argvs = {
        "latency": server_args_of(latency),
        "throughput": server_args_of(throughput),
        "extra": [*server_args_of(latency), *REFUSED_EXTRA],
        **{layer: [*server_args_of(latency), *extra] for extra, layer, _ in LAYERS},
    }
    environ = dict(os.environ) | SGLANG_CPU_ENV
    env = resolution.runner_env(launch.server_env(environ, latency.server_env(environ)[0]))
    done = subprocess.run(
        [str(SGLANG_CPU_PYTHON), "-c", EACH_ARGV, str(ROOT / "entrypoint"),
         json.dumps([["--kv-tokens", str(resolution.KV_TOKENS), *argv] for argv in argvs.values()])],
        capture_output=True, text=True, check=False, timeout=300, env=env,
    )  # fmt: skip
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("EACH-ARGV ")), None)
    assert line is not None, done.stderr[-3000:]
    results = json.loads(line.removeprefix("EACH-ARGV "))
    return {
        name: resolution.answer(r["code"], r["stdout"], r["stderr"])
        for name, r in zip(argvs, results, strict=True)
    }


@pytest.mark.xdist_group("sglang_resolution_preflight")  # the module's one resolution process, on one worker
@pytest.mark.boots
def test_the_kit_expects_what_sglangs_resolution_settles(
    sglang_answers: dict[str, resolution.Resolved | resolution.Failed],
) -> None:
    """Issue 52: what a rank captures is SGLang's to settle, and the healthcheck waits for the kit's counts after the
    weights load. Preflight holds the kit's expectation to 0.5.23's own resolution of the start's flags (the prefill
    chunk and shapes from the resolved record, the decode batches by 0.5.23's capture function on it): the latency
    profile and the throughput profile at D=4 agree (2564857: 42 prefill shapes at D=4, not 58)."""
    figures = {"latency": (8192, 58, 52), "throughput": (2048, 42, 51)}
    for name, env in (("latency", LATENCY), ("throughput", THROUGHPUT_D4)):
        effective, found = effective_of(env), sglang_answers[name]
        assert isinstance(found, resolution.Resolved), found
        captures = found.captures
        assert (captures.chunk, len(captures.prefill), len(captures.decode)) == figures[name]
        expected = resolution.Captures.expected(effective)
        assert preflight.judge(found, server_args_of(effective), "python3", (), expected) == [], name


@pytest.mark.xdist_group("sglang_resolution_preflight")
@pytest.mark.boots
def test_an_expectation_sglang_does_not_settle_refuses_the_start_naming_the_setting(
    sglang_answers: dict[str, resolution.Resolved | resolution.Failed], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The arithmetic before 2564857 (the chunk not divided by the attention-DP size: 58 prefill shapes at D=4), put
    back: SGLang's answer for D=4 refuses the start, each value with its own problem naming the setting, before the
    weights load. A decode expectation SGLang does not settle (the latency profile's list at D=4) names its setting."""
    found = sglang_answers["throughput"]
    monkeypatch.setattr(config, "prefill_chunk", lambda argv, attn_dp_size: 8192)
    effective = effective_of(THROUGHPUT_D4)
    problems = preflight.judge(
        found, server_args_of(effective), "python3", (), resolution.Captures.expected(effective)
    )
    assert [(p.code, p.setting) for p in problems] == [(preflight.SERVER_CAPTURES, "GLM5_PROFILE")] * 2
    chunk, shapes = (str(p) for p in problems)
    assert "sglang 0.5.23 resolves a rank's prefill chunk to 2048, the kit expects 8192" in chunk
    assert "prefill shapes to 42 (4..2048), the kit expects 58 (4..8192)" in shapes
    assert "--chunked-prefill-size 8192, --attn-dp-size 4" in shapes and "configuration/config.py" in shapes
    monkeypatch.undo()
    effective = effective_of(THROUGHPUT_D4)
    wrong = resolution.Captures.expected(effective_of(LATENCY))
    (decode,) = preflight.judge(
        found,
        server_args_of(effective),
        "python3",
        (),
        dataclasses.replace(resolution.Captures.expected(effective), decode=wrong.decode),
    )
    assert (decode.code, decode.setting) == (preflight.SERVER_CAPTURES, "GLM5_CUDA_GRAPH_MAX_BS_DECODE")
    assert "decode batches to 51 (2..512), the kit expects 52 (1..512)" in decode.message


@pytest.mark.xdist_group("sglang_resolution_preflight")
@pytest.mark.boots
def test_server_flags_go_through_sglangs_own_resolution(
    sglang_answers: dict[str, resolution.Resolved | resolution.Failed],
) -> None:
    """argparse, then resolve_once with the model's config and check_server_args: combinations only the
    resolution refuses fail at preflight, in seconds, not after the load. The kit's flags pass; a refusal of a flag
    from GLM5_EXTRA_ARGS names that setting; each layer's refusal is the reason preflight gives (its last stderr
    line). A bare assertion's wording: the next test."""
    argv = server_args_of(effective_of(LATENCY))
    assert preflight.judge(sglang_answers["latency"], argv, "python3") == []
    found = preflight.judge(sglang_answers["extra"], [*argv, *REFUSED_EXTRA], "python3", REFUSED_EXTRA)
    assert [f.code for f in found] == [preflight.SERVER_FLAGS], found
    assert "requires --enable-priority-scheduling" in found[0].message, found[0].message
    assert found[0].setting == "GLM5_EXTRA_ARGS" and "fix or remove the flag" in found[0].message
    for _, layer, said in LAYERS:
        answer = sglang_answers[layer]
        assert isinstance(answer, resolution.Failed) and (answer.kind, said in answer.reason) == (layer, True)
        (problem,) = preflight.judge(answer, argv, "python3")
        assert problem.code == preflight.SERVER_FLAGS and said in problem.message


def fake_python(folder: Path, answer: str) -> Path:
    """A `python3` for the server's PATH: as the resolution runner it records its arguments and environment and
    answers `answer` (shell: its output and exit); else it is this test's Python (entrypoint/launch runs on it)."""
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python3"
    python.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  */resolve_flags.py) printf "%s\\n" "$@" > "{folder}/args"; env > "{folder}/env"; {answer} ;;\n'
        f'  *) exec "{sys.executable}" "$@" ;;\n'
        "esac\n"
    )
    python.chmod(0o755)
    return python


@pytest.mark.boots
def test_prepare_resolves_with_the_servers_python_and_environment_and_refuses_what_sglang_does_not_settle(
    tmp_path: Path,
) -> None:
    """launch --prepare hands the resolution to the server's Python (`python3` on the server's PATH: the image's
    /opt/venv/bin/python3) in the server's environment (glm5.toml's [[env]] values, the kit's folder off PYTHONPATH),
    and an answer other than the kit's expectation is recorded as preflight's refusal (exit 43), before any start."""
    resolved = json.dumps({"chunk": 8192, "prefill": [4, 8192], "decode": [1, 512], "pool": 2048})
    folder = tmp_path / "bin"
    fake_python(folder, f"echo 'RESOLVED {resolved}'")
    env = kit_env("FLASHINFER_") | {
        "PATH": f"{folder}:{os.environ['PATH']}",
        "PYTHONPATH": str(tmp_path / "theirs"),
        "GLM5_SKIP_PREFLIGHT": "gpu,shm,model,flashinfer",
        "GLM5_CACHE_DIR": str(tmp_path / "cache"),
        **THROUGHPUT_D4,
    }
    done = subprocess.run(
        [str(ROOT / "entrypoint/launch"), "--prepare"],
        capture_output=True, text=True, env=env, check=False, timeout=120,
    )  # fmt: skip
    assert done.returncode == preflight.SERVER_CAPTURES, done.stderr
    assert (
        "[43] GLM5_PROFILE: sglang 0.5.23 resolves a rank's prefill chunk to 8192, the kit expects 2048"
        in done.stderr
    )
    assert (
        "[43] GLM5_CUDA_GRAPH_MAX_BS_DECODE: sglang 0.5.23 resolves a rank's decode batches to 2 (1..512)"
        in (done.stderr)
    )
    assert "3 preflight problem(s)" in done.stderr
    failed = state.read_failed(env["GLM5_STATE_DIR"])
    assert failed is not None and (failed["kind"], failed["code"]) == ("refused", preflight.SERVER_CAPTURES)
    args = (folder / "args").read_text().splitlines()
    assert args[0] == str(preflight.resolution.RUNNER) and args[1:4] == [
        "--kv-tokens",
        "4096",
        "--model-path",
    ]
    assert args[args.index("--attn-dp-size") + 1] == "4"
    seen = dict(line.split("=", 1) for line in (folder / "env").read_text().splitlines() if "=" in line)
    assert seen["SGLANG_CACHE_DIR"] == f"{tmp_path / 'cache'}/build-dev/sglang"  # glm5.toml's [[env]]
    assert (
        seen["PYTHONPATH"] == str(tmp_path / "theirs") and seen["HF_HUB_OFFLINE"] == "1"
    )  # the kit's folder off


FAILED_RUNS = [
    # (the runner's answer in shell, the code, the setting, what the message says)
    (
        "exit 0",
        preflight.SERVER_FLAGS,
        "the server flags",
        "resolving the server flags did not finish: exit 0",
    ),
    (
        "echo 'KeyError: x' >&2; exit 3",
        preflight.SERVER_CAPTURES,
        "the server flags",
        "cannot be read: KeyError: x",
    ),
    (
        "echo 'RESOLVED {\"chunk\": 1}'",
        preflight.SERVER_CAPTURES,
        "the server flags",
        "cannot be read: RESOLVED",
    ),
    (
        "echo 'Killed' >&2; exit 137",
        preflight.SERVER_FLAGS,
        "the server flags",
        "did not finish: exit 137: Killed",
    ),
]


@pytest.mark.parametrize(("answer", "code", "setting", "said"), FAILED_RUNS)
def test_a_resolution_that_cannot_run_or_be_read_is_a_clear_error(
    tmp_path: Path, answer: str, code: int, setting: str, said: str
) -> None:
    """A runner that answers nothing, dies, or settles what the kit cannot read refuses the start with a problem that
    says so, not a traceback or a pass: the expectation cannot be checked."""
    python = fake_python(tmp_path, answer)
    expected = resolution.Captures(8192, (4, 8192), (1, 512))
    (problem,) = preflight.check_flags(
        ["--model-path", "/m"], str(python), environ={"PATH": os.environ["PATH"]}, expected=expected
    )
    assert (problem.code, problem.setting.startswith(setting)) == (code, True), problem
    assert said in problem.message, problem.message


def test_a_python_that_is_not_there_is_a_clear_error(tmp_path: Path) -> None:
    (problem,) = preflight.check_flags(
        ["--model-path", "/m"], str(tmp_path / "absent" / "python3"), environ={}
    )
    assert problem.code == preflight.SERVER_FLAGS, problem
    assert "resolving the server flags did not finish: [Errno 2] No such file or directory" in problem.message


def test_the_server_python_is_python3_on_the_servers_path(tmp_path: Path) -> None:
    """In the image, /opt/venv/bin/python3 (the Dockerfile's PATH): the server's interpreter, sglang's environment."""
    python = fake_python(tmp_path, "exit 0")
    assert preflight.server_python({"PATH": f"{tmp_path}:/usr/bin"}) == str(python)
    assert preflight.server_python({"PATH": str(tmp_path / "none")}) == sys.executable


# the sglang modules entrypoint/resolve_flags.py imports
RUNNER_IMPORTS = (
    "sglang.srt.configs.model_config",
    "sglang.srt.layers.moe.utils",
    "sglang.srt.mem_cache.kv_cache_configurator",
    "sglang.srt.model_executor.runner.base_cuda_graph_runner",
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
)


def test_a_bare_assertion_of_the_resolution_is_worded(tmp_path: Path) -> None:
    """resolve_once asserts without a message in places (0.5.23 server_args.py: `--attn-dp-size 3` with tp 8):
    preflight's reason then says so rather than ending at `AssertionError: `. sglang stood in for by its two calls
    (prepare_server_args, then resolve_once on what it returns), as entrypoint/resolve_flags.py makes them, and a
    torch with a device (the box's, so nothing is stated for it)."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "class cuda:\n    is_available = staticmethod(lambda: True)\n"
    )
    for module in RUNNER_IMPORTS:  # the other names it imports: stand-ins it does not reach
        path = fake.joinpath(*module.split("."))
        for package in reversed([*path.relative_to(fake).parents][:-1]):
            (fake / package).mkdir(exist_ok=True)
            (fake / package / "__init__.py").touch()
        path.with_suffix(".py").write_text("def __getattr__(name):\n    return None\n")
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
