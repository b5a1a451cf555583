"""The patch pipeline: FlashInfer's patch against the real flashinfer-python and the real torch Dynamo; SGLang's
against copies of the real sglang files it changes (its effect on the real server: tests/test_real_server.py)."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, copy_flashinfer, copy_sglang, run_apply, run_scenarios, tree_env
from patches.apply import RECORD_NAME, read_series

pytestmark = pytest.mark.boots  # boots processes or runs real tools: not in ci/test --fast

PATCHES = ROOT / "patches"
MALFORMED = ("abc", "12", "v12.8", "12.8a", "12.8.1.4", "1 2.8")
SERIES = read_series(PATCHES / "series")
FLASHINFER_PATCHES = [p.name for p in SERIES if p.package == "flashinfer"]
SGLANG_PATCHES = [p.name for p in SERIES if p.package == "sglang"]
SGLANG_FILES = sorted({f for p in SERIES if p.package == "sglang" for f in p.files})
MANAGER = "sglang/srt/managers/tokenizer_manager.py"
# glm5.toml [image]'s pin of each distribution a patch names in its Pinned-Version.
IMAGE = tomllib.loads((ROOT / "entrypoint" / "glm5.toml").read_text())["image"]
PINS = {"flashinfer-python": IMAGE["flashinfer"], "sglang": IMAGE["sglang"]}


# The tests that read `patched` share one worker: the scenarios import FlashInfer and compile with Dynamo (about
# 8 CPU-seconds), once per worker that asks (four of six did, one test each).
PATCHED = pytest.mark.xdist_group("patched_flashinfer")


@pytest.fixture(scope="module")
def patched(patched_tree: Path, fake_nvcc: Path) -> dict[str, Any]:
    return run_scenarios(
        patched_tree,
        "compile",
        "follow",
        "malformed",
        "parse",
        FLASHINFER_CUDA_VERSION="13.0",
        CUDA_HOME=str(fake_nvcc),
    )


def test_unpatched_flashinfer_reproduces_the_dynamo_failure(unpatched_tree: Path) -> None:
    # If this ever passes compilation, upstream changed: the patch may no longer be needed.
    probe = run_scenarios(unpatched_tree, "compile", FLASHINFER_CUDA_VERSION="13.0")["compile"]
    assert probe["error"] is not None, "unpatched flashinfer compiled cleanly: re-check the patch's reason"
    assert "Unsupported" in probe["error"]
    assert "marked as skipped" in probe["error"]


@PATCHED
def test_patched_flashinfer_compiles_fullgraph_without_spawns(patched: dict[str, Any]) -> None:
    probe = patched["compile"]
    assert probe["error"] is None
    assert probe["spawns"] == []
    assert probe["graph_breaks"] == 0
    assert probe["value"] == 12.0  # (1*2+1) * 4: the >= 12.8 branch was taken


@PATCHED
def test_compiled_graph_follows_the_variable(patched: dict[str, Any]) -> None:
    follow = patched["follow"]
    assert follow["results"] == {
        "13.0": 2.0,
        "12.4": 3.0,
        "12.8.1": 2.0,
        "13.0#2": 2.0,
        "unrelated-change": 2.0,
    }
    assert follow["spawns"] == 0


@PATCHED
@pytest.mark.parametrize("raw", MALFORMED)
def test_malformed_override_is_refused_clearly(patched: dict[str, Any], raw: str) -> None:
    entry = patched["malformed"][raw]
    assert "eager" not in entry and "compiled" not in entry, f"{raw!r} was read as a version: {entry}"
    for key in ("eager_error", "compiled_error"):
        assert "FLASHINFER_CUDA_VERSION" in entry[key]
        assert "MAJOR.MINOR[.PATCH]" in entry[key]
    assert "ValueError" in entry["compiled_error"]


@PATCHED
def test_override_parsing_keeps_major_minor(patched: dict[str, Any]) -> None:
    assert patched["parse"] == {
        " 12.8 ": "12.8",
        "13.0.1": "13.0",
        "12.9": "12.9",
        "13.0": "13.0",
        "<empty: detected>": "12.9",
    }


def test_unset_override_detects_once_outside_the_graph(patched_tree: Path, fake_nvcc: Path) -> None:
    unset = run_scenarios(patched_tree, "unset", FLASHINFER_CUDA_VERSION=None, CUDA_HOME=str(fake_nvcc))[
        "unset"
    ]
    assert unset["probe"]["error"] is None and unset["probe"]["graph_breaks"] == 0
    assert unset["version"] == "12.9"
    assert unset["spawns_first"] == 1  # nvcc --version, once per process
    assert unset["spawns_after"] == 0


def test_apply_is_idempotent_and_records(tmp_path: Path) -> None:
    tree = copy_flashinfer(tmp_path / "site")
    first = run_apply("--target", str(tree), "--package", "flashinfer")
    assert first.returncode == 0, first.stderr
    assert "cuda-version-from-environment.patch: applied" in first.stdout
    patched = (tree / "flashinfer/jit/cpp_ext.py").read_text()
    second = run_apply("--target", str(tree), "--package", "flashinfer")
    assert second.returncode == 0, second.stderr
    assert "already applied" in second.stdout
    assert (tree / "flashinfer/jit/cpp_ext.py").read_text() == patched
    record = json.loads((tree / "flashinfer/GLM5_SERVE_PATCHES.json").read_text())
    assert [p["name"] for p in record["patches"]] == FLASHINFER_PATCHES
    assert record["flashinfer_python"] == "0.7.2"


def test_apply_defaults_to_the_imported_flashinfer(tmp_path: Path) -> None:
    tree = copy_flashinfer(tmp_path / "site")
    done = subprocess.run(
        [str(PATCHES / "apply"), "--dry-run", "--package", "flashinfer"],
        capture_output=True,
        text=True,
        env=tree_env(tree),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"target {tree}" in done.stdout
    assert "would apply" in done.stdout
    assert not (tree / "flashinfer/GLM5_SERVE_PATCHES.json").exists()


def test_apply_refuses_a_drifted_tree(tmp_path: Path) -> None:
    tree = copy_flashinfer(tmp_path / "site")
    target = tree / "flashinfer/jit/cpp_ext.py"
    text = target.read_text()
    assert "@functools.cache\ndef get_cuda_version()" in text
    target.write_text(
        text.replace(
            "@functools.cache\ndef get_cuda_version()", "@functools.lru_cache(None)\ndef get_cuda_version()"
        )
    )
    meta = next(tree.glob("flashinfer_python-*.dist-info")) / "METADATA"
    meta.write_text(re.sub(r"^Version: .*$", "Version: 0.7.9", meta.read_text(), count=1, flags=re.M))
    done = run_apply("--target", str(tree), "--package", "flashinfer")
    assert done.returncode == 1
    assert "flashinfer/jit/cpp_ext.py" in done.stderr
    assert "pinned to flashinfer-python 0.7.2" in done.stderr
    assert "found flashinfer-python 0.7.9" in done.stderr
    assert "FAILED" in done.stderr  # patch's own hunk report is passed on
    assert "GLM5_SERVE_PATCHES" not in " ".join(p.name for p in (tree / "flashinfer").iterdir())


def test_apply_names_a_wrong_target(tmp_path: Path) -> None:
    done = run_apply("--target", str(tmp_path))
    assert done.returncode == 1
    assert "--target" in done.stderr and "no flashinfer/ package" in done.stderr


# --- SGLang's patch, on copies of the real sglang files it changes (patches/apply and patches/verify import none) ---


def test_sglang_apply_is_idempotent_and_records(tmp_path: Path) -> None:
    tree = copy_sglang(tmp_path / "site")
    first = run_apply("--target", str(tree), "--package", "sglang")
    assert first.returncode == 0, first.stderr
    assert [f"{name}: applied" in first.stdout for name in SGLANG_PATCHES] == [True] * len(SGLANG_PATCHES)
    patched = {f: (tree / f).read_text() for f in SGLANG_FILES}
    second = run_apply("--target", str(tree), "--package", "sglang")
    assert second.returncode == 0, second.stderr
    assert "already applied" in second.stdout and "flashinfer" not in second.stdout
    assert {f: (tree / f).read_text() for f in SGLANG_FILES} == patched
    record = json.loads((tree / "sglang" / RECORD_NAME).read_text())
    assert record["sglang"] == IMAGE["sglang"]
    assert [p["name"] for p in record["patches"]] == SGLANG_PATCHES
    assert sorted(f for p in record["patches"] for f in p["files"]) == SGLANG_FILES


def test_sglang_verify_fails_unpatched_passes_patched_and_catches_a_change(tmp_path: Path) -> None:
    """Unpatched: each SGLang check fails, naming patches/apply. Patched: all pass. A patched file edited afterwards
    (the bound loosened by one): the record's hashes and the behaviour check each catch it."""
    tree = copy_sglang(tmp_path / "site")
    checks = ("sglang-patched", "sglang-top-logprobs", "sglang-server-info")
    unpatched = run_verify(tree, "--package", "sglang", "--skip-compile")
    assert [unpatched[c]["ok"] for c in checks] == [False, False, False], unpatched
    assert all("run patches/apply" in unpatched[c]["detail"] for c in checks)
    assert run_apply("--target", str(tree), "--package", "sglang").returncode == 0
    patched = run_verify(tree, "--package", "sglang", "--skip-compile")
    assert patched["ok"] and set(patched) == {"ok", *checks}, patched
    assert "<redacted>" in patched["sglang-server-info"]["detail"]
    manager = tree / MANAGER
    text = manager.read_text()
    assert text.count("<= top_logprobs_num <= vocab_size:") == 1
    manager.write_text(
        text.replace("<= top_logprobs_num <= vocab_size:", "<= top_logprobs_num <= vocab_size + 1:")
    )
    loosened = run_verify(tree, "--package", "sglang", "--skip-compile")
    assert not loosened["ok"] and loosened["sglang-server-info"]["ok"]
    assert "differs from what" in loosened["sglang-patched"]["detail"]
    assert "accepts 1001" in loosened["sglang-top-logprobs"]["detail"]


