"""supervisord event listener, the one place that decides what follows what under the one supervisor, and from the
start on the one recorder of a start's failure (failed.json, configuration/state.py; preflight records only its own
refusal, before the first start):
- preflight passed, so start the server (over supervisord's XML-RPC), unless this container's earlier runs already
  ended more starts in a row before they were verified than GLM5_START_RETRIES allows (hangs.json, kept beside the log:
  compose restarts a container with a fresh state tmpfs); then it gives up at once, loading nothing. preflight died
  without recording why, so record it.
- The server ended by itself (supervisord's EXITED): a start that was verified (ready) is restarted; one that ended
  before it was verified (a crash while loading, capturing or answering the verification set) is counted across
  starts (hangs.json, whatever its age) and restarted, GLM5_START_RETRIES times in a row at most; then the kit gives
  up with the crash's kind (exit code 70). supervisord never restarts the server itself (autorestart=false and
  startsecs=0: no BACKOFF, whose retries would ignore autorestart), so no start can begin behind this decision.
- Each TICK_5, the healthcheck's own verdict on the current start (healthcheck/probe.py, from the log and the state
  folder, the tail read once): a start judged failed for a reason a restart cannot clear (a short capture, wrong or
  inconclusive answers: common/report.py FAILURES, `restart` False) is recorded with its kind and exit code; a start
  with no log output for GLM5_STALL_SECONDS is hung and restarted, counted like a crash (exit code 73 past the
  retries). It is also the one writer of capture.json (healthcheck/probe.py remember).
After giving up it stays up showing why, supervisord and the exporter running (GLM5_ON_FAILURE=wait), or shuts
supervisord down (exit); entrypoint.sh then exits with the recorded code. Docker never restarts an unhealthy container
(restart policies act on an exit), so on compose this is what clears a hang; on Kubernetes it acts first and
liveness, which fails on the same hang, is the backstop (README: Restarts). Speaks the listener protocol on stdout
(supervisor.childutils); logs go to stderr."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import xmlrpc.client
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from supervisor import childutils

from common.report import FAILED, FAILURE, Log, Problems
from configuration import state
from healthcheck import logscan, phase, probe
from healthcheck.verdict import Phase, Verdict

PREFLIGHT, SERVER = "preflight", "sglang"  # the program names in supervisord.conf
LOG = Log("glm5-serve")


class Supervisor(Protocol):
    """What this listener asks of supervisord's XML-RPC interface (its `supervisor` namespace, its names)."""

    def startProcess(self, name: str, wait: bool) -> bool: ...
    def stopProcess(self, name: str, wait: bool) -> bool: ...
    def getProcessInfo(self, name: str) -> dict[str, Any]: ...
    def shutdown(self) -> bool: ...


def record(state_dir: str | Path, start: int, kind: str, reason: str, code: int | None = None) -> int:
    """The kit gives up on start `start`: failed.json with the kind's exit code (common/report.py FAILURES; a
    refusal carries preflight's own), the one write of a failure after preflight. Returns the code."""
    code = FAILURE[kind].exit_code if code is None else code
    state.write_failed(state_dir, start, kind, code, reason)
    LOG.error(f"start #{start} failed ({kind}, exit code {code}): {reason}")
    return code


def given_up(state_dir: str | Path) -> bool:
    """A failure is recorded for the latest start (or for the next, refused): nothing is started or restarted."""
    return state.current_failure(state.read_failed(state_dir), state.starts_made(state_dir)) is not None


def give_up(code: int, values: Mapping[str, Any], rpc: Supervisor) -> None:
    if values["on_failure"] == "exit":
        LOG.error(f"failed (exit code {code}): stopping the container (GLM5_ON_FAILURE=exit)")
        rpc.shutdown()
        return
    LOG.error(
        f"failed (exit code {code}): staying up to show why (healthcheck --status, the exporter, "
        f"{state.path(values['state_dir'], state.FAILED)}); fix the cause, then `docker compose up -d glm5` (it "
        "re-reads glm5.env; --force-recreate after a fix elsewhere: `restart` keeps the count of crashed and hung "
        "starts) or delete the pod (GLM5_ON_FAILURE=exit exits instead)"
    )


def tail(log_dir: str | Path) -> bytes:
    try:
        return logscan.read_tail(Path(log_dir) / state.SERVER_LOG)
    except FileNotFoundError:
        return b""


def was_verified(scan: logscan.Scan, verified: Mapping[str, Any] | None, verify: str) -> bool:
    """The start reached ready by the healthcheck's rule (GLM5_VERIFY): its ready line, and under enforce or report
    its own verification done (passed, under enforce)."""
    if "ready" not in scan.seen:
        return False
    if verify == "off":
        return True
    mine = verified is not None and verified.get("start") == scan.start
    return mine and (verify == "report" or bool(verified and verified.get("passed")))


