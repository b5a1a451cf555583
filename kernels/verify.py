"""Ask the pinned FlashInfer runtime, with no CUDA compiler reachable and JIT disabled, which modules of
kernels/sm120.toml it would load prebuilt and which it would still compile at a first start.

    kernels/verify [--require-all] [--json]

It runs itself again in a sealed environment: PATH without any folder holding nvcc, CUDA_HOME unset,
FLASHINFER_DISABLE_JIT=1 and an empty JIT workspace. There, for each listed module, FlashInfer's own
JitSpec.is_aot decides; a module kernels/build recorded must be prebuilt, unchanged (sha256) and link the driver
as libcuda.so.1; a module it did not build must be missing, and the runtime must refuse to compile it
(MissingJITCacheError). Each prebuilt module is then loaded as a start loads it (build_and_load); one that calls
the driver API needs libcuda.so.1, which only a GPU host has: that one is reported, not failed. Exit 0 when all holds, 1 otherwise (--require-all: also when a module is not prebuilt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common.report import FAILED, OK, Log
from kernels.build import sha256
from kernels.modules import RECORD_NAME, SETTING, KernelList, aot_dir, load

log = Log("kernels/verify")


def sealed_env(env: dict[str, str], arch_list: str, workspace: str) -> dict[str, str]:
    """The environment of a first start that could not compile: no nvcc on PATH, JIT disabled."""
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvcc").exists()]
    sealed = {k: v for k, v in env.items() if k not in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_NVCC")}
    sealed.update(
        {
            "PATH": os.pathsep.join(path),
            "FLASHINFER_DISABLE_JIT": "1",
            "FLASHINFER_CUDA_ARCH_LIST": arch_list,  # what the generators read without a GPU; the names do not depend on it
            "FLASHINFER_WORKSPACE_BASE": workspace,  # an empty JIT cache: nothing can come from there
            "TORCHINDUCTOR_CACHE_DIR": f"{workspace}/inductor",  # torch makes it at import; gone with the workspace
        }
    )
    return sealed


def needed_libraries(path: Path) -> list[str] | None:
    """The ELF's DT_NEEDED entries (readelf, from binutils), or None without readelf."""
    if shutil.which("readelf") is None:
        return None
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def driver_link_problem(needed: list[str]) -> str | None:
    """A module must ask for the driver by its soname, libcuda.so.1: 'libcuda.so' is a development link that the
    driver does not install, so such a module would not load on the GPU host (a stub without the soname linked it)."""
    if "libcuda.so" in needed:
        return "links 'libcuda.so', which the driver does not install (a stub without the soname libcuda.so.1 was linked)"
    return None


def load_result(spec: Any, path: Path) -> str:
    """Load the module as a start would (JitSpec.build_and_load, JIT disabled), or say why it cannot be loaded
    here. A module that calls the driver API directly needs libcuda.so.1, which only a GPU host has."""
    from flashinfer.jit.core import MissingJITCacheError

    try:
        spec.build_and_load()
        return "loaded by JitSpec.build_and_load() with JIT disabled"
    except (
        MissingJITCacheError
    ):  # try_load logged why the prebuilt file did not load; load it to see the error
        pass
    try:
        spec.load(path)
    except Exception as error:  # noqa: BLE001 - whatever the loader raises is the finding
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if "libcuda.so.1" in reason:
            return f"needs the GPU driver to load ({reason})"
        return reason
    return "loaded by JitSpec.load() only (build_and_load() refused it)"


