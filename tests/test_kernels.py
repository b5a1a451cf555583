"""kernels/: the SM120 module list against the pinned SGLang and FlashInfer sources, kernels/build's checks, and one
real compile (the list's CI part, with nvcc 13.0 from ci/cuda-toolkit) that the sealed runtime then loads.

The compile's tests (marked `compile`) read what the image build compiled when ci/build-image runs them
(KERNELS_FROM_IMAGE: the image's prebuilt folder, its /tmp and its build log), so CI compiles the module once;
`ci/test -m compile` compiles it here instead. ci/test leaves them out."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.report import USAGE, Problem
from conftest import ROOT, copy_flashinfer, run_apply
from kernels import build, verify
from kernels.modules import RECORD_NAME, SETTING, load

KERNELS = load()
CUDA = ROOT / ".cuda-13.0"  # ci/setup-test-env lays it out with ci/cuda-toolkit
SITE = Path(importlib.util.find_spec("flashinfer").origin).resolve().parents[1]  # type: ignore[arg-type, union-attr]


@pytest.mark.parametrize("module", KERNELS.modules, ids=lambda m: m.name)
def test_every_cited_line_says_what_the_list_says(module: Any) -> None:
    """The call chain of each module, line by line, in the pinned packages: the SGLang call site first."""
    assert module.cite[0].file.startswith("sglang/"), "the first citation is SGLang's call site"
    assert any(c.file.startswith("flashinfer/") for c in module.cite), "FlashInfer's own dispatch is cited"
    for cite in module.cite:
        lines = (SITE / cite.file).read_text().splitlines()
        assert cite.text in lines[cite.line - 1], (
            f"{cite.file}:{cite.line} is now: {lines[cite.line - 1].strip()}"
        )


@pytest.mark.parametrize(
    "note", KERNELS.not_requested + KERNELS.first_start, ids=lambda n: n.name.split(":")[0]
)
def test_what_the_list_leaves_out_is_cited_too(note: Any) -> None:
    for cite in note.cite:
        lines = (SITE / cite.file).read_text().splitlines()
        assert cite.text in lines[cite.line - 1], (
            f"{cite.file}:{cite.line} is now: {lines[cite.line - 1].strip()}"
        )
    assert note.name not in KERNELS.names


def test_the_citation_check_can_fail(tmp_path: Path) -> None:
    text = (ROOT / "kernels" / "sm120.toml").read_text().replace("line = 2030,", "line = 2031,")
    (tmp_path / "sm120.toml").write_text(text)
    moved = next(c for n in load(tmp_path / "sm120.toml").not_requested for c in n.cite if c.line == 2031)
    assert moved.text not in (SITE / moved.file).read_text().splitlines()[moved.line - 1]


def test_glm5_routing_misses_flashinfers_fused_routing() -> None:
    """SGLang takes FlashInfer's fused DeepSeek routing only when topk_group * n_group >= the routed top-k
    (sglang/srt/layers/moe/topk.py:2030): GLM-5's routing config fails that, so the module is not prebuilt."""
    config = json.loads((ROOT / "tests" / "fixtures" / "glm5-config" / "config.json").read_text())
    assert config["topk_group"] * config["n_group"] < config["num_experts_per_tok"]
    assert "dsv3_fused_routing" in [n.name for n in KERNELS.not_requested]


GENERATE = """
import json, sys
from kernels.modules import load
out = {}
for m in load().modules:
    spec = m.spec()
    spec.write_ninja()
    out[m.name] = {"name": spec.name, "sources": len(spec.sources), "ninja": spec.ninja_path.read_text()}
print(json.dumps(out))
"""


