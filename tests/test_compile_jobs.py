"""MAX_JOBS for the server's run-time compiles (configuration/compile_jobs.py): without it FlashInfer's ninja runs
nproc+2 jobs of up to 10,627 MiB each (fused_moe_120, kernels/sm120.toml); the kit sizes it from the container's
memory, the operator's value wins, and FlashInfer's own run_ninja passes it on as -j."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configuration import compile_jobs
from conftest import ROOT, kit_env
from kernels import modules as kernel_modules

GIB = 1024**3


def serve_printing_max_jobs(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "fake-server"
    program.write_text('#!/bin/sh\necho "max_jobs=[$MAX_JOBS]"\n')
    program.chmod(0o755)
    full = kit_env(GLM5_STATE_DIR=str(tmp_path / "run"), GLM5_SERVER_PROGRAM=str(program), **env)
    if "MAX_JOBS" not in env:
        full.pop("MAX_JOBS", None)
    return subprocess.run([str(ROOT / "entrypoint/launch"), "--serve"], env=full, capture_output=True, text=True,
                          check=False)  # fmt: skip


def test_the_server_gets_max_jobs_sized_from_the_memory(tmp_path: Path) -> None:
    done = serve_printing_max_jobs(tmp_path)
    assert done.returncode == 0, done.stderr
    memory, source = compile_jobs.memory_mib()
    assert memory is not None
    held, _what = compile_jobs.server_held_mib()
    expected = compile_jobs.sized(max(0, memory - held), 10_627, len(os.sched_getaffinity(0)))
    assert f"max_jobs=[{expected}]" in done.stdout
    assert (
        f"MAX_JOBS={expected} for run-time compiles: {memory:,} MiB ({source}) less {held:,} MiB"
        in done.stderr
    )
    record = json.loads((tmp_path / "run/launch.json").read_text())
    assert record["env"]["MAX_JOBS"] == str(expected) and record["env_from"]["MAX_JOBS"] == "memory"


def test_the_operators_max_jobs_wins_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    done = serve_printing_max_jobs(tmp_path, MAX_JOBS="3")
    assert done.returncode == 0 and "max_jobs=[3]" in done.stdout, done.stderr
    assert json.loads((tmp_path / "run/launch.json").read_text())["env_from"]["MAX_JOBS"] == "environment"
    bad = subprocess.run([str(ROOT / "entrypoint/launch"), "--dry-run"], env=kit_env(MAX_JOBS="lots"),
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 3 and "MAX_JOBS: 'lots' is not a positive whole number" in bad.stderr
    assert "the kit sizes it from the memory" in bad.stderr


def test_the_job_figure_is_the_neediest_modules_measured_one() -> None:
    needs = {m.name: m.figures.get("job_memory_mib") for m in kernel_modules.load().modules}
    assert compile_jobs.job_mib() == needs["fused_moe_120"] == max(n for n in needs.values() if n) == 10_627


@pytest.mark.parametrize(
    ("v2", "v1", "total_gib", "cores", "jobs", "source"),
    [
        (str(192 * GIB), None, 1024, 128, 18, "the cgroup's memory limit"),  # the pod's memory_limit = 192Gi
        ("max", None, 1024, 128, 98, "MemTotal"),  # no limit: MemTotal
        ("max", None, 1024, 16, 18, "MemTotal"),  # at most ninja's own nproc+2
        (None, str(64 * GIB), 1024, 128, 6, "the cgroup's memory limit"),  # cgroup v1
        (None, str(2**63 - 4096), 256, 128, 24, "MemTotal"),  # v1's "unlimited"
        (str(2048 * GIB), None, 256, 128, 24, "MemTotal"),  # a limit above the memory there is
        (str(8 * GIB), None, 256, 128, 1, "the cgroup's memory limit"),  # at least one job
    ],
)
def test_max_jobs_is_the_memory_over_ten_gib_a_job(
    tmp_path: Path, v2: str | None, v1: str | None, total_gib: int, cores: int, jobs: int, source: str
) -> None:
    files = {"v2": tmp_path / "memory.max", "v1": tmp_path / "limit", "meminfo": tmp_path / "meminfo"}
    for key, text in (("v2", v2), ("v1", v1)):
        if text is not None:
            files[key].write_text(text + "\n")
    files["meminfo"].write_text(f"MemTotal:       {total_gib * 1024 * 1024} kB\nMemFree: 1 kB\n")
    memory = compile_jobs.memory_mib(files["v2"], files["v1"], files["meminfo"])
    assert memory[1] == source
    nothing_held = (0, "nothing")
    assert compile_jobs.chosen({}, cores, memory, nothing_held)[0] == str(jobs)
    assert compile_jobs.chosen({"MAX_JOBS": "5"}, cores, memory) == ("5", "environment")


def test_max_jobs_leaves_the_running_servers_memory_alone() -> None:
    """The pod (glm5.toml: memory_limit 192Gi, a 64Gi Memory /dev/shm, 8 ranks): 8 jobs, not the 18 the whole limit
    would give, and the dry run's reason says why."""
    pod = (192 * 1024, "the cgroup's memory limit")
    held = compile_jobs.server_held_mib(shm=64 * 1024)
    assert held[0] == 8 * 5120 + 64 * 1024
    jobs, why = compile_jobs.chosen({}, 128, pod, held)
    assert jobs == "8" and compile_jobs.chosen({}, 128, pod, (0, "nothing"))[0] == "18"
    assert "less 106,496 MiB the running server holds (8 ranks x 5,120 MiB (an estimate)" in why
    assert compile_jobs.shm_mib(Path("/nonexistent")) == 0 and compile_jobs.shm_mib() > 0


def test_flashinfers_own_ninja_runs_with_the_kits_max_jobs(tmp_path: Path) -> None:
    """flashinfer-python 0.7.2's jit/cpp_ext.py run_ninja, with a ninja on PATH that records its arguments."""
    ninja = tmp_path / "bin" / "ninja"
    ninja.parent.mkdir()
    ninja.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\n')
    ninja.chmod(0o755)
    jobs, _why = compile_jobs.chosen({}, 128, (192 * 1024, "the cgroup's memory limit"), (0, "nothing"))
    script = (
        "from pathlib import Path; from flashinfer.jit import cpp_ext; "
        f"cpp_ext.run_ninja(Path({str(tmp_path / 'w')!r}), Path({str(tmp_path / 'build.ninja')!r}), False)"
    )
    env = os.environ | {"PATH": f"{ninja.parent}:{os.environ['PATH']}"}
    for value, expected in ((jobs, f"-j {jobs}"), (None, None)):
        run_env = env | {"MAX_JOBS": value} if value else {k: v for k, v in env.items() if k != "MAX_JOBS"}
        done = subprocess.run([sys.executable, "-c", script], env=run_env, capture_output=True,
                              text=True, check=False, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        args = (tmp_path / "args").read_text()
        assert (expected in args) if expected else ("-j" not in args), args  # without it: ninja's nproc+2
    assert jobs == "18"
