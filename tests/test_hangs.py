"""Hangs fail safe: a hung start is restarted by the stall watchdog, and counted (hangs.json); a start that hangs
again and again becomes a recorded failure naming where it hung and the fix (exit code 73), which liveness leaves
alone and nothing the kit controls restarts. The FlashInfer autotune, silent until it ends, is a phase of its own
with a stall bound of its own. In process: the log is aged, not waited for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.report import HUNG
from configuration import state
from entrypoint import lifecycle
from healthcheck import phase, probe
from healthcheck.verdict import Observation, Phase, Verdict
from helpers.judging import observation
from test_folders import FakeSupervisor, listener_values

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
    rpc, run = FakeSupervisor(), listener_values(tmp_path, 1)
    assert lifecycle.watch(run, rpc, lambda: hung_start(1)) == lifecycle.RESTARTED
    assert (
        lifecycle.watch(run, rpc, lambda: hung_start(1)) == lifecycle.RESTARTED
    )  # the same start: counted once
    assert state.read_json(tmp_path / state.HANGS)["starts"] == [1]  # type: ignore[index]
    assert lifecycle.watch(run, rpc, lambda: hung_start(2)) == lifecycle.STOPPED
    assert rpc.calls == ["stop sglang", "start sglang", "stop sglang", "start sglang", "stop sglang"]
    failed = state.read_failed(tmp_path)
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
    assert lifecycle.watch(run, FakeSupervisor(statename="STOPPED"), lambda: hung_start(2)) is None


def test_a_start_that_reaches_ready_clears_the_count(tmp_path: Path) -> None:
    rpc, run = FakeSupervisor(), listener_values(tmp_path, 1)
    assert lifecycle.watch(run, rpc, lambda: hung_start(1)) == lifecycle.RESTARTED
    ready = hung_start(2)._replace(phase=Phase.READY, hung=False)
    assert lifecycle.watch(run, rpc, lambda: ready) is None
    assert not (tmp_path / state.HANGS).exists()
    assert lifecycle.watch(run, rpc, lambda: hung_start(3)) == lifecycle.RESTARTED  # a first hang again


def test_without_retries_the_first_hang_is_recorded_and_given_up_with_the_code_decided(
    tmp_path: Path,
) -> None:
    """Issue 52: the tick wrote failed.json and read it back for the code it gave up with; watch now gives up with
    the code `record` returned (GLM5_ON_FAILURE=exit: supervisord is shut down)."""
    rpc = FakeSupervisor()
    assert (
        lifecycle.watch(listener_values(tmp_path, 0, "exit"), rpc, lambda: hung_start(1)) == lifecycle.STOPPED
    )
    assert rpc.calls == ["stop sglang", "shutdown"]
    assert state.read_failed(tmp_path)["code"] == HUNG  # type: ignore[index]


def preflight_passed(run: dict[str, Any]) -> FakeSupervisor:
    rpc = FakeSupervisor()
    lifecycle.on_event("PROCESS_STATE_EXITED", {"processname": "preflight", "expected": "1"}, run, rpc)
    return rpc


def test_a_restarted_container_past_the_bound_starts_nothing_and_a_new_one_counts_afresh(
    tmp_path: Path,
) -> None:
    """Issue 52: compose restarts a container with a new state tmpfs, where the count of starts that ended before
    they were verified lived: with GLM5_ON_FAILURE=exit every restart loaded the weights GLM5_START_RETRIES + 1
    times more, without end. The count is kept beside the log (compose's volume), stamped with the container: past
    the bound a restarted container gives up at once; a start number counts again in a new state folder; another
    container's count (compose recreated it) or another boot's is not this one's."""
    run = listener_values(tmp_path, 1, "exit")
    assert state.count_unverified_end(tmp_path, 1, "sigquit", "start #1 crashed", "T1") == 1
    assert state.count_unverified_end(tmp_path, 1, "sigquit", "start #1 crashed", "T1") == 1  # the same start
    # The container restarted: a new state folder numbers from 1 again, and its start 1 is another start.
    assert state.count_unverified_end(tmp_path, 1, "sigquit", "start #1 crashed", "T2") == 2
    rpc = preflight_passed(run)  # restarted again (no starts file: a new state folder)
    assert rpc.calls == ["shutdown"]  # nothing started: GLM5_ON_FAILURE=exit
    failed = state.read_failed(tmp_path)
    assert failed is not None and (failed["start"], failed["kind"], failed["code"]) == (1, "sigquit", 70), (
        failed
    )
    assert (
        "2 starts in a row ended before they were verified, GLM5_START_RETRIES=1, counted across this container's "
        in failed["reason"]
    )
    assert failed["reason"].startswith("start #1 crashed") and "--force-recreate" in failed["reason"]
    state.clear_failed(tmp_path)
    hangs = tmp_path / state.HANGS
    for other in (
        "another-container " + state.this_container().split()[-1],
        state.this_container().split()[0] + " another-boot",
    ):
        hangs.write_text(json.dumps(json.loads(hangs.read_text()) | {"container": other}))
        assert state.read_unverified(tmp_path) is None
        assert preflight_passed(run).calls == ["start sglang"]
    assert state.count_unverified_end(tmp_path, 1, "sigquit", "start #1 crashed", "T3") == 1
