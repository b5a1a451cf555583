"""A crash during the verification (the realbox audit's N1, ../shared/research/turn5-audits/realbox-audit-2026-12-04.md):
the verification is a start's first real traffic, the likeliest moment for a runtime fault. When the server dies then,
supervisord restarts it as the next start, which on the box reloads the weights for minutes. The gate drops the run
of a start that is no longer current and verifies the next start on its own; the crash of a start that was never
verified is counted like a hang (hangs.json), and past GLM5_START_RETRIES the kit gives up with exit code 70, naming
the crash. The real entrypoint.sh and supervisord, the server double's crash-verifying modes (SGLang 0.5.23's own
crash lines) and its reload (SGLANG_DOUBLE_RELOAD_SECONDS)."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from configuration import state
from conftest import healthcheck_json
from helpers.container import Container, start
from test_lifecycle import stop
from test_verify_gate import SLOW_ENOUGH_TO_SEE

pytestmark = pytest.mark.boots

# The box's reload of 410 GB (7-40 min), scaled down: long against the kit's own steps here (a start of the double
# is ready in about 2 s, the verification set takes about 6 s at SLOW_ENOUGH_TO_SEE), short for a test. Today's gate
# spends 2 runs x 19 sequential asks (17 items of batch 1, the batch-8 and batch-32 groups) x 10 s (3 asks 5 s apart,
# verify/run.py TRANSPORT_ATTEMPTS, TRANSPORT_PAUSE) = about 380 s on a port that refuses, so it is still asking
# start #1's items when start #2 comes up.
RELOAD_SECONDS = 15
# supervisord restarts nothing itself (startsecs=0, autorestart=false): every exit of the server is EXITED, and the
# lifecycle listener decides; the crash comes after the double's 5 s of SGLang's crash diagnostics.


def snapshot(c: Container) -> dict[str, Any]:
    """The healthcheck's JSON now, with hangs.json as it stands."""
    _code, found = healthcheck_json(c.target.env)
    return found | {"hangs": state.read_json(c.tmp / "log" / state.HANGS)}


