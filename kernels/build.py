"""Compile the FlashInfer modules of kernels/sm120.toml for SM120 into FlashInfer's prebuilt (AOT) folder.

    kernels/build [--modules LIST] [--jobs N] [--dry-run]

--modules defaults to GLM5_KERNELS (`all`; `none` for a quick build, `ci`, or names, comma-separated); --jobs to
MAX_JOBS, else as many parallel compiler jobs as the cores and the memory allow (each job needs the list's
`job_memory_mib`). Everything is checked before the first compile: the selection, the jobs, the CUDA toolkit
(CUDA_HOME's nvcc at FLASHINFER_CUDA_VERSION, cuBLAS and cuRAND headers, the libcuda link stub), ninja and c++.
Modules are compiled by FlashInfer's own ninja files into a scratch workspace (removed afterwards), never into the
run-time JIT cache, and copied to <site-packages>/flashinfer/data/aot/<name>/<name>.so, where FlashInfer's runtime
looks first (flashinfer/jit/env.py get_aot_artifacts). A record of what was built (seconds, peak memory of one job,
size, sha256) goes beside them: GLM5_SERVE_KERNELS.json. Exit 0 when built, 1 when a compile fails, 2 on a bad
command line or selection, 3 when the toolchain or memory is not fit.
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
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.report import FAILED, INVALID_SETTING, OK, USAGE, Log, Problem
from kernels.modules import RECORD_NAME, SETTING, KernelList, Module, aot_dir, load

log = Log("kernels/build")

# What each compile needs from the CUDA toolkit, as the nvidia/cuda devel image lays it out.
HEADERS = ("cublasLt.h", "curand.h")  # fp4 GEMM and fused MoE include cuBLASLt, sampling cuRAND
LINK_STUB = Path("lib64/stubs/libcuda.so")  # FlashInfer links -lcuda from $cuda_home/lib64/stubs (cpp_ext.py)


@dataclass(frozen=True)
class Built:
    name: str
    seconds: float
    jobs: int
    job_memory_mib: int
    path: Path
    size: int
    sha256: str


def nvcc_release(nvcc: Path) -> str | None:
    """MAJOR.MINOR from `nvcc --version`, or None when it does not run."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def toolchain_problems(
    cuda_home: Path, want_release: str | None, which: Callable[[str], str | None] = shutil.which
) -> list[Problem]:
    """Everything the compiles need, each missing piece as a Problem naming the fix."""
    problems = []
    nvcc = cuda_home / "bin" / "nvcc"
    if not os.access(nvcc, os.X_OK):
        problems.append(
            Problem(
                "CUDA_HOME",
                f"no nvcc at {nvcc}",
                "build from a CUDA devel base image (BASE_IMAGE, e.g. nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04), "
                "or GLM5_KERNELS=none to leave the kernels to the first start",
            )
        )
    else:
        release = nvcc_release(nvcc)
        if release is None:
            problems.append(Problem("CUDA_HOME", f"{nvcc} --version printed no release", "check the toolkit"))
        elif want_release and release != want_release:
            problems.append(
                Problem(
                    "FLASHINFER_CUDA_VERSION",
                    f"the image says CUDA {want_release} but {nvcc} is release {release}",
                    "set the Dockerfile's CUDA_MAJOR_MINOR to the base image's CUDA release",
                )
            )
    for header in HEADERS:
        if not (cuda_home / "include" / header).is_file():
            problems.append(
                Problem(
                    "CUDA_HOME",
                    f"no {header} in {cuda_home / 'include'}",
                    "use a CUDA devel base image, which carries the cuBLAS and cuRAND headers",
                )
            )
    if not (cuda_home / LINK_STUB).exists():
        problems.append(
            Problem(
                "CUDA_HOME",
                f"no libcuda link stub at {cuda_home / LINK_STUB}",
                "use a CUDA devel base image (it carries lib64/stubs/libcuda.so)",
            )
        )
    for tool, fix in (
        ("ninja", "install ninja (the image's venv has it from the lock)"),
        (os.environ.get("CXX", "c++"), "install g++ (the Dockerfile's apt step does)"),
    ):
        if which(tool) is None:
            problems.append(Problem("PATH", f"no {tool} on PATH", fix))
    return problems


def available_memory_mib() -> int:
    """What this build may still use: MemAvailable, lowered by a cgroup v2 memory limit if there is one."""
    available = None
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            available = int(line.split()[1]) // 1024
    limit_file, current_file = Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")
    try:
        limit = limit_file.read_text().strip()
        if limit != "max":
            left = (int(limit) - int(current_file.read_text())) // (1024 * 1024)
            available = left if available is None else min(available, left)
    except (OSError, ValueError):
        pass
    return available if available is not None else 0


