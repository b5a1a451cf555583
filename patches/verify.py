"""Check that the FlashInfer this python imports carries the patch series and that it works.

    patches/verify [--nvcc PATH] [--skip-compile] [--json]

Checks, in order: the imported flashinfer.jit.cpp_ext is the patched one (its record and
file hashes match); FLASHINFER_CUDA_VERSION is set and well-formed; it equals the image's
CUDA release (nvcc --version, else torch.version.cuda); a fullgraph torch.compile of a
function calling is_cuda_version_at_least() inline traces with zero graph breaks and
zero process spawns (seen by a Python audit hook). Exit 0 when all pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "FLASHINFER_CUDA_VERSION"
RECORD_NAME = "GLM5_SERVE_PATCHES.json"
SPAWN_EVENTS = (
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
)


class Check:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def record(self, name: str, ok: bool, detail: str) -> bool:
        self.results.append({"check": name, "ok": ok, "detail": detail})
        return ok


def check_patched_module(check: Check) -> Any:
    try:
        import flashinfer.jit.cpp_ext as cpp_ext
    except Exception as err:  # noqa: BLE001 - any import failure is the finding
        check.record("patched-module", False, f"import flashinfer.jit.cpp_ext failed: {err!r}")
        return None
    module_file = Path(cpp_ext.__file__).resolve()
    package = module_file.parent.parent
    site = package.parent
    record_path = package / RECORD_NAME
    if not record_path.is_file():
        check.record(
            "patched-module", False, f"{module_file} has no {record_path.name} beside it: run patches/apply"
        )
        return cpp_ext
    record = json.loads(record_path.read_text())
    for patch in record["patches"]:
        for rel, digest in patch["files"].items():
            actual = hashlib.sha256((site / rel).read_bytes()).hexdigest()
            if actual != digest:
                check.record(
                    "patched-module",
                    False,
                    f"{site / rel} differs from what {patch['name']} left "
                    "(reinstalled or edited since?): run patches/apply again",
                )
                return cpp_ext
    if not hasattr(cpp_ext, "CUDA_VERSION_ENV"):
        check.record("patched-module", False, f"{module_file} lacks the override: run patches/apply")
        return cpp_ext
    names = ", ".join(p["name"] for p in record["patches"])
    check.record("patched-module", True, f"{module_file} carries {names}")
    return cpp_ext


def toolkit_release(nvcc: str | None) -> tuple[str | None, str]:
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None and os.environ.get("CUDA_HOME"):
        candidate = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        nvcc = str(candidate) if candidate.exists() else None
    if nvcc is not None:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
        match = re.search(r"release (\d+\.\d+),", out)
        return (match.group(1) if match else None), f"{nvcc} --version"
    import torch

    return torch.version.cuda, "torch.version.cuda"


def check_override(check: Check, cpp_ext: Any, nvcc: str | None) -> None:
    raw = os.environ.get(ENV, "")
    if not raw.strip():
        check.record("override-set", False, f"{ENV} is not set: set it to the image's CUDA release")
        return
    try:
        value = cpp_ext.parse_cuda_version_override(raw)
    except ValueError as err:
        check.record("override-set", False, str(err))
        return
    check.record("override-set", True, f"{ENV}={raw} -> {value}")
    release, source = toolkit_release(nvcc)
    if release is None:
        check.record(
            "override-matches-toolkit",
            False,
            f"cannot tell this environment's CUDA release from {source}: "
            "install nvcc or a CUDA build of torch, or pass --nvcc",
        )
        return
    major_minor = ".".join(release.split(".")[:2])
    ok = str(value) == major_minor
    detail = f"{ENV}={value}, {source} says {major_minor}"
    if not ok:
        detail += f": set {ENV}={major_minor} (it drives -DENABLE_FP4 and sm_120f builds)"
    check.record("override-matches-toolkit", ok, detail)


def compile_probe(is_at_least: Callable[[str], bool]) -> dict[str, Any]:
    """fullgraph-compile a function that calls is_at_least inline; count spawns and breaks."""
    import torch
    from torch._dynamo.utils import counters

    spawns: list[str] = []
    armed = [False]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if armed[0] and event.startswith(SPAWN_EVENTS):
            spawns.append(f"{event} {str(args)[:120]}")

    sys.addaudithook(hook)

    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x * 2
        if is_at_least("12.8"):
            x = x + 1
        return torch.relu(x).sum()

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    armed[0] = True
    try:
        value = float(compiled(torch.ones(4)))
        error = None
    except Exception as err:  # noqa: BLE001 - the failure is the finding
        value, error = None, f"{type(err).__module__}.{type(err).__name__}: {str(err)[:400]}"
    finally:
        armed[0] = False
    breaks = sum(counters["graph_break"].values())
    return {"value": value, "error": error, "spawns": spawns, "graph_breaks": breaks}


def check_compile(check: Check, cpp_ext: Any) -> None:
    probe = compile_probe(cpp_ext.is_cuda_version_at_least)
    ok = probe["error"] is None and not probe["spawns"] and probe["graph_breaks"] == 0
    detail = (
        f"fullgraph compile: error={probe['error']}, spawns={len(probe['spawns'])}, "
        f"graph_breaks={probe['graph_breaks']}"
    )
    check.record("fullgraph-compile", ok, detail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="patches/verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvcc", help="nvcc to compare the override with (default: PATH, CUDA_HOME)")
    parser.add_argument("--skip-compile", action="store_true", help="skip the torch.compile check")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    check = Check()
    cpp_ext = check_patched_module(check)
    if cpp_ext is not None:
        if hasattr(cpp_ext, "parse_cuda_version_override"):
            check_override(check, cpp_ext, args.nvcc)
        if not args.skip_compile:
            check_compile(check, cpp_ext)
    ok = all(r["ok"] for r in check.results)
    if args.json:
        print(json.dumps({"ok": ok, "checks": check.results}, indent=2))
    else:
        for r in check.results:
            print(f"patches/verify: {'ok  ' if r['ok'] else 'FAIL'} {r['check']}: {r['detail']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