def polled(c: Container, done: Any, timeout: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Poll until done(JSON) or the timeout: the last JSON and every poll's (start, phase, hangs) on the way."""
    seen: list[dict[str, Any]] = []
    began = deadline = time.monotonic()
    deadline += timeout
    found: dict[str, Any] = {}
    while time.monotonic() < deadline:
        found = snapshot(c)
        hangs = (found["hangs"] or {}).get("starts")
        t = round(time.monotonic() - began, 1)
        seen.append({"t": t, "start": found["start"], "phase": found["phase"], "hangs": hangs})
        if done(found):
            return found, seen
        time.sleep(0.3)
    return found, seen


def changes(seen: list[dict[str, Any]]) -> list[str]:
    """The polls, shortened to their changes: `t start:phase hangs`."""
    out, last = [], None
    for poll in seen:
        now = (poll["start"], poll["phase"], poll["hangs"])
        if now != last:
            out.append(f"{poll['t']}s #{poll['start']}:{poll['phase']} hangs={poll['hangs']}")
            last = now
    return out


SUPERVISORD = re.compile(
    r"(?:spawned: 'sglang'|success: sglang |exited: sglang |gave up: sglang |\w+: sglang entered)"
)


def supervisord_saw(c: Container) -> list[str]:
    """supervisord's lines about the server program, in order (docker logs)."""
    said = (SUPERVISORD.search(line) for line in c.entrypoint_output.read_text().splitlines())
    lines = [found.string[found.start() :] for found in said if found]
    return [line for i, line in enumerate(lines) if i == 0 or line != lines[i - 1]]  # each is printed twice


def story(c: Container, seen: list[dict[str, Any]]) -> str:
    """What a failed assertion shows: the polls' changes, supervisord's lines on the server, docker logs' tail (less
    the access log of the chat requests)."""
    said = c.entrypoint_output.read_text().splitlines()
    tail = "\n".join(line for line in said if "POST /v1/chat/completions" not in line)[-2500:]
    return f"{changes(seen)}\nsupervisord: {supervisord_saw(c)}\n{tail}"


def crashed_late(c: Container) -> bool:
    """Start #1 ran (RUNNING) before it exited, by itself: an EXITED event, the listener's to decide on."""
    said = supervisord_saw(c)
    running = next((i for i, s in enumerate(said) if s.startswith("success: sglang")), None)
    exited = next((i for i, s in enumerate(said) if s.startswith("exited: sglang")), None)
    return running is not None and exited is not None and running < exited


def exporter_ready(c: Container) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{c.exporter_port}/ready", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_a_crash_during_the_verification_restarts_and_the_next_start_is_verified_on_its_own(
    tmp_path: Path, containers: list[Container]
) -> None:
    c = start(
        tmp_path,
        "crash-verifying",
        GLM5_VERIFY="enforce",
        GLM5_CACHE_DIR=str(tmp_path / "cache"),
        GLM5_START_RETRIES="2",
        SGLANG_DOUBLE_SERVE_SECONDS=SLOW_ENOUGH_TO_SEE,
        SGLANG_DOUBLE_RELOAD_SECONDS=str(RELOAD_SECONDS),
    )
    containers.append(c)
    bound = RELOAD_SECONDS + 40
    found, seen = polled(c, lambda f: f["start"] == 2 and f["phase"] in ("ready", "failed"), bound)
    after = [p for p in seen if (p["start"] or 0) >= 2]
    shown = story(c, seen)
    assert "Subprocess scheduler_0" in c.output(), f"start #1 never crashed\n{shown}"
    assert crashed_late(c), f"start #1 never ran, or did not exit by itself\n{shown}"
    assert after, f"start #2 never began in {bound} s\n{shown}"
    assert all(p["phase"] != "failed" for p in after), (
        f"start #2 read failed (an earlier start's record)\n{shown}"
    )
    assert found["start"] == 2 and found["phase"] == "ready", f"start #2 not ready in {bound} s\n{shown}"
    assert found["verification"] and found["verification"]["passed"], (found["verification"], shown)
    verified = state.read_json(tmp_path / "run" / state.VERIFIED)
    assert verified is not None and verified["start"] == 2 and verified["passed"], verified
    assert not (tmp_path / "run" / state.FAILED).exists(), (tmp_path / "run" / state.FAILED).read_text()
    assert exporter_ready(c) == 200
    # The crash of a start never verified counts like a hang (removed again once a start is ready).
    assert any(p["hangs"] == [1] for p in after), f"hangs.json never listed start 1\n{shown}"
    # Start #1's run was dropped, not judged by what start #2 answered on the same port.
    gate_said = c.entrypoint_output.read_text()
    assert "start #1: verified" not in gate_said, f"the gate called start #1 verified\n{shown}"


def test_crashes_repeated_before_any_start_is_verified_end_failed_with_the_cause_named(
    tmp_path: Path, containers: list[Container]
) -> None:
    c = start(
        tmp_path,
        "crash-verifying-always",
        GLM5_VERIFY="enforce",
        GLM5_CACHE_DIR=str(tmp_path / "cache"),
        GLM5_START_RETRIES="1",
        SGLANG_DOUBLE_SERVE_SECONDS=SLOW_ENOUGH_TO_SEE,
        SGLANG_DOUBLE_RELOAD_SECONDS="5",
    )
    containers.append(c)
    bound = 60
    found, seen = polled(c, lambda f: f["phase"] == "failed" and f.get("failed_code") is not None, bound)
    shown = story(c, seen)
    assert crashed_late(c), f"start #1 never ran, or did not exit by itself\n{shown}"
    assert found["phase"] == "failed", (
        f"not failed in {bound} s: {found['phase']}: {found['reason']}\n{shown}"
    )
    assert "ready" not in {p["phase"] for p in seen}, shown
    assert found["failed_code"] == 70, (found["failed_code"], found["reason"])
    assert "crash" in found["reason"], found["reason"]
    assert "GLM5_START_RETRIES" in found["reason"], found["reason"]
    recorded = json.loads((tmp_path / "run" / state.FAILED).read_text())
    assert recorded["code"] == 70, recorded
    assert stop(c) == 70