def check(kernel_list: KernelList) -> dict[str, Any]:
    """The sealed run's findings: one entry per module, and the problems."""
    from flashinfer.jit.core import MissingJITCacheError

    problems: list[str] = []
    if shutil.which("nvcc"):
        problems.append(f"nvcc is still on PATH ({shutil.which('nvcc')}): the check is not sealed")
    folder = aot_dir()
    record_path = folder / RECORD_NAME
    if not record_path.is_file():
        return {"modules": [], "problems": [f"no {record_path}: kernels/build did not run in this image"]}
    record = json.loads(record_path.read_text())
    built = {b["name"]: b for b in record["built"]}
    modules = []
    for module in kernel_list.modules:
        spec = module.spec()
        entry: dict[str, Any] = {"name": module.name, "prebuilt": bool(spec.is_aot)}
        if spec.is_aot:
            path = Path(spec.aot_artifacts[0].path)
            entry["path"] = str(path)
            if module.name not in built:
                problems.append(
                    f"{module.name}: prebuilt at {path}, but the record does not list it (a stale file)"
                )
            elif path != folder / module.name / f"{module.name}.so":
                problems.append(
                    f"{module.name}: the runtime takes {path}, not the kit's {folder / module.name}"
                )
            elif sha256(path) != built[module.name]["sha256"]:
                problems.append(f"{module.name}: {path} differs from what kernels/build recorded (sha256)")
            needed = needed_libraries(path)
            entry["needed"] = needed
            entry["load"] = load_result(spec, path)
            if not entry["load"].startswith(("loaded", "needs the GPU driver")):
                problems.append(f"{module.name}: the runtime cannot load {path}: {entry['load']}")
            wrong = driver_link_problem(needed or [])
            if wrong:
                problems.append(f"{module.name}: {wrong}")
        else:
            if module.name in built:
                problems.append(
                    f"{module.name}: recorded as built, but the runtime does not find it prebuilt"
                )
            try:
                spec.build()
                problems.append(f"{module.name}: compiled although FLASHINFER_DISABLE_JIT is set")
            except MissingJITCacheError:
                entry["first_start"] = "compiles at first start (here: MissingJITCacheError, JIT disabled)"
        modules.append(entry)
    return {"selection": record.get("selection"), "modules": modules, "problems": problems}


def report(kernel_list: KernelList, result: dict[str, Any], require_all: bool) -> int:
    problems = list(result["problems"])
    prebuilt = [m["name"] for m in result["modules"] if m["prebuilt"]]
    later = [m["name"] for m in result["modules"] if not m["prebuilt"]]
    for m in result["modules"]:
        state = (
            f"prebuilt {m['path']}; {m['load']}" if m["prebuilt"] else m.get("first_start", "not prebuilt")
        )
        log.info(f"{m['name']}: {state}")
    if require_all and later:
        problems.append(
            f"--require-all: {', '.join(later)} not prebuilt ({SETTING}={result.get('selection')})"
        )
    for problem in problems:
        log.error(problem)
    total = len(kernel_list.modules)
    if not result["modules"]:  # nothing was asked of the runtime (no record): the problem above says why
        return FAILED
    if later:
        log.info(
            f"prebuilt {len(prebuilt)}/{total} ({SETTING}={result.get('selection')}); "
            f"compile at first start: {', '.join(later)}"
        )
    else:
        log.info(f"prebuilt {total}/{total}: a first start compiles none of these FlashInfer modules")
    return FAILED if problems else OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernels/verify", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--require-all", action="store_true", help="fail unless every listed module is prebuilt"
    )
    parser.add_argument("--json", action="store_true", help="print the findings as JSON on stdout")
    parser.add_argument("--sealed", action="store_true", help=argparse.SUPPRESS)  # the run inside sealed_env
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    kernel_list = load()
    if not args.sealed:
        with tempfile.TemporaryDirectory(prefix="glm5-kernels-verify-") as workspace:
            env = sealed_env(dict(os.environ), kernel_list.arch_list, workspace)
            again = [
                sys.executable,
                "-m",
                "kernels.verify",
                "--sealed",
                *(sys.argv[1:] if argv is None else argv),
            ]
            return subprocess.run(again, env=env).returncode
    result = check(kernel_list)
    if args.json:
        print(json.dumps(result, indent=2))
    return report(kernel_list, result, args.require_all)


if __name__ == "__main__":
    sys.exit(main())
