"""The verdict stays live to the last line of the log: a start whose own lines have left the probe's tail window
(or a rotation) is judged by what was remembered of it (capture.json) with the tail's new events merged in, and a
stop recorded by launch --serve (stopped.json) reads draining at once. Pure steps, no processes."""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from configuration import state
from configuration.state import MARKER_TEXT
from conftest import ROOT, healthcheck_json
from healthcheck import logscan, phase, probe
from healthcheck.verdict import Phase, Stop, Verdict
from helpers import start_record
from helpers.container import Container, start
from helpers.judging import decided, judged, observation
from monitoring import exporter

LOGS = ROOT / "tests" / "fixtures" / "logs"
START = 4
LAUNCH = start_record.record(start=START, decode_expected=52, prefill_expected=58)
MARKER = (
    b"===== glm5-serve: server start #4 at 2026-12-03T09:00:00+00:00 pid 7: decode graphs expected 52, "
    b"prefill 58 =====\n"
)
# 0.5.23 lines: the decode batch line (scheduler_components/metrics_reporter.py, as tests/fixtures/logs/real/ and
# ../shared/research/sglang-on-cpu/server-start-to-sigterm.log print it), the drain (tokenizer_manager.py
# SignalHandler.sigterm_handler) and its end (kill_process_tree), a scheduler's death (scheduler.py).
BATCH = (
    b"[2026-12-03 10:00:00 TP0] Decode batch, #running-req: 3, #token: 9000, token usage: 0.02, cuda graph: True, "
    b"gen throughput (token/s): 150.00, #queue-req: 0\n"
)
DRAIN = b"[2026-12-03 10:05:00] SIGTERM received. signum=None frame=None. Draining requests and shutting down...\n"
DRAIN_END = (
    b"[2026-12-03 10:05:09] kill_process_tree called: parent_pid=28565, include_parent=False, pid=28565\n"
)
SCHEDULER_DIED = (
    b"[2026-12-03 10:05:00 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"
    b'  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 3005, in run\n'
    b"torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
)
REQUEST_FAILED = (
    b"[2026-12-03 10:05:00] Traceback (most recent call last):\n"
    b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
)


def kept() -> dict[str, Any]:
    """What the writer remembered while the start's own lines were still in the tail."""
    facts = probe.worth_keeping(
        logscan.scan(MARKER + (LOGS / "sglang-0.5.23-rendered-from-source.log").read_bytes())
    )
    assert facts is not None and facts["start"] == START
    return facts


def judge(
    tail: bytes, remembered: dict[str, Any] | None, stopped: Stop | None = None, alive: bool = True
) -> Verdict:
    return decided(probe.merged(logscan.scan(tail), LAUNCH, remembered), alive=alive, stopped=stopped)


def test_a_tail_past_the_window_is_the_remembered_start() -> None:
    found = judge(BATCH * 1000, kept())
    assert (found.phase, found.start, found.captured.decode) == ("ready", START, 52)


def test_a_drain_after_the_window_reads_draining() -> None:
    found = judge(BATCH * 1000 + DRAIN + BATCH * 10, kept())
    assert found.phase == "draining", found


def test_a_server_process_that_dies_after_the_window_reads_failed() -> None:
    found = judge(BATCH * 1000 + SCHEDULER_DIED + BATCH, kept())
    assert (found.phase, found.failure_kind) == ("failed", "process_exception"), found
    assert "illegal memory access" in str(found.reason) and "while serving" in str(found.reason)


def test_a_request_that_fails_after_the_window_is_not_the_servers_end() -> None:
    """A traceback or an out-of-memory line after the ready line belongs to a request, as it does in the window."""
    assert judge(BATCH * 10 + REQUEST_FAILED + BATCH, kept()).phase == "ready"


def test_sglangs_own_end_of_a_drain_is_a_stop_not_a_failure() -> None:
    assert judge(BATCH + DRAIN + BATCH + DRAIN_END, kept()).phase == "draining"
    remembered = probe.worth_keeping(probe.merged(logscan.scan(BATCH + DRAIN), LAUNCH, kept()))
    assert judge(BATCH + DRAIN_END, remembered).phase == "draining"  # the drain line itself has left too
    # The same line without a drain: the server's processes were killed.
    assert judge(BATCH + DRAIN_END, kept()).failure_kind == "killed"
    in_window = logscan.scan(
        MARKER + (LOGS / "sglang-0.5.23-rendered-from-source.log").read_bytes() + DRAIN + DRAIN_END
    )
    assert in_window.failure is None and "draining" in in_window.seen


def test_what_is_remembered_keeps_the_late_events_once_they_leave_the_window() -> None:
    for tail, expected in ((BATCH + DRAIN, "draining"), (BATCH + SCHEDULER_DIED, "failed")):
        remembered = probe.worth_keeping(probe.merged(logscan.scan(tail), LAUNCH, kept()))
        assert remembered is not None
        assert judge(BATCH * 1000, remembered).phase == expected  # the event's line is gone from the tail


def test_another_starts_facts_are_never_used() -> None:
    other = kept() | {"start": START - 1}
    found = judge(BATCH * 10 + DRAIN, other)
    assert found.start is None and found.phase == "starting"


