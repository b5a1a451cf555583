"""Hangs fail safe: a hung start is restarted by the stall watchdog, and counted (hangs.json); a start that hangs
again and again becomes a recorded failure naming where it hung and the fix (exit code 73), which liveness leaves
alone and nothing the kit controls restarts. The FlashInfer autotune, silent until it ends, is a phase of its own
with a stall bound of its own. In process: the log is aged, not waited for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.report import HUNG
from configuration import state
from entrypoint import lifecycle
from healthcheck import phase, probe
from healthcheck.verdict import Observation, Phase, Verdict
from helpers.judging import observation
from test_folders import FakeSupervisor

MARKER = b"===== glm5-serve: server start #1 at 2026-12-03T09:00:00+00:00 pid 7: decode graphs expected 52, prefill 58 =====\n"
LOADED = b"[2026-12-03 09:01:00 TP0] Load weight begin. avail mem=94.62 GB\n[2026-12-03 09:02:00 TP0] Load weight end. elapsed=60.00 s, type=GlmMoeDsaForCausalLM, avail mem=38.10 GB, mem usage=56.52 GB.\n"
# 0.5.23 model_executor/runner/flashinfer_autotune.py:304 and :369, as logger.info formats them.
AUTOTUNE = b"[2026-12-03 09:02:05 TP0] Running FlashInfer autotune with cache: /cache/flashinfer/autotune/sm120.json\n"
AUTOTUNED = b"[2026-12-03 09:05:05 TP0] FlashInfer autotune completed.\n"


def observed(log: bytes, quiet: float, **more: Any) -> Observation:
    return observation(log, alive=True, quiet=quiet, **more)


def hung_start(start: int, quiet: float = 2000) -> Verdict:
    marker = MARKER.replace(b"#1", f"#{start}".encode())
    found = phase.judge(observed(marker + LOADED + AUTOTUNE, quiet))
    assert found.hung and found.start == start, found
    return found


def test_the_autotune_is_a_phase_with_its_own_stall_bound_and_fix() -> None:
    assert phase.judge(observed(MARKER + LOADED + AUTOTUNE, 600)).phase is Phase.AUTOTUNING
    found = phase.judge(observed(MARKER + LOADED + AUTOTUNE, 901))
    assert (found.phase, found.hung, found.stall_seconds) == (Phase.FAILED, True, 900)
    assert "while autotuning (GLM5_AUTOTUNE_STALL_SECONDS=900)" in str(found.reason)
    assert "GLM5_EXTRA_ARGS=--disable-flashinfer-autotune" in str(found.reason)
    done = phase.judge(observed(MARKER + LOADED + AUTOTUNE + AUTOTUNED, 1000))
    assert (done.phase, done.hung, done.stall_seconds) == (
        Phase.LOADING,
        False,
        1800,
    )  # the general bound again
    loading = phase.judge(observed(MARKER + LOADED, 1801))
    assert loading.hung and "entrypoint/doctor --nccl" in str(loading.reason)


def test_a_hang_that_repeats_ends_as_a_recorded_failure_after_the_retries(tmp_path: Path) -> None:
    rpc, run = FakeSupervisor(), str(tmp_path)
    assert lifecycle.watch(rpc, lambda: hung_start(1), run, 1) == lifecycle.RESTARTED
    assert (
        lifecycle.watch(rpc, lambda: hung_start(1), run, 1) == lifecycle.RESTARTED
    )  # the same start: counted once
    assert state.read_json(tmp_path / state.HANGS)["starts"] == [1]  # type: ignore[index]
    assert lifecycle.watch(rpc, lambda: hung_start(2), run, 1) == lifecycle.STOPPED
    assert rpc.calls == ["stop sglang", "start sglang", "stop sglang", "start sglang", "stop sglang"]
    failed = state.read_failed(run)
    assert failed is not None and failed["code"] == HUNG == 73
    assert (
        "2 starts in a row ended before they were verified (GLM5_START_RETRIES=1), the last hung"
        in failed["reason"]
    )
    assert (failed["start"], failed["kind"]) == (2, "hung")
    assert "while autotuning" in failed["reason"] and "--disable-flashinfer-autotune" in failed["reason"]
    # What every prober reads from then on: failed, of kind hung with the recorded code, not hung any more as
    # liveness reads it (it passes, the pod waits).
    found = phase.judge(
        observed(MARKER.replace(b"#1", b"#2") + LOADED + AUTOTUNE, 5000, failed=probe.recorded_of(failed))
    )
    assert (found.phase, found.failure_kind, found.hung, found.failure_code) == (
        Phase.FAILED,
        "hung",
        False,
        73,
    )
    # and nothing the kit controls starts it again: the server is stopped, so the watchdog has nothing to watch.
    assert lifecycle.watch(FakeSupervisor(statename="STOPPED"), lambda: hung_start(2), run, 1) is None


def test_a_start_that_reaches_ready_clears_the_count(tmp_path: Path) -> None:
    rpc, run = FakeSupervisor(), str(tmp_path)
    assert lifecycle.watch(rpc, lambda: hung_start(1), run, 1) == lifecycle.RESTARTED
    ready = hung_start(2)._replace(phase=Phase.READY, hung=False)
    assert lifecycle.watch(rpc, lambda: ready, run, 1) is None
    assert not (tmp_path / state.HANGS).exists()
    assert lifecycle.watch(rpc, lambda: hung_start(3), run, 1) == lifecycle.RESTARTED  # a first hang again


def test_without_retries_the_first_hang_is_recorded(tmp_path: Path) -> None:
    assert lifecycle.watch(FakeSupervisor(), lambda: hung_start(1), str(tmp_path), 0) == lifecycle.STOPPED