def plan_jobs(requested: str, cores: int, available_mib: int, need_mib: int) -> tuple[int, list[Problem]]:
    """Parallel compiler jobs: MAX_JOBS when given (and the memory holds it), else min(cores, memory / need)."""
    fits = available_mib // need_mib if need_mib else cores
    text = requested.strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            return 0, [
                Problem(
                    "MAX_JOBS",
                    f"'{requested}' is not a positive whole number",
                    "set a job count such as 8, or leave it empty to follow the cores and memory",
                    USAGE,
                )
            ]
        jobs = int(text)
        if jobs > fits:
            return jobs, [
                Problem(
                    "MAX_JOBS",
                    f"{jobs} jobs need {jobs * need_mib} MiB ({need_mib} MiB each) but {available_mib} MiB "
                    f"are available",
                    f"set MAX_JOBS={max(fits, 1)} or less, or give the build more memory",
                )
            ]
        return jobs, []
    if fits < 1:
        return 0, [
            Problem(
                "MAX_JOBS",
                f"one compile job needs {need_mib} MiB but {available_mib} MiB are available",
                "give the build more memory (Docker Desktop: Resources), or GLM5_KERNELS=none",
            )
        ]
    return max(1, min(cores, fits)), []


def run_ninja(build_dir: Path, ninja_file: Path, jobs: int, name: str) -> tuple[float, int, deque[str]]:
    """FlashInfer's ninja file, with a short progress line per compile; returns seconds, the largest single
    process's peak memory (MiB: one job's need) and the output's last lines."""
    command = ["ninja", "-v", "-C", str(build_dir), "-f", str(ninja_file), "-j", str(jobs)]
    env = {**os.environ, "NINJA_STATUS": "[%f/%t %es] "}
    tail: deque[str] = deque(maxlen=80)
    began = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert process.stdout is not None
    for line in process.stdout:
        tail.append(line.rstrip())
        status = re.match(r"(\[\d+/\d+ [\d.]+s\]) .*?(?:-o (\S+))?\s*$", line)
        if status:
            log.info(f"{name} {status.group(1)} {Path(status.group(2) or '').name or 'link'}")
    _, status_word, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status_word)
    peak_mib = usage.ru_maxrss // 1024  # kB on Linux: the largest process of ninja's tree (nvcc, cicc, ptxas)
    if process.returncode != 0:
        for line in tail:
            log.error(f"{name} | {line}")
        raise subprocess.CalledProcessError(process.returncode, command)
    return time.monotonic() - began, peak_mib, tail


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def install(source: Path, target_dir: Path, name: str) -> Path:
    """Copy a built module to <aot>/<name>/<name>.so, whole or not at all."""
    target = target_dir / name / f"{name}.so"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".so.partial")
    shutil.copyfile(source, partial)
    partial.chmod(0o755)
    partial.replace(target)
    return target


def link_problems(modules: Sequence[Module], cuda_home: Path) -> list[Problem]:
    """Libraries a module links beyond the CUDA runtime (-lnvrtc for the fused MoE), checked before hours of
    compiling rather than at the final link."""
    problems = []
    for module in modules:
        for flag in module.spec().extra_ldflags or []:
            if flag.startswith("-l") and not (cuda_home / "lib64" / f"lib{flag[2:]}.so").exists():
                problems.append(
                    Problem(
                        "CUDA_HOME",
                        f"{module.name} links {flag} but {cuda_home / 'lib64'} has no lib{flag[2:]}.so",
                        "use a CUDA devel base image (it carries the toolkit's libraries)",
                    )
                )
    return problems


def build_module(module: Module, jobs: int, target_dir: Path) -> Built:
    spec = module.spec()
    if spec.name != module.name:
        raise RuntimeError(f"{module.generator} now makes '{spec.name}', the list says '{module.name}'")
    spec.write_ninja()
    seconds, peak_mib, _ = run_ninja(spec.build_dir, spec.ninja_path, jobs, module.name)
    path = install(Path(spec.jit_library_path), target_dir, module.name)
    return Built(module.name, round(seconds, 1), jobs, peak_mib, path, path.stat().st_size, sha256(path))