@pytest.mark.boots
def test_the_generators_make_the_listed_specs_for_sm120f_only(tmp_path: Path) -> None:
    """Each generator, run as kernels/build runs it, names the module the list names, with its source count, and
    its ninja file targets sm_120f and nothing else (a wrong architecture would be prebuilt and never used)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FLASHINFER_CUDA_ARCH_LIST": KERNELS.arch_list,
        "FLASHINFER_CUDA_VERSION": "13.0",
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", GENERATE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    specs = json.loads(done.stdout)
    for module in KERNELS.modules:
        spec = specs[module.name]
        assert (spec["name"], spec["sources"]) == (module.name, module.sources)
        archs = set(re.findall(r"-gencode=arch=compute_(\w+),code=sm_(\w+)", spec["ninja"]))
        assert archs == {("120f", "120f")}, f"{module.name} targets {archs}"


def test_every_module_states_its_measured_figures() -> None:
    for module in KERNELS.modules:
        assert {"job_memory_mib", "so_mib", "measured"} <= module.figures.keys(), module.name
        assert {"build_seconds", "build_seconds_32"} & module.figures.keys(), module.name
        assert module.figures["job_memory_mib"] > 0


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("all", list(KERNELS.names)),
        ("", list(KERNELS.names)),
        ("none", []),
        ("ci", list(KERNELS.ci)),
        ("sampling, fp4_quantization_120f", ["fp4_quantization_120f", "sampling"]),
        ("sampling,sampling", ["sampling"]),
    ],
)
def test_the_selection(value: str, names: list[str]) -> None:
    assert [m.name for m in KERNELS.select(value)] == names


def test_an_unknown_module_is_refused_naming_the_setting_and_the_choices() -> None:
    done = subprocess.run(
        [str(ROOT / "kernels" / "build"), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, SETTING: "fp4_quantization_120f,fused_moe_12"},
        timeout=60,
    )
    assert done.returncode == USAGE
    assert f"{SETTING}: unknown module(s) fused_moe_12" in done.stderr
    assert ", ".join(KERNELS.names) in done.stderr


def devel_tree(tmp_path: Path) -> Path:
    """A CUDA_HOME with the devel image's layout, its nvcc the real one (13.0)."""
    home = tmp_path / "cuda"
    for part in ("bin", "include", "lib64/stubs"):
        (home / part).mkdir(parents=True)
    (home / "bin" / "nvcc").symlink_to(CUDA / "bin" / "nvcc")
    for header in build.HEADERS:
        (home / "include" / header).write_text("")
    (home / build.LINK_STUB).write_text("")
    return home


@pytest.mark.full  # .cuda-13.0's nvcc
def test_a_complete_toolkit_passes(tmp_path: Path) -> None:
    assert build.toolchain_problems(devel_tree(tmp_path), "13.0") == []


@pytest.mark.full  # .cuda-13.0's nvcc
@pytest.mark.parametrize(
    ("breakage", "setting", "words"),
    [
        ("nvcc", "CUDA_HOME", "no nvcc at"),
        ("cublasLt.h", "CUDA_HOME", "no cublasLt.h in"),
        ("stub", "CUDA_HOME", "no libcuda link stub"),
        ("release", "FLASHINFER_CUDA_VERSION", "the image says CUDA 12.9 but"),
    ],
)
def test_a_broken_toolkit_is_named_before_compiling(
    tmp_path: Path, breakage: str, setting: str, words: str
) -> None:
    home = devel_tree(tmp_path)
    want = "12.9" if breakage == "release" else "13.0"
    if breakage == "nvcc":
        (home / "bin" / "nvcc").unlink()
    elif breakage == "stub":
        (home / build.LINK_STUB).unlink()
    elif breakage != "release":
        (home / "include" / breakage).unlink()
    problems = build.toolchain_problems(home, want)
    assert [(p.setting, words in p.message) for p in problems] == [(setting, True)]
    assert problems[0].fix


@pytest.mark.full  # .cuda-13.0's nvcc
def test_tools_missing_from_path_are_named(tmp_path: Path) -> None:
    problems = build.toolchain_problems(devel_tree(tmp_path), "13.0", which=lambda _: None)
    assert [p.message for p in problems] == ["no ninja on PATH", f"no {os.environ.get('CXX', 'c++')} on PATH"]