def test_a_stopped_start_that_reached_ready_reads_draining_before_any_log_line() -> None:
    stop = Stop("SIGTERM", "2026-12-03T10:05:00+00:00")
    found = judge(BATCH, kept(), stop)
    assert found.phase == "draining" and str(found.reason).startswith(
        "stopped (SIGTERM at 2026-12-03T10:05:00"
    )
    # ... also while it was verifying (the gate turns ready into verifying; draining stays draining).
    scan = probe.merged(logscan.scan(BATCH), LAUNCH, kept())
    assert judged(scan, alive=True, stopped=stop).phase == "draining"
    assert judged(scan, alive=True).phase == "verifying"
    # Its processes gone or killed after the stop are the stop's doing.
    assert judge(BATCH + DRAIN_END, kept(), stop, alive=False).phase == "draining"


def test_a_start_stopped_before_ready_reads_as_it_was_stopping() -> None:
    stop = Stop("SIGTERM", "2026-12-03T10:05:00+00:00")
    loading = logscan.scan(MARKER + b"[2026-12-03 09:01:00 TP0] Load weight begin. avail mem=94.62 GB\n")
    found = decided(loading, alive=False, stopped=stop)
    assert (
        found.phase == "loading" and "stopped (SIGTERM" in str(found.reason) and "ends" in str(found.reason)
    )
    assert phase.status_line(found, None).startswith("loading weights (stopped (SIGTERM")


# 0.5.23's own lines when a scheduler dies after ready (utils/watchdog.py:216-221, then the SIGQUIT handler of
# managers/tokenizer_manager.py:4072-4074); kill_process_tree follows only after a 5 s sleep, and a 60 s core-dump
# wait where SGLANG_CUDA_COREDUMP is set (tokenizer_manager.py:3481-3502).
SCHEDULER_CRASHED = (
    b"[2026-12-03 10:05:00] Subprocess scheduler_0 (pid=28601) crashed with exit code -9. Triggering SIGQUIT for "
    b"cleanup...\n"
)
SIGQUIT_RECEIVED = (
    b"[2026-12-03 10:05:00] SIGQUIT received. signum=None, frame=None. It usually means one child failed.\n"
)


@pytest.mark.parametrize("line", [SCHEDULER_CRASHED, SIGQUIT_RECEIVED], ids=["watchdog", "sigquit-handler"])
def test_a_crash_line_of_the_running_server_reads_not_ready_at_once(line: bytes) -> None:
    """Before kill_process_tree: the replica leaves every rotation at its first crash line, in the window or past it."""
    in_window = MARKER + (LOGS / "sglang-0.5.23-rendered-from-source.log").read_bytes() + BATCH + line
    for found in (decided(in_window, alive=True, http=200), judge(BATCH * 1000 + line + BATCH, kept())):
        assert (found.phase, found.failure_kind) == ("failed", "sigquit"), found
        assert "a server subprocess failed (" in str(found.reason) and "while serving" in str(found.reason)


def test_every_phase_has_a_status_line_of_its_own() -> None:
    """The one line for people names the phase the JSON names: autotuning too (it printed `starting` once)."""
    base = judge(BATCH, kept())
    lines = {p: phase.status_line(base._replace(phase=p, reason=None), None) for p in Phase}
    assert set(phase.STATUS) == set(Phase) and len(set(lines.values())) == len(Phase), lines
    autotune = MARKER + b"[2026-12-03 09:02:05 TP0] Running FlashInfer autotune with cache: /cache/x.json\n"
    found = decided(autotune, quiet=10)
    assert found.phase == "autotuning" and phase.status_line(found, None).startswith("autotuning FlashInfer")


# Through the kit's own container start (entrypoint.sh, the real supervisord, the server double): the exporter's
# /ready (what the gateway's rotation asks) and the healthcheck, once the log has grown past the probe's window.

GROWTH = 4_500_000  # bytes of batch lines: past logscan.TAIL_BYTES (4 MiB), as hours of serving write