def test_apply_refuses_a_drifted_sglang(tmp_path: Path) -> None:
    tree = copy_sglang(tmp_path / "site")
    target = tree / MANAGER
    line = "        sampling_params.verify(self.model_config.vocab_size)\n"
    assert target.read_text().count(line) == 1
    target.write_text(target.read_text().replace(line, line.replace("(self.", "(vocab_size=self.")))
    done = run_apply("--target", str(tree), "--package", "sglang")
    assert done.returncode == 1
    assert MANAGER in done.stderr and "FAILED" in done.stderr
    assert f"pinned to sglang {IMAGE['sglang']}, found sglang {IMAGE['sglang']}" in done.stderr
    assert not (tree / "sglang" / RECORD_NAME).exists()


def test_apply_names_a_package_of_the_series_missing_from_the_target(tmp_path: Path) -> None:
    """Every package the series names is patched: one the target lacks is an error naming it and the fix, and
    nothing is applied to the others; an unknown --package is a usage error."""
    tree = copy_sglang(tmp_path / "site")
    before = {f: (tree / f).read_text() for f in SGLANG_FILES}
    done = run_apply("--target", str(tree))
    assert done.returncode == 1
    assert "no flashinfer/ package there" in done.stderr and "--package NAME" in done.stderr
    assert {f: (tree / f).read_text() for f in SGLANG_FILES} == before
    assert not (tree / "sglang" / RECORD_NAME).exists()
    unknown = run_apply("--target", str(tree), "--package", "vllm")
    assert unknown.returncode == 2 and "--package vllm" in unknown.stderr