def ended_start(state_dir: str | Path, log_dir: str | Path) -> logscan.Scan:
    """The facts of the start whose server just ended: the log's tail merged with what was kept of it (capture.json:
    a serving start's own lines leave the tail within hours)."""
    return probe.merged(
        logscan.scan(tail(log_dir)), state.read_launch(state_dir), state.read_capture(state_dir)
    )


def ended(values: Mapping[str, Any], rpc: Supervisor, restart: bool = True) -> str:
    """The server of the latest start ended by itself (supervisord restarts nothing: `restart` says whether to start
    it again here). What followed: RESTARTED, STOPPED (given up) or "" (nothing to do)."""
    state_dir = values["state_dir"]
    if given_up(state_dir):
        return ""
    scan = ended_start(state_dir, values["log_dir"])
    launch = state.read_launch(state_dir)
    start = scan.start or (launch.start if launch else None) or state.starts_made(state_dir)
    mine = state.current_start(launch, start)
    if was_verified(scan, state.read_verified(state_dir), mine.verify if mine else values["verify"]):
        state.clear_hangs(values["log_dir"])  # a verified start ends the row, seen ready by a tick or not
    else:
        kind, why = phase.crash(scan)
        retries = int(values["start_retries"])
        began = scan.started_at or (mine.started_at if mine else None)
        count = state.count_unverified_end(values["log_dir"], start, kind, why, began)
        if count > retries:
            reason = (  # the cause first: a report cut short (ci/bench's table, an alert's summary) keeps it
                f"{why} ({count} starts in a row ended before they were verified, GLM5_START_RETRIES={retries}: the "
                "kit no longer restarts the server)"
            )
            code = record(state_dir, start, kind, reason)
            # supervisord may have given up on it already (FATAL)
            with contextlib.suppress(xmlrpc.client.Fault):
                rpc.stopProcess(SERVER, False)
            give_up(code, values, rpc)
            return STOPPED
        LOG.error(f"start #{start} ended before it was verified ({why}); {count} of {retries + 1} in a row")
    if restart:
        rpc.startProcess(SERVER, False)
    return RESTARTED


def start_first(values: Mapping[str, Any], rpc: Supervisor) -> None:
    """Preflight passed: the container's first start, unless the count of starts in a row that ended before they were
    verified (hangs.json, this container's, kept in the log folder across its restarts) is past GLM5_START_RETRIES
    already. Then the kit gave up on an earlier run of this container, and a restart policy (compose's `restart:
    unless-stopped` with GLM5_ON_FAILURE=exit) would load the weights again and again: it gives up at once instead,
    with the last one's kind."""
    row = state.read_unverified(values["log_dir"]) or {}
    retries, count = int(values["start_retries"]), len(row.get("starts", []))
    if count <= retries:
        rpc.startProcess(SERVER, False)
        return
    kind = row["kind"] if row.get("kind") in FAILURE else "exited"
    reason = (
        f"{row.get('last')} ({count} starts in a row ended before they were verified, GLM5_START_RETRIES={retries}, "
        f"counted across this container's restarts in {Path(values['log_dir']) / state.HANGS}: the kit starts no "
        "server; a new container counts afresh: `docker compose up -d --force-recreate glm5`, or delete the pod)"
    )
    state_dir = values["state_dir"]
    give_up(record(state_dir, state.starts_made(state_dir) + 1, kind, reason), values, rpc)


def on_event(name: str, event: Mapping[str, str], values: Mapping[str, Any], rpc: Supervisor) -> None:
    process = event.get("processname")
    state_dir = values["state_dir"]
    if name == "PROCESS_STATE_EXITED" and process == PREFLIGHT:
        if event.get("expected") == "1":
            start_first(values, rpc)
            return
        code = int(rpc.getProcessInfo(PREFLIGHT).get("exitstatus") or FAILED)
        # It died before it could say why (a traceback, a kill): its code, where to look.
        if not given_up(state_dir):
            refused = state.starts_made(state_dir) + 1
            record(
                state_dir,
                refused,
                "refused",
                f"preflight exited {code}; its lines are above in the log",
                code,
            )
        give_up(code, values, rpc)
    elif process == SERVER and name == "PROCESS_STATE_EXITED":
        ended(values, rpc)
    elif name == "PROCESS_STATE_FATAL" and process == SERVER and not given_up(state_dir):
        # Only a server program supervisord cannot spawn (startsecs=0: no exit is a BACKOFF), its retries spent.
        scan = ended_start(state_dir, values["log_dir"])
        kind, why = phase.crash(scan)
        reason = (
            f"{SERVER} went FATAL: it exited during start more than GLM5_START_RETRIES times; the last: {why}"
        )
        give_up(record(state_dir, scan.start or state.starts_made(state_dir), kind, reason), values, rpc)