def record(
    kernel_list: KernelList, selection: str, built: Sequence[Built], release: str | None
) -> dict[str, Any]:
    import flashinfer

    names = [b.name for b in built]
    return {
        "selection": selection,
        "flashinfer": flashinfer.__version__,
        "arch_list": kernel_list.arch_list,
        "nvcc_release": release,
        "built": [
            {
                "name": b.name,
                "seconds": b.seconds,
                "jobs": b.jobs,
                "job_memory_mib": b.job_memory_mib,
                "bytes": b.size,
                "sha256": b.sha256,
            }
            for b in built
        ],
        "not_built": [n for n in kernel_list.names if n not in names],
    }


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kernels/build", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--modules", default=os.environ.get(SETTING, "all"), help=f"default: {SETTING} or all"
    )
    parser.add_argument(
        "--jobs", default=os.environ.get("MAX_JOBS", ""), help="default: MAX_JOBS, else automatic"
    )
    parser.add_argument("--dry-run", action="store_true", help="check and print the plan; compile nothing")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    kernel_list = load()
    try:
        selected = kernel_list.select(args.modules)
    except Problem as problem:
        return log.problems([problem], "bad selection; nothing was compiled")
    # FlashInfer reads these when it is first imported (by the generators): the target architecture, and a scratch
    # workspace for its ninja files and objects, removed at the end (the run-time JIT cache is never touched).
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = kernel_list.arch_list
    os.environ.pop("FLASHINFER_DISABLE_JIT", None)
    with tempfile.TemporaryDirectory(prefix="glm5-kernels-") as workspace:
        os.environ["FLASHINFER_WORKSPACE_BASE"] = workspace
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = (
            f"{workspace}/inductor"  # torch, which FlashInfer imports, makes it
        )
        return build(args, kernel_list, selected)


def build(args: argparse.Namespace, kernel_list: KernelList, selected: Sequence[Module]) -> int:
    cuda_home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    problems: list[Problem] = []
    cores, available, need = len(os.sched_getaffinity(0)), available_memory_mib(), 0
    jobs: dict[str, int] = {}  # per module: the MoE's compiles need ~10 GiB each, the others 0.5-7 GiB
    if selected:
        problems = toolchain_problems(cuda_home, os.environ.get("FLASHINFER_CUDA_VERSION"))
        if (cuda_home / "bin" / "nvcc").exists():  # FlashInfer's generators ask nvcc for its version
            problems += link_problems(selected, cuda_home)
        needs = {m.name: int(m.figures.get("job_memory_mib", 0)) for m in selected}
        plans = {name: plan_jobs(args.jobs, cores, available, needs[name]) for name in needs}
        jobs = {name: plan[0] for name, plan in plans.items()}
        need = max(needs.values())
        problems += plans[max(needs, key=needs.__getitem__)][
            1
        ]  # the neediest module names a MAX_JOBS problem once
    if problems:
        log.problems(problems, "problem(s) before compiling; nothing was compiled")
        return USAGE if any(p.code == USAGE for p in problems) else INVALID_SETTING
    log.info(
        f"{len(selected)} of {len(kernel_list.modules)} modules for sm_{kernel_list.arch_list.replace('.', '')}: "
        f"{', '.join(m.name for m in selected) or f'none ({SETTING}={args.modules}: all compile at first start)'}"
        + (
            f"; {min(jobs.values())}-{max(jobs.values())} jobs ({cores} cores, {available} MiB available, "
            f"up to {need} MiB per job)"
            if selected
            else ""
        )
    )
    if args.dry_run:
        return OK
    target = aot_dir()
    built: list[Built] = []
    for module in selected:
        log.info(f"{module.name}: {module.sources} sources, {jobs[module.name]} jobs ({module.why})")
        try:
            built.append(build_module(module, jobs[module.name], target))
        except (subprocess.CalledProcessError, RuntimeError, OSError) as error:
            log.error(f"{module.name} did not compile for SM120: {error}")
            log.error(
                f"fix: read the compiler output above; {SETTING} without {module.name} leaves it to "
                "the first start (where it fails the same way)"
            )
            return FAILED
        done = built[-1]
        log.info(
            f"{done.name}: built in {done.seconds:.0f} s, {done.size / 2**20:.1f} MiB, one job peaked at "
            f"{done.job_memory_mib} MiB -> {done.path}"
        )
    release = nvcc_release(cuda_home / "bin" / "nvcc") if selected else None
    target.mkdir(parents=True, exist_ok=True)
    (target / RECORD_NAME).write_text(
        json.dumps(record(kernel_list, args.modules, built, release), indent=2) + "\n"
    )
    log.info(f"prebuilt {len(built)}/{len(kernel_list.modules)}; record: {target / RECORD_NAME}")
    return OK


if __name__ == "__main__":
    sys.exit(main())