def series_names() -> list[str]:
    lines = (PATCHES / "series").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


@pytest.mark.parametrize("name", series_names())
def test_patch_has_dep3_header(name: str) -> None:
    header = (PATCHES / name).read_text().split("\n--- a/")[0]
    for field in (
        "Description:",
        "Origin:",
        "Bug:",
        "Forwarded:",
        "Last-Update:",
        "Pinned-Version:",
        "Remove-When:",
    ):
        assert re.search(rf"^{field}", header, re.M), f"{name} lacks {field}"
    pinned = re.search(r"^Pinned-Version:\s*(\S+)\s+(\S+)\s*$", header, re.M)
    assert pinned, f"{name}: Pinned-Version is not 'DISTRIBUTION VERSION'"
    assert PINS.get(pinned[1]) == pinned[2], (
        f"{name} is pinned to {pinned[1]} {pinned[2]}; glm5.toml pins {PINS}"
    )


def test_every_patch_file_is_in_the_series() -> None:
    assert sorted(p.name for p in PATCHES.glob("*.patch")) == sorted(series_names())


def run_verify(tree: Path, *args: str, **env: str | None) -> dict[str, Any]:
    done = subprocess.run(
        [str(PATCHES / "verify"), "--json", *args],
        capture_output=True,
        text=True,
        env=tree_env(tree, **env),
        check=False,
        timeout=300,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    assert (done.returncode == 0) == result["ok"]
    return {c["check"]: c for c in result["checks"]} | {"ok": result["ok"]}


def test_verify_passes_on_the_patched_tree(patched_tree: Path, fake_nvcc: Path) -> None:
    checks = run_verify(
        patched_tree,
        "--package",
        "flashinfer",
        "--nvcc",
        str(fake_nvcc / "bin/nvcc"),
        FLASHINFER_CUDA_VERSION="12.9",
    )
    assert checks["ok"], checks
    assert set(checks) == {
        "ok",
        "patched-module",
        "override-set",
        "override-matches-toolkit",
        "fullgraph-compile",
    }


# patches.verify.main once for each value of FLASHINFER_CUDA_VERSION (null: unset), in one process: FlashInfer and
# torch are imported once, not once a value (about 8 CPU-seconds each); verify reads the variable on each call.
EACH_OVERRIDE = """
import contextlib, io, json, os, sys
from patches import verify
results = []
for value in json.loads(sys.argv[1]):
    if value is None:
        os.environ.pop(verify.ENV, None)
    else:
        os.environ[verify.ENV] = value
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = verify.main(["--json", *sys.argv[2:]])
    results.append({"code": code, **json.loads(out.getvalue())})
print(json.dumps(results))
"""


def run_verify_each(tree: Path, values: list[str | None], *args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-c", EACH_OVERRIDE, json.dumps(values), *args],
        capture_output=True, text=True, env=tree_env(tree), check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = []
    for result in json.loads(done.stdout):
        assert (result["code"] == 0) == result["ok"]
        out.append({c["check"]: c for c in result["checks"]} | {"ok": result["ok"]})
    return out


def test_verify_catches_mismatch_malformed_and_unpatched(
    patched_tree: Path, unpatched_tree: Path, fake_nvcc: Path
) -> None:
    nvcc = str(fake_nvcc / "bin/nvcc")
    mismatch, malformed, unset = run_verify_each(
        patched_tree, ["13.0", "12", None], "--package", "flashinfer", "--nvcc", nvcc, "--skip-compile"
    )
    assert not mismatch["ok"]
    assert "FLASHINFER_CUDA_VERSION=12.9" in mismatch["override-matches-toolkit"]["detail"]
    assert not malformed["ok"] and not malformed["override-set"]["ok"]
    assert "12" in malformed["override-set"]["detail"]
    assert not unset["ok"] and "is not set" in unset["override-set"]["detail"]
    unpatched = run_verify(
        unpatched_tree, "--package", "flashinfer", "--nvcc", nvcc, FLASHINFER_CUDA_VERSION="12.9"
    )
    assert not unpatched["patched-module"]["ok"]
    assert "run patches/apply" in unpatched["patched-module"]["detail"]
    assert "Unsupported" in unpatched["fullgraph-compile"]["detail"]


def test_verify_catches_a_file_changed_after_apply(tmp_path: Path, fake_nvcc: Path) -> None:
    tree = copy_flashinfer(tmp_path / "site")
    assert run_apply("--target", str(tree), "--package", "flashinfer").returncode == 0
    module = tree / "flashinfer/jit/cpp_ext.py"
    module.write_text(module.read_text() + "\n# reinstalled\n")
    checks = run_verify(
        tree,
        "--package",
        "flashinfer",
        "--nvcc",
        str(fake_nvcc / "bin/nvcc"),
        "--skip-compile",
        FLASHINFER_CUDA_VERSION="12.9",
    )
    assert not checks["patched-module"]["ok"]
    assert "differs from what" in checks["patched-module"]["detail"]


def test_every_test_that_reads_the_patched_scenarios_is_in_their_group() -> None:
    """A test reading `patched` outside the group runs the scenarios again on its own worker."""
    readers = {
        name: {m.args for m in getattr(fn, "pytestmark", []) if m.name == "xdist_group"}
        for name, fn in globals().items()
        if name.startswith("test_") and "patched" in inspect.signature(fn).parameters
    }
    assert len(readers) == 4 and all(g == {("patched_flashinfer",)} for g in readers.values()), readers
