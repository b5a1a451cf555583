"""Every failure kind of the one table (common/report.py FAILURES) ends where the table says: the lifecycle listener,
the one recorder, records it with the kind's exit code (at once, or for a kind a restart may clear once more than
GLM5_START_RETRIES starts in a row ended so), `launch --failed-code` hands entrypoint.sh that code, and the exporter
exports the kind's code until it is recorded, the exit code after. One case per row, generated from the table: a
row without a case, or a kind the recorder leaves alone, fails here. In process: the listener with a fake
supervisord (tests/test_folders.py), the log written as SGLang writes it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from common.report import FAILURE, FAILURES
from configuration import state
from conftest import ROOT
from entrypoint import launch, lifecycle
from healthcheck import logscan, probe
from healthcheck.verdict import Verdict
from helpers import start_record
from helpers.judging import judged
from monitoring import exporter
from test_folders import FakeSupervisor

RETRIES = 1
READY_LOG = (ROOT / "tests/fixtures/logs/sglang-0.5.23-rendered-from-source.log").read_bytes()
LOADING = b"[2026-12-03 09:01:00 TP0] Load weight begin. avail mem=94.62 GB\n"
# What the server's log holds when a start ends so (SGLang's wordings, as tests/fixtures/logs and
# tests/test_live_verdict.py quote them; `exited`: nothing, the process just ended).
CRASH_LINES: dict[str, bytes] = {
    "oom": b"[2026-12-03 09:02:00 TP3] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
    "traceback": b'Traceback (most recent call last):\n  File "model_runner.py", line 9\nRuntimeError: boom\n',
    "capture_failed": b"[2026-12-03 09:02:00 TP0] Capture cuda graph failed: CUDA error: out of resources\n",
    "process_exception": b"[2026-12-03 09:02:00 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"
    b"torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n",
    "sigquit": b"[2026-12-03 09:02:00] Subprocess scheduler_0 (pid=28601) crashed with exit code -9. Triggering "
    b"SIGQUIT for cleanup...\n",
    "nccl_watchdog": b"[rank3]:[E1203 09:02:00 ProcessGroupNCCL.cpp:616] Watchdog caught collective operation "
    b"timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n",
    "killed": b"[2026-12-03 09:02:00] kill_process_tree called: parent_pid=28565, include_parent=False, pid=28565\n",
    "exited": b"",
}


def marker(start: int) -> bytes:
    return (
        f"===== glm5-serve: server start #{start} at 2026-12-03T09:00:00+00:00 pid 7: decode graphs expected 52, "
        "prefill 58 =====\n"
    ).encode()


def verified(verdict: str) -> dict[str, Any]:
    return {
        "start": 1,
        "passed": False,
        "verdict": verdict,
        "reasons": ["tool: wrong tool-madrid"],
        "results": [],
    }


# The verdict of a running start judged failed for good, per kind: the tick's (lifecycle.watch).
JUDGED: dict[str, Callable[[], Verdict]] = {
    "decode_short": lambda: judged(marker(1) + READY_LOG, (60, 58), alive=True, http=200),
    "prefill_short": lambda: judged(marker(1) + READY_LOG, (52, 60), alive=True, http=200),
    "no_decode_capture": lambda: judged(
        marker(1) + LOADING + b"[2026-12-03 09:09:00] The server is fired up and ready to roll!\n", alive=True
    ),
    "wrong_answers": lambda: judged(
        marker(1) + READY_LOG, alive=True, http=200, verification=probe.verification_of(verified("wrong"), 1)
    ),
    "degenerate_answers": lambda: judged(
        marker(1) + READY_LOG,
        alive=True,
        http=200,
        verification=probe.verification_of(verified("degenerate"), 1),
    ),
    "verify_inconclusive": lambda: judged(
        marker(1) + READY_LOG,
        alive=True,
        http=200,
        verification=probe.verification_of(verified("inconclusive"), 1),
    ),
}


def values(tmp: Path) -> dict[str, Any]:
    (tmp / "log").mkdir(exist_ok=True)
    return {"state_dir": str(tmp), "log_dir": str(tmp / "log"), "verify": "enforce", "start_retries": RETRIES,
            "on_failure": "wait"}  # fmt: skip


def give_up(kind: str, tmp: Path) -> FakeSupervisor:
    """Drive the listener as supervisord and the server would for this kind, until it gives up."""
    rpc, run = FakeSupervisor(), values(tmp)
    if kind in JUDGED:
        (tmp / state.STARTS).write_text("1")
        found = JUDGED[kind]()
        assert (found.phase, found.failure_kind) == ("failed", kind), found
        assert lifecycle.watch(run, rpc, lambda: found) == lifecycle.STOPPED
        return rpc
    for start in range(1, RETRIES + 2):  # each start ends the same way before it is verified
        (tmp / state.STARTS).write_text(str(start))
        with (tmp / "log" / state.SERVER_LOG).open("ab") as log:
            log.write(marker(start) + LOADING + CRASH_LINES.get(kind, b""))
        if kind == "hung":
            found = judged(marker(start) + LOADING, alive=True, quiet=2000)
            assert found.hung, found
            acted = lifecycle.watch(run, rpc, lambda found=found: found)
        else:
            acted = lifecycle.ended(run, rpc, restart=True)
        assert acted == (lifecycle.STOPPED if start > RETRIES else lifecycle.RESTARTED), (kind, start)
    return rpc


def test_every_kind_of_the_table_has_a_case_here() -> None:
    cases = set(JUDGED) | set(CRASH_LINES) | {"hung", "refused"}
    assert cases == set(FAILURE), cases ^ set(FAILURE)


@pytest.mark.parametrize("kind", [f.kind for f in FAILURES if f.kind != "refused"])
def test_each_kind_ends_the_container_with_its_own_code(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    row = FAILURE[kind]
    give_up(kind, tmp_path)
    failed = state.read_failed(tmp_path)
    assert failed is not None and (failed["kind"], failed["code"]) == (kind, row.exit_code), failed
    assert failed["start"] == state.starts_made(tmp_path)  # the latest start's: readers take it
    if row.restart:
        assert "GLM5_START_RETRIES=1" in failed["reason"]
    # entrypoint.sh's exit code once stopped
    monkeypatch.setenv("GLM5_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GLM5_LOG_DIR", str(tmp_path / "log"))
    capsys.readouterr()
    assert launch.failed_code() == 0 and capsys.readouterr().out.strip() == str(row.exit_code) != "0"
    # the exporter: the recorded exit code, over what the log shows
    recorded = judged(b"", failed=probe.recorded_of(failed))
    codes = [
        s.value
        for f in exporter.metrics(recorded, 1800, 0)
        if f.name == "glm5_start_failure_code"
        for s in f.samples
    ]
    assert codes == [row.exit_code] and recorded.failure_kind == kind


@pytest.mark.parametrize("kind", sorted(JUDGED))
def test_before_it_is_recorded_the_exporter_exports_the_kinds_code(kind: str) -> None:
    found = JUDGED[kind]()
    codes = [
        s.value
        for f in exporter.metrics(found, 1800, 0)
        if f.name == "glm5_start_failure_code"
        for s in f.samples
    ]
    assert codes == [FAILURE[kind].exported] and codes[0] > 200


def test_a_crash_after_the_start_was_verified_restarts_and_counts_nothing(tmp_path: Path) -> None:
    run, rpc = values(tmp_path), FakeSupervisor()
    (tmp_path / state.STARTS).write_text("1")
    (tmp_path / "log" / state.SERVER_LOG).write_bytes(marker(1) + READY_LOG + CRASH_LINES["sigquit"])
    state.write_verified(tmp_path, {"start": 1, "passed": True})
    for _ in range(RETRIES + 2):
        assert lifecycle.ended(run, rpc, restart=True) == lifecycle.RESTARTED
    assert not (tmp_path / "log" / state.HANGS).exists() and state.read_failed(tmp_path) is None
    assert rpc.calls == ["start sglang"] * (RETRIES + 2)


def test_a_verified_start_whose_lines_left_the_tail_is_still_verified_when_it_crashes(tmp_path: Path) -> None:
    """Hours of serving push the start's own lines (its ready line) out of the 4 MiB tail: what the tick kept of it
    (capture.json) says it was ready, so its crash is restarted without counting, and it ends a row of unverified
    ends (hangs.json) even when no tick saw it ready."""
    run, rpc = values(tmp_path), FakeSupervisor()
    (tmp_path / state.STARTS).write_text("2")
    launch = start_record.write(tmp_path, start=2, log_dir=str(tmp_path / "log"))
    log = tmp_path / "log" / state.SERVER_LOG
    log.write_bytes(marker(2) + READY_LOG)
    kept = probe.worth_keeping(probe.merged(logscan.scan(log.read_bytes()), launch, None))
    assert kept is not None
    state.write_capture(tmp_path, kept)  # as the tick keeps it
    state.write_verified(tmp_path, {"start": 2, "passed": True})
    state.count_unverified_end(tmp_path / "log", 1, "sigquit", "start #1 crashed")  # the row before it
    batch = b"[2026-12-03 10:00:00 TP0] Decode batch, #running-req: 3, #token: 9000, cuda graph: True\n"
    with log.open("ab") as fh:
        fh.write(batch * (5 * 2**20 // len(batch)) + CRASH_LINES["sigquit"])
    assert logscan.scan(logscan.read_tail(log)).start is None  # the tail alone knows nothing of start #2
    assert lifecycle.ended(run, rpc) == lifecycle.RESTARTED and rpc.calls == ["start sglang"]
    assert not (tmp_path / "log" / state.HANGS).exists() and state.read_failed(tmp_path) is None


def test_the_tick_never_acts_on_an_earlier_starts_log(tmp_path: Path) -> None:
    """Just after a start began, before its marker reaches the log, the tail is the last start's: a verdict of it is
    not the latest start's, so nothing is recorded or restarted on it."""
    (tmp_path / state.STARTS).write_text("2")
    old = JUDGED["decode_short"]()
    assert old.start == 1 and old.phase == "failed"
    assert lifecycle.watch(values(tmp_path), FakeSupervisor(), lambda: old) is None
    assert state.read_failed(tmp_path) is None
