"""MAX_JOBS for the server's run-time compiles, sized from the container's memory.

A start whose FlashInfer modules are not prebuilt (GLM5_KERNELS=none, or a prebuilt module that does not match)
compiles them at startup with FlashInfer's ninja, which passes no -j unless MAX_JOBS is set
(flashinfer/jit/cpp_ext.py `_get_num_workers`, `run_ninja`): ninja then runs nproc+2 jobs. One job of the fused MoE
module needs 10,627 MiB (kernels/sm120.toml `job_memory_mib` of fused_moe_120, measured on a 32-core build host,
2026-11-30), so on a many-core box under the pod's memory limit the compile is an OOM kill of the container. The kit
sets MAX_JOBS in the server's environment to what the memory holds: the cgroup's memory limit (v2 memory.max, v1
memory.limit_in_bytes), else MemTotal, less what the running server holds in the same memory while it compiles (the
compile runs inside the start, during FlashInfer's autotune: its TP ranks' host memory, glm5.toml's estimate a rank,
and the memory-backed /dev/shm, its whole size), over the neediest module's job, at most ninja's own nproc+2, at
least 1. An operator's MAX_JOBS wins (a positive whole number; anything else is refused: FlashInfer would ignore it silently).
torch's cpp_extension reads the same variable. Stdlib only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.report import Problem
from configuration import settings
from kernels import modules as kernel_modules

SETTING = "MAX_JOBS"
CGROUP_V2 = Path("/sys/fs/cgroup/memory.max")
CGROUP_V1 = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")
MEMINFO = Path("/proc/meminfo")
SHM = Path("/dev/shm")
MIB = 1024 * 1024


def job_mib(kernel_list: kernel_modules.KernelList | None = None) -> int:
    """What the neediest module's compile job needs (kernels/sm120.toml's measured `job_memory_mib`)."""
    found = [m.figures.get("job_memory_mib") for m in (kernel_list or kernel_modules.load()).modules]
    return max(int(f) for f in found if isinstance(f, int | float))


def mem_total_mib(meminfo: Path = MEMINFO) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cgroup_limit_mib(v2: Path = CGROUP_V2, v1: Path = CGROUP_V1) -> int | None:
    """The container's memory limit, None when it has none (v2 `max`; v1's near-2^63 'unlimited')."""
    for file in (v2, v1):
        try:
            text = file.read_text().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit():
            return None
        limit = int(text) // MIB
        return limit if limit < 2**40 else None  # v1 writes about 2^63 bytes for none: more than a petabyte
    return None


def memory_mib(v2: Path = CGROUP_V2, v1: Path = CGROUP_V1, meminfo: Path = MEMINFO) -> tuple[int | None, str]:
    """The memory the compiles may use, and where the figure came from: the cgroup limit, else MemTotal (the smaller
    of the two when both are known)."""
    limit, total = cgroup_limit_mib(v2, v1), mem_total_mib(meminfo)
    if limit is not None and (total is None or limit <= total):
        return limit, "the cgroup's memory limit"
    return total, "MemTotal"


def shm_mib(shm: Path = SHM) -> int:
    """The size of /dev/shm (a tmpfs: the pod's Memory emptyDir, or the host's under compose's host IPC), 0 when
    unreadable."""
    try:
        found = os.statvfs(shm)
    except OSError:
        return 0
    return found.f_blocks * found.f_frsize // MIB


def server_held_mib(shm: int | None = None, cfg: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """What the running server holds of the memory while a start compiles, and how it was reckoned: its TP ranks'
    host memory (glm5.toml [deployment] server_host_mib_per_rank, an estimate) and /dev/shm's whole size."""
    deployment = (cfg or settings.load_config())["deployment"]
    ranks, per_rank = int(deployment["gpu_count"]), int(deployment["server_host_mib_per_rank"])
    shm = shm_mib() if shm is None else shm
    return (
        ranks * per_rank + shm,
        f"{ranks} ranks x {per_rank:,} MiB (an estimate) and /dev/shm's {shm:,} MiB",
    )


def sized(memory: int | None, need: int, cores: int) -> int:
    """Jobs the memory holds at `need` MiB each: at most ninja's default (cores + 2), at least 1."""
    if memory is None:
        return max(1, cores + 2)  # nothing to size from: ninja's own choice, named in the log
    return max(1, min(cores + 2, memory // need))


def check(environ: Mapping[str, str]) -> list[Problem]:
    text = environ.get(SETTING, "").strip()
    if not text or (text.isdigit() and int(text) >= 1):  # unset or empty: sized from the memory
        return []
    return [
        Problem(
            SETTING,
            f"{environ[SETTING]!r} is not a positive whole number (FlashInfer's ninja would ignore it and run nproc+2 jobs)",
            "set a job count such as 8, or unset it: the kit sizes it from the memory",
        )
    ]


def chosen(
    environ: Mapping[str, str],
    cores: int,
    memory: tuple[int | None, str] | None = None,
    held: tuple[int, str] | None = None,
) -> tuple[str, str]:
    """MAX_JOBS for the server, and where it came from ("environment", or how it was sized): `memory` the container's
    (memory_mib), `held` what the running server holds of it (server_held_mib); both read here when not given."""
    if environ.get(SETTING, "").strip():
        return environ[SETTING].strip(), "environment"
    found, source = memory if memory is not None else memory_mib()
    need = job_mib()
    if found is None:
        return str(sized(None, need, cores)), f"no memory figure readable: cores + 2 ({cores} cores)"
    taken, what = held if held is not None else server_held_mib()
    jobs = sized(max(0, found - taken), need, cores)
    return str(jobs), (
        f"{found:,} MiB ({source}) less {taken:,} MiB the running server holds ({what}) / {need:,} MiB a compile "
        f"job, at most {cores} cores + 2"
    )
