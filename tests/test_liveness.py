"""Readiness that does not flap and liveness that catches hangs, against the server double's model of SGLang
0.5.23's /health and /ready (per-step answers, the 20 s UnHealthy latch; tests/doubles/sglang_server_double.py)."""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from configuration import state
from conftest import ROOT, healthcheck_json
from helpers import start_record
from helpers.container import Container, start

pytestmark = pytest.mark.boots  # boots processes or runs real tools: not in ci/test --fast

HEALTHCHECK = ROOT / "healthcheck" / "healthcheck"


def probe(c: Container, *args: str) -> tuple[int, dict[str, Any]]:
    return healthcheck_json(c.target.env, *args)


def status(c: Container, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{c.port}{path}", timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_a_long_prefill_step_keeps_the_server_ready(tmp_path: Path, containers: list[Container]) -> None:
    """Forward steps of 3 s: /health answers after the step (plus its 1 s poll), well inside the probe's wait."""
    c = start(tmp_path, "long-prefill", SGLANG_DOUBLE_STEP="3")
    containers.append(c)
    c.wait_healthy()
    for _ in range(3):
        began = time.monotonic()
        code, found = probe(c)
        assert (code, found["phase"], found["http"]) == (0, "ready", 200), found
        assert time.monotonic() - began >= 1  # /health waited for a step to end
        assert probe(c, "--live")[0] == 0
    assert status(c, "/ready") == 200


def test_a_stuck_scheduler_fails_readiness_then_liveness(tmp_path: Path, containers: list[Container]) -> None:
    # The double sticks STUCK_AFTER seconds after its ready line; the wait must see it healthy before that, so no
    # verification runs in between (under load in CI it outlasted 4 s: the wait's own /health then latched it).
    c = start(
        tmp_path,
        "stuck",
        SGLANG_DOUBLE_STUCK_AFTER="6",
        SGLANG_HEALTH_CHECK_TIMEOUT="2",
        GLM5_HEALTH_TIMEOUT="4",
        GLM5_VERIFY="off",
    )
    containers.append(c)
    c.wait_healthy()
    time.sleep(6)
    assert status(c, "/ready") == 200  # nothing has asked /health yet: /ready alone cannot see the hang
    code, found = probe(c)
    assert code == 1 and found["phase"] == "ready" and found["http"] == 503, found
    assert found["reason"] == "/health answered 503: not serving now"
    assert (
        "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds"
        in c.output()
    )
    assert status(c, "/ready") == 503  # latched UnHealthy for every caller
    assert probe(c, "--live")[0] == 1  # Kubernetes restarts it after liveness_failures of these in a row
    # A stop now is not drained (0.5.23's sigterm_watchdog force-exits an unhealthy server).
    os.kill(c.target.proc.pid, signal.SIGTERM)
    c.target.proc.wait(timeout=30)
    assert "Signal SIGTERM received while health check failed. Force exiting." in c.output()


def test_a_start_with_no_log_progress_is_a_hang(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path, "hang-loading")
    containers.append(c)
    deadline = time.monotonic() + 30
    while probe(c)[1]["phase"] != "loading":
        assert time.monotonic() < deadline, c.output()
        time.sleep(0.2)
    assert probe(c, "--live")[0] == 0  # a slow start is never a liveness failure by itself
    assert probe(c, "--started")[0] == 1  # and not started yet
    time.sleep(2.5)
    code, found = probe(c, "--stall-seconds", "2")
    assert code == 1 and found["phase"] == "failed", found
    assert found["reason"].startswith("no server log output for ") and "while loading" in found["reason"]
    assert probe(c, "--live", "--stall-seconds", "2")[0] == 1
    assert probe(c, "--started", "--stall-seconds", "2")[0] == 0  # over: liveness restarts it from here
    assert probe(c, "--live")[0] == 0  # the default stall bound (30 min) is far away


def test_the_lifecycle_listener_is_restarted_however_often_it_ends_and_watched(
    tmp_path: Path, containers: list[Container]
) -> None:
    """Issue 52: with supervisord's defaults, four quick deaths of the lifecycle listener (the only restarter and
    recorder) made it FATAL for the container's life, while liveness passed. Now supervisord restarts it each time,
    and liveness fails once it has been silent past state.WATCH_SILENT_SECONDS while a start runs."""
    c = start(tmp_path, GLM5_VERIFY="off")
    containers.append(c)
    c.wait_healthy()
    state_dir = Path(c.target.env["GLM5_STATE_DIR"])
    ctl = [str(ROOT / ".venv" / "bin" / "supervisorctl"), "-s", f"unix://{state_dir / state.SOCKET}"]
    killed: set[int] = set()
    deadline = time.monotonic() + 30
    while len(killed) < 6:  # more than startretries' default 3, each as soon as it is spawned (within 1 s)
        shown = subprocess.run([*ctl, "status", "lifecycle"], capture_output=True, text=True).stdout
        assert "FATAL" not in shown and "BACKOFF" not in shown, shown
        assert time.monotonic() < deadline, f"restarted {len(killed)} times: {shown}"
        found = re.search(r"pid (\d+),", shown)
        if found and int(found.group(1)) not in killed:
            killed.add(int(found.group(1)))
            os.kill(int(found.group(1)), signal.SIGKILL)
        time.sleep(0.05)
    wait_for_running = time.monotonic() + 10
    while (
        "RUNNING" not in subprocess.run([*ctl, "status", "lifecycle"], capture_output=True, text=True).stdout
    ):
        assert time.monotonic() < wait_for_running
        time.sleep(0.2)
    assert probe(c, "--live")[0] == 0
    # a listener silent for longer than the bound (its last tick moved back): liveness fails, naming it
    now = datetime.datetime.now(datetime.UTC)
    subprocess.run([*ctl, "stop", "lifecycle"], capture_output=True, text=True, check=True)
    state.write_watched(state_dir, now - datetime.timedelta(seconds=state.WATCH_SILENT_SECONDS + 5))
    done = subprocess.run([str(HEALTHCHECK), "--live"], env=c.target.env, capture_output=True, text=True)
    assert done.returncode == 1 and "the lifecycle listener has not ticked for" in done.stderr, done.stderr


def test_a_start_without_a_tick_yet_is_live_until_the_bound() -> None:
    """Before the listener's first tick the start's own time stands in, so a fresh start is not failed."""
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    with tempfile.TemporaryDirectory() as folder:
        start_record.write(folder, start=1, started_at=now.isoformat(timespec="seconds"))
        assert state.unwatched(folder, now + datetime.timedelta(seconds=30)) is None
        assert "has not ticked for 61 s" in str(state.unwatched(folder, now + datetime.timedelta(seconds=61)))
        state.write_watched(folder, now + datetime.timedelta(seconds=55))
        assert state.unwatched(folder, now + datetime.timedelta(seconds=61)) is None
