"""The FlashInfer patch pipeline against the real flashinfer-python and the real torch Dynamo."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, copy_flashinfer, run_apply, run_scenarios, tree_env

pytestmark = pytest.mark.boots  # boots processes or runs real tools: not in ci/test --fast

PATCHES = ROOT / "patches"
MALFORMED = ("abc", "12", "v12.8", "12.8a", "12.8.1.4", "1 2.8")


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
    first = run_apply("--target", str(tree))
    assert first.returncode == 0, first.stderr
    assert "cuda-version-from-environment.patch: applied" in first.stdout
    patched = (tree / "flashinfer/jit/cpp_ext.py").read_text()
    second = run_apply("--target", str(tree))
    assert second.returncode == 0, second.stderr
    assert "already applied" in second.stdout
    assert (tree / "flashinfer/jit/cpp_ext.py").read_text() == patched
    record = json.loads((tree / "flashinfer/GLM5_SERVE_PATCHES.json").read_text())
    assert [p["name"] for p in record["patches"]] == series_names()
    assert record["flashinfer_python"] == "0.7.2"


def test_apply_defaults_to_the_imported_flashinfer(tmp_path: Path) -> None:
    tree = copy_flashinfer(tmp_path / "site")
    done = subprocess.run(
        [str(PATCHES / "apply"), "--dry-run"],
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
    done = run_apply("--target", str(tree))
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
    checks = run_verify(patched_tree, "--nvcc", str(fake_nvcc / "bin/nvcc"), FLASHINFER_CUDA_VERSION="12.9")
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
        patched_tree, ["13.0", "12", None], "--nvcc", nvcc, "--skip-compile"
    )
    assert not mismatch["ok"]
    assert "FLASHINFER_CUDA_VERSION=12.9" in mismatch["override-matches-toolkit"]["detail"]
    assert not malformed["ok"] and not malformed["override-set"]["ok"]
    assert "12" in malformed["override-set"]["detail"]
    assert not unset["ok"] and "is not set" in unset["override-set"]["detail"]
    unpatched = run_verify(unpatched_tree, "--nvcc", nvcc, FLASHINFER_CUDA_VERSION="12.9")
    assert not unpatched["patched-module"]["ok"]
    assert "run patches/apply" in unpatched["patched-module"]["detail"]
    assert "Unsupported" in unpatched["fullgraph-compile"]["detail"]


def test_verify_catches_a_file_changed_after_apply(tmp_path: Path, fake_nvcc: Path) -> None:
    tree = copy_flashinfer(tmp_path / "site")
    assert run_apply("--target", str(tree)).returncode == 0
    module = tree / "flashinfer/jit/cpp_ext.py"
    module.write_text(module.read_text() + "\n# reinstalled\n")
    checks = run_verify(
        tree, "--nvcc", str(fake_nvcc / "bin/nvcc"), "--skip-compile", FLASHINFER_CUDA_VERSION="12.9"
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