@pytest.mark.boots
def test_a_link_library_the_toolkit_lacks_is_named_before_compiling(tmp_path: Path) -> None:
    """The fused MoE links -lnvrtc: a toolkit without it would fail only at the final link, after hours."""
    moe = next(m for m in KERNELS.modules if m.name == "fused_moe_120")
    env = {
        **os.environ,
        "FLASHINFER_CUDA_ARCH_LIST": KERNELS.arch_list,
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path),
    }
    code = (  # one process for both homes: each import of FlashInfer and its MoE spec takes seconds
        "import sys, json; from pathlib import Path; from kernels import build; from kernels.modules import load;"
        "m = [m for m in load().modules if m.name == 'fused_moe_120'];"
        "print(json.dumps([[str(p) for p in build.link_problems(m, Path(h))] for h in sys.argv[1:]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), str(CUDA)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lacking, whole = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(lacking) == 1 and "libnvrtc.so" in lacking[0], (moe.name, lacking)
    assert whole == [], (moe.name, whole)


@pytest.mark.parametrize(
    ("requested", "cores", "available", "need", "jobs", "problem"),
    [
        ("", 32, 64_000, 4_000, 16, None),  # memory bounds it
        ("", 4, 64_000, 4_000, 4, None),  # cores bound it
        ("8", 2, 64_000, 4_000, 8, None),  # asked for: more jobs than cores is allowed
        ("20", 32, 64_000, 4_000, 20, "set MAX_JOBS=16 or less"),
        ("", 8, 3_000, 4_000, 0, "one compile job needs 4000 MiB"),
        ("two", 8, 64_000, 4_000, 0, "not a positive whole number"),
        ("0", 8, 64_000, 4_000, 0, "not a positive whole number"),
    ],
)
def test_the_jobs_follow_cores_and_memory(
    requested: str, cores: int, available: int, need: int, jobs: int, problem: str | None
) -> None:
    got, problems = build.plan_jobs(requested, cores, available, need)
    assert got == jobs
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].setting == "MAX_JOBS"
        assert problem in str(problems[0])
        assert problems[0].code == (USAGE if "whole number" in problem else Problem("", "").code)


def test_a_soname_less_libcuda_stub_is_caught(tmp_path: Path) -> None:
    """A module linked against a stub without the soname asks the loader for 'libcuda.so', which the driver does
    not install: real cc, ld and readelf, on a library linked both ways."""
    for soname, want in (("-Wl,-soname,libcuda.so.1", "libcuda.so.1"), ("", "libcuda.so")):
        stub_dir = tmp_path / f"stub{bool(soname)}"
        stub_dir.mkdir()
        subprocess.run(
            [
                "cc",
                "-shared",
                "-nostdlib",
                *([soname] if soname else []),
                "-o",
                str(stub_dir / "libcuda.so"),
                "-x",
                "c",
                "/dev/null",
            ],
            check=True,
        )
        module = stub_dir / "module.so"
        subprocess.run(
            [
                "cc",
                "-shared",
                "-Wl,--no-as-needed",
                "-o",
                str(module),
                "-x",
                "c",
                "/dev/null",
                f"-L{stub_dir}",
                "-lcuda",
            ],
            check=True,
        )
        needed = verify.needed_libraries(module)
        assert needed is not None and want in needed
    assert verify.driver_link_problem(["libcudart.so.13", "libcuda.so"]) is not None
    assert verify.driver_link_problem(["libcudart.so.13", "libcuda.so.1"]) is None


@pytest.mark.full  # .cuda-13.0's nvcc
def test_the_ci_toolkit_is_the_devel_layout_kernels_build_accepts() -> None:
    assert (CUDA / "bin" / "nvcc").exists(), (
        "run ci/setup-test-env tests (it lays out .cuda-13.0 with ci/cuda-toolkit)"
    )
    assert build.toolchain_problems(CUDA, "13.0") == []
    out = subprocess.run(
        ["readelf", "-d", str(CUDA / build.LINK_STUB)], capture_output=True, text=True
    ).stdout
    assert "Library soname: [libcuda.so.1]" in out