def grown(c: Container) -> None:
    """Wait until the one writer (the lifecycle tick, every 5 s) has kept the start's facts, its ready line among
    them, then grow the log. (Kept once the capture was done, a tick may not yet have kept the ready line: on a loaded
    machine the log then lost it to the growth, and /ready read warming_up.)"""
    kept = c.tmp / "run" / state.CAPTURE
    deadline = time.monotonic() + 30
    while (found := state.read_json(kept) or {}).get("start") != 1 or "ready" not in found.get("seen", []):
        assert time.monotonic() < deadline, f"capture.json never written\n{c.entrypoint_output.read_text()}"
        time.sleep(0.5)
    with c.log.open("ab") as fh:
        fh.write(BATCH * (GROWTH // len(BATCH) + 1))
    assert MARKER_TEXT.encode() not in logscan.read_tail(c.log)


def readiness(c: Container) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{c.exporter_port}/ready", timeout=10) as r:
            return int(r.status), json.loads(r.read())["phase"]
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["phase"]


def eventually(c: Container, want: tuple[int, str], within: float = 8) -> None:
    deadline = time.monotonic() + within
    while (got := readiness(c)) != want:
        assert time.monotonic() < deadline, f"/ready said {got}, not {want}"
        time.sleep(0.2)


@pytest.mark.boots
def test_a_replica_past_the_window_reads_draining_within_seconds_of_sigterm(
    tmp_path: Path, containers: list[Container]
) -> None:
    c = start(tmp_path, "slow-drain", GLM5_DRAIN_SECONDS="20")
    containers.append(c)
    c.wait_healthy()
    grown(c)
    assert readiness(c) == (200, "ready")
    assert healthcheck_json(c.target.env)[1]["phase"] == "ready"
    c.proc.send_signal(signal.SIGTERM)
    eventually(c, (503, "draining"))
    code, found = healthcheck_json(c.target.env)
    assert (code, found["phase"]) == (1, "draining"), found
    assert (state.read_json(c.tmp / "run" / state.STOPPED) or {}).get(
        "start"
    ) == 1  # launch recorded the stop
    assert c.proc.wait(timeout=40) == 0


@pytest.mark.boots
def test_a_replica_past_the_window_reads_failed_after_a_process_exception_and_keeps_it(
    tmp_path: Path, containers: list[Container]
) -> None:
    c = start(tmp_path)
    containers.append(c)
    c.wait_healthy()
    grown(c)
    with c.log.open("ab") as fh:
        fh.write(SCHEDULER_DIED)
    eventually(c, (503, "failed"))
    code, found = healthcheck_json(c.target.env, "--no-http")
    assert (code, found["phase"], found["failure_kind"]) == (1, "failed", "process_exception"), found
    kept = c.tmp / "run" / state.CAPTURE  # the writer keeps the event, so it outlives the window too
    deadline = time.monotonic() + 15
    while (state.read_json(kept) or {}).get("failure_event") != "process_exception":
        assert time.monotonic() < deadline, state.read_json(kept)
        time.sleep(0.5)
    with c.log.open("ab") as fh:
        fh.write(BATCH * (GROWTH // len(BATCH) + 1))
    assert readiness(c) == (503, "failed")


@pytest.mark.boots
def test_a_stuck_replica_past_the_window_fails_the_healthcheck_not_the_exporters_ready(
    tmp_path: Path, containers: list[Container]
) -> None:
    """As in the window (test_liveness): /health times out on a stuck scheduler, so the healthcheck that asks it
    fails; the exporter's /ready reads the log alone and cannot see the hang until SGLang latches UnHealthy."""
    c = start(
        tmp_path,
        "stuck",
        SGLANG_DOUBLE_STUCK_AFTER="25",
        SGLANG_HEALTH_CHECK_TIMEOUT="2",
        GLM5_HEALTH_TIMEOUT="4",
    )
    containers.append(c)
    c.wait_healthy()
    grown(c)
    assert readiness(c) == (200, "ready")
    deadline = time.monotonic() + 60
    while (found := healthcheck_json(c.target.env))[0] == 0:
        assert time.monotonic() < deadline, "the stuck scheduler never failed the healthcheck"
        time.sleep(1)
    assert (found[1]["phase"], found[1]["http"]) == ("ready", 503), found
    assert found[1]["decode_captured"] == 52  # judged as the remembered start, not a foreign log


# One vocabulary: healthcheck/verdict.py's Phase is the one declaration; every other place that names phases is made
# from it or held to it here.

PHASE_LABEL = re.compile(r'phase="(\w+)"')


def test_the_exporter_offers_every_phase_and_no_other() -> None:
    found = phase.judge(observation(logscan.Scan(), verify="off"))
    (family,) = [f for f in exporter.metrics(found, 1800, 0) if f.name == "glm5_start_phase"]
    assert [s.labels["phase"] for s in family.samples] == [str(p) for p in Phase]


def test_the_readme_dashboard_and_alerts_name_the_declared_phases() -> None:
    readme = (ROOT / "README.md").read_text()
    table = readme.split("<!-- ci/render: phases -->", 1)[1].split("<!-- ci/render: end phases -->", 1)[0]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == [str(p) for p in Phase]
    dashboard = json.loads((ROOT / "monitoring" / "grafana" / "dashboards" / "glm5.json").read_text())
    texts = [p.get("description", "") for p in dashboard["panels"] if "glm5_start_phase" in json.dumps(p)]
    assert texts and all(all(str(p) in t for p in Phase) for t in texts), texts
    for rules in ("monitoring/prometheus/alerts.yml", "k8s/components/monitoring/prometheusrule.yaml"):
        named = set(PHASE_LABEL.findall((ROOT / rules).read_text()))
        assert named and named <= {str(p) for p in Phase}, (rules, named - {str(p) for p in Phase})


def test_the_docstrings_point_at_the_declaration_instead_of_listing_phases() -> None:
    listing = re.compile(r"starting, loading, capturing")
    for module in (
        "healthcheck/phase.py",
        "healthcheck/probe.py",
        "monitoring/exporter.py",
        "monitoring/dashboard.py",
    ):
        assert not listing.search((ROOT / module).read_text()), module