RESTARTED, STOPPED = "restarted", "stopped"  # what watch and ended did


def watch(values: Mapping[str, Any], rpc: Supervisor, judge: Callable[[], Verdict | None]) -> str | None:
    """Act on the running server's verdict: a hung start is restarted (RESTARTED), counted with the starts that ended
    before they were verified (hangs.json), GLM5_START_RETRIES times in a row at most, then recorded with where it
    hung and the fix (exit code 73), stopped, and given up on (STOPPED); a start failed for a reason a restart cannot
    clear is recorded and given up on (STOPPED; the server keeps running, out of service, for a look); None: nothing
    to do. The code given up with is the one `record` decided. A start that reaches ready clears the count."""
    state_dir, retries = values["state_dir"], int(values["start_retries"])
    if given_up(state_dir) or rpc.getProcessInfo(SERVER).get("statename") not in ("STARTING", "RUNNING"):
        return None
    found = judge()
    if found is None or (found.start is not None and found.start < state.starts_made(state_dir)):
        return None  # an earlier start's log: the latest has begun and not printed its marker yet
    if found.phase is Phase.READY and (Path(values["log_dir"]) / state.HANGS).exists():
        state.clear_hangs(values["log_dir"])
    if found.phase is Phase.FAILED and not found.hung and found.failure_kind in FAILURE:
        if FAILURE[found.failure_kind].restart or found.start is None:
            return None  # a crash: its server ends, and `ended` decides (no marker: not a start of this kit)
        give_up(record(state_dir, found.start, found.failure_kind, str(found.reason)), values, rpc)
        return STOPPED
    if not found.hung:
        return None
    hangs = state.count_unverified_end(
        values["log_dir"], found.start, "hung", str(found.reason), found.started_at
    )
    if hangs > retries:
        reason = (
            f"{hangs} starts in a row ended before they were verified (GLM5_START_RETRIES={retries}), the last hung, "
            f"so the kit no longer restarts it; the last: {found.reason}"
        )
        start = found.start if found.start is not None else state.starts_made(state_dir)
        code = record(state_dir, start, "hung", reason)
        rpc.stopProcess(SERVER, True)
        give_up(code, values, rpc)
        return STOPPED
    LOG.error(
        f"{found.reason}: restarting the server ({hangs} of {retries + 1} starts in a row ended before they were "
        "verified; GLM5_STALL_SECONDS)"
    )
    rpc.stopProcess(SERVER, True)
    rpc.startProcess(SERVER, False)
    return RESTARTED


def keep(state_dir: str, data: bytes) -> None:
    """Remember the current start's facts (capture.json); a state this tick cannot read is logged, and the next tick
    tries again."""
    try:
        probe.remember(state_dir, data)
    except (OSError, ValueError, KeyError, TypeError, Problems) as err:
        LOG.warning(f"could not keep the start's facts in {state.CAPTURE}: {err}")


def tick(values: Mapping[str, Any], rpc: Supervisor) -> None:
    """TICK_5: say it watches (watched.json: liveness reads it), keep the start's facts, then act on its verdict
    (watch, which gives up itself with the code it recorded), the log's tail read once for both."""
    try:
        state.write_watched(values["state_dir"], datetime.datetime.now(datetime.UTC))
    except OSError as err:
        LOG.warning(f"could not write {state.WATCHED}: {err}")
    data = tail(values["log_dir"])
    keep(values["state_dir"], data)

    def judge() -> Verdict | None:
        """The healthcheck's verdict with the current start's settings (nothing to judge when not even glm5.toml's
        folders can be used: then no server runs)."""
        try:
            return probe.verdict(probe.run_of(os.environ), data)
        except Problems:
            return None

    watch(values, rpc, judge)


def main(argv: list[str] | None = None) -> int:
    # Run by supervisord alone (entrypoint/supervisord.conf [eventlistener:lifecycle]); --help says what it is.
    argparse.ArgumentParser(
        prog="entrypoint/lifecycle", description=(__doc__ or "").split("\n\n")[0]
    ).parse_args(argv)
    try:
        values, _problems = state.supervised(os.environ)  # what preflight recorded failed.json under
    except Problems as err:
        return LOG.problems(err.problems)
    rpc = childutils.getRPCInterface(os.environ).supervisor
    while True:
        headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
        event, _data = childutils.eventdata(payload + "\n")
        try:
            if headers["eventname"].startswith("TICK_"):
                tick(values, rpc)
            else:
                on_event(headers["eventname"], event, values, rpc)
        except (xmlrpc.client.Fault, OSError) as err:  # supervisord shutting down: nothing is left to start
            LOG.warning(f"{headers['eventname']} of {event.get('processname')}: supervisord refused: {err}")
        childutils.listener.ok(sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