# One real compile: the list's CI part, with nvcc 13.0, into a patched copy of the pinned FlashInfer.


FROM_IMAGE = os.environ.get("KERNELS_FROM_IMAGE", "")  # set by ci/build-image: what its kernels step made


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    site = copy_flashinfer(tmp_path_factory.mktemp("kernels") / "site")
    # as the image: the kernels step follows the patches
    assert run_apply("--target", str(site), "--package", "flashinfer").returncode == 0
    scratch = tmp_path_factory.mktemp("scratch")
    home = tmp_path_factory.mktemp("home")
    env = {
        **os.environ,
        "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
        "PATH": f"{CUDA / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "CUDA_HOME": str(CUDA),
        "FLASHINFER_CUDA_VERSION": "13.0",
        # libcudart.so.13, which torch's CUDA build would bring in the image
        "LD_LIBRARY_PATH": str(CUDA / "lib"),
        "TMPDIR": str(scratch),
        "HOME": str(home),
        SETTING: "ci",
    }
    if FROM_IMAGE:  # the image's build: its prebuilt folder, what its kernels step left in /tmp and ~/.cache
        image = Path(FROM_IMAGE)
        shutil.copytree(image / "aot", site / "flashinfer" / "data" / "aot", dirs_exist_ok=True)
        stderr = (image / "build.log").read_text(errors="replace")
        return {"site": site, "env": env, "stderr": stderr, "scratch": image / "tmp", "home": image / "home"}
    done = subprocess.run(
        [str(ROOT / "kernels" / "build")], capture_output=True, text=True, env=env, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {"site": site, "env": env, "stderr": done.stderr, "scratch": scratch, "home": home}


def run_verify(built: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "kernels" / "verify"), *args],
        capture_output=True,
        text=True,
        env=built["env"],
        timeout=300,
    )


@pytest.mark.compile
@pytest.mark.compile
def test_the_build_installs_into_flashinfers_prebuilt_folder_and_records_it(built: dict[str, Any]) -> None:
    aot = built["site"] / "flashinfer" / "data" / "aot"
    record = json.loads((aot / RECORD_NAME).read_text())
    assert [b["name"] for b in record["built"]] == list(KERNELS.ci)
    for entry in record["built"]:
        path = aot / entry["name"] / f"{entry['name']}.so"
        assert entry["sha256"] == build.sha256(path) and entry["bytes"] == path.stat().st_size
        assert entry["job_memory_mib"] > 100 and entry["seconds"] > 0
    assert record["nvcc_release"] == "13.0" and record["arch_list"] == KERNELS.arch_list
    assert sorted(record["not_built"]) == sorted(set(KERNELS.names) - set(KERNELS.ci))
    # the scratch workspace is gone (the image's /tmp also holds what its other build steps and checks wrote),
    # and the run-time JIT cache was never written
    left = built["scratch"].glob("glm5-kernels-*") if FROM_IMAGE else built["scratch"].iterdir()
    assert list(left) == []
    assert not (built["home"] / ".cache" / "flashinfer").exists()
    assert re.search(r"fp4_quantization_120f \[\d+/\d+ [\d.]+s\] ", built["stderr"]), "progress per compile"


@pytest.mark.compile
def test_the_sealed_runtime_loads_what_was_built_and_would_compile_only_the_rest(
    built: dict[str, Any],
) -> None:
    done = run_verify(built, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["problems"] == []
    prebuilt = {m["name"]: m for m in result["modules"] if m["prebuilt"]}
    assert list(prebuilt) == list(KERNELS.ci)
    for entry in prebuilt.values():
        assert entry["load"].startswith("loaded by JitSpec.build_and_load() with JIT disabled"), entry
        assert "libcuda.so" not in (entry["needed"] or [])
    for entry in result["modules"]:
        if not entry["prebuilt"]:
            assert "MissingJITCacheError" in entry["first_start"]
    assert f"prebuilt {len(KERNELS.ci)}/{len(KERNELS.modules)} ({SETTING}=ci)" in done.stderr
    assert run_verify(built, "--require-all").returncode == 1


@pytest.mark.compile
@pytest.mark.compile
def test_verify_seals_off_nvcc_even_when_the_image_has_it_on_path(built: dict[str, Any]) -> None:
    sealed = verify.sealed_env(built["env"], KERNELS.arch_list, "/nonexistent")
    assert shutil.which("nvcc", path=sealed["PATH"]) is None
    assert shutil.which("nvcc", path=built["env"]["PATH"]) is not None
    assert "CUDA_HOME" not in sealed and sealed["FLASHINFER_DISABLE_JIT"] == "1"


@pytest.mark.compile
@pytest.mark.parametrize("breakage", ["changed", "stray", "no_record"])
def test_verify_fails_on_a_changed_module_a_stray_one_or_no_record(
    built: dict[str, Any], breakage: str
) -> None:
    aot = built["site"] / "flashinfer" / "data" / "aot"
    name = KERNELS.ci[0]
    module = aot / name / f"{name}.so"
    saved = {p: p.read_bytes() for p in (module, aot / RECORD_NAME)}
    stray = aot / "sampling" / "sampling.so"
    try:
        if breakage == "changed":
            module.write_bytes(saved[module] + b"\0")
            words = "differs from what kernels/build recorded"
        elif breakage == "stray":
            stray.parent.mkdir()
            shutil.copyfile(module, stray)
            words = "sampling: prebuilt at"
        else:
            (aot / RECORD_NAME).unlink()
            words = "kernels/build did not run"
        done = run_verify(built)
        assert done.returncode == 1 and words in done.stderr, done.stderr[-2000:]
        # no summary claims what was not checked
        assert f"prebuilt {len(KERNELS.modules)}/" not in done.stderr
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
        shutil.rmtree(stray.parent, ignore_errors=True)
    assert run_verify(built).returncode == 0


@pytest.mark.compile
@pytest.mark.compile
def test_the_doctor_reads_the_real_record(built: dict[str, Any], tmp_path: Path) -> None:
    """What the image's kernels step writes is what the doctor's kernels check reads (the Dockerfile copies it)."""
    from entrypoint import doctor

    target = tmp_path / "opt" / "glm5" / "KERNELS-PREBUILT.json"
    target.parent.mkdir(parents=True)
    shutil.copyfile(built["site"] / "flashinfer" / "data" / "aot" / RECORD_NAME, target)
    found = doctor.check_kernels(doctor.Box(environ={}, root=tmp_path), {"home": "/opt/glm5"})
    later = [n for n in KERNELS.names if n not in KERNELS.ci]
    assert found.status == "warn" and f"{len(later)} FlashInfer module(s) not prebuilt" in found.detail
    assert "(built with GLM5_KERNELS=ci)" in found.detail and all(n in found.detail for n in later)


def test_the_dockerfile_builds_them_after_the_patches_and_before_the_kit_changes() -> None:
    """The kernels step depends on the Python stack and the patches only: an edit to the kit's own files keeps the
    cached layer (hours of compiling on a small builder). Compose passes the build arguments; CI takes its part."""
    text = (ROOT / "Dockerfile").read_text()
    steps = (
        "patches/verify",
        "ARG GLM5_KERNELS=all",
        "ARG MAX_JOBS=",
        "kernels/build",
        "kernels/verify",
        "COPY entrypoint/",
    )
    positions = [text.index(step) for step in steps]
    assert positions == sorted(positions)
    assert "/opt/glm5/KERNELS-PREBUILT.json" in text  # what the doctor's kernels check reads
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["glm5"]["build"]["args"] == {
        "GLM5_KERNELS": "${GLM5_KERNELS:-all}",
        "MAX_JOBS": "${MAX_JOBS:-}",
    }
    assert "kernels=${GLM5_KERNELS:-ci}" in (ROOT / "ci" / "build-image").read_text()
