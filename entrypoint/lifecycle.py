"""supervisord event listener, the one place that decides what follows what under the one supervisor:
preflight passed, so start the server (over supervisord's XML-RPC); preflight failed, or the server went FATAL
(its starts kept failing), so record why (failed.json; configuration/state.py) and stay up showing it, supervisord
and the exporter running (GLM5_ON_FAILURE=wait), or shut supervisord down (exit), after which entrypoint.sh exits
with the recorded code. And the stall watchdog: on each TICK_5, while the server program runs, the healthcheck's
own decision (healthcheck/probe.py, from the log alone); a start with no log output for GLM5_STALL_SECONDS is hung,
and the server program is restarted, however long a start that keeps making progress takes. Docker never restarts an
unhealthy container (restart policies act on an exit), so on compose this is what clears a hang; on Kubernetes it
acts first and liveness, which fails on the same hang, is the backstop (README: Restarts). On each TICK_5 it is
also the one writer of capture.json: what the log said of the current start, kept before the log's tail window
or its rotation loses it (healthcheck/probe.py remember; every other prober only reads it). Speaks the listener
protocol on stdout (supervisor.childutils); logs go to stderr."""

from __future__ import annotations

import os
import sys
import xmlrpc.client
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from supervisor import childutils

from common.report import FAILED, FATAL, HUNG, Log, Problems
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


def last_failure(log_dir: str) -> str:
    """Why the last start failed, as the healthcheck reads it from the server log."""
    try:
        scan = logscan.scan(logscan.read_tail(Path(log_dir) / state.SERVER_LOG))
    except OSError:
        return "no server log"
    return phase.explain_failure(scan) if scan.failure else "it exited without a failure line in the log"


def on_event(name: str, event: dict[str, str], values: dict[str, Any], rpc: Supervisor) -> None:
    process = event.get("processname")
    if name == "PROCESS_STATE_EXITED" and process == PREFLIGHT:
        if event.get("expected") == "1":
            rpc.startProcess(SERVER, False)
            return
        code = int(rpc.getProcessInfo(PREFLIGHT).get("exitstatus") or FAILED)
        recorded = state.read_failed(values["state_dir"])
        if (
            recorded is None
        ):  # it died before it could say why (a traceback, a kill): its code, and where to look
            state.write_failed(
                values["state_dir"], code, f"preflight exited {code}; its lines are above in the log"
            )
        give_up(code, values, rpc)
    elif name == "PROCESS_STATE_FATAL" and process == SERVER:
        reason = f"{SERVER} went FATAL: it exited during start more than GLM5_START_RETRIES times"
        state.write_failed(
            values["state_dir"], FATAL, f"{reason}; the last start: {last_failure(values['log_dir'])}"
        )
        LOG.error(f"{reason} (see server.log)")
        give_up(FATAL, values, rpc)


RESTARTED, STOPPED = "restarted", "stopped"  # what watch did


def watch(rpc: Supervisor, judge: Callable[[], Verdict | None], state_dir: str, retries: int) -> str | None:
    """Restart a running server whose start is hung (RESTARTED), `retries` times in a row at most (hangs.json); then
    record the failure with where it hung and the fix (exit code 73) and stop the server (STOPPED); None: nothing to
    do. A start that reaches ready clears the count."""
    if rpc.getProcessInfo(SERVER).get("statename") not in ("STARTING", "RUNNING"):
        return None
    found = judge()
    if found is not None and found.phase is Phase.READY and state.path(state_dir, state.HANGS).exists():
        state.clear_hangs(state_dir)
    if found is None or not found.hung:
        return None
    hangs = state.count_hang(state_dir, found.start, str(found.reason))
    if hangs > retries:
        reason = (
            f"{hangs} starts in a row hung (GLM5_START_RETRIES={retries}), so the kit no longer restarts it; "
            f"the last: {found.reason}"
        )
        LOG.error(reason)
        state.write_failed(state_dir, HUNG, reason)
        rpc.stopProcess(SERVER, True)
        return STOPPED
    LOG.error(
        f"{found.reason}: restarting the server ({hangs} of {retries + 1} starts in a row hung; GLM5_STALL_SECONDS)"
    )
    rpc.stopProcess(SERVER, True)
    rpc.startProcess(SERVER, False)
    return RESTARTED


def keep(state_dir: str) -> None:
    """Remember the current start's facts (capture.json); a state or log this tick cannot read is logged, and the
    next tick tries again."""
    try:
        probe.remember(state_dir)
    except (OSError, ValueError, KeyError, TypeError, Problems) as err:
        LOG.warning(f"could not keep the start's facts in {state.CAPTURE}: {err}")


def give_up(code: int, values: dict[str, Any], rpc: Supervisor) -> None:
    if values["on_failure"] == "exit":
        LOG.error(f"failed (exit code {code}): stopping the container (GLM5_ON_FAILURE=exit)")
        rpc.shutdown()
        return
    LOG.error(
        f"failed (exit code {code}): staying up to show why (healthcheck --status, the exporter, "
        f"{state.path(values['state_dir'], state.FAILED)}); fix the cause, then `docker compose up -d glm5` (it "
        "re-reads glm5.env; `restart` does not) or delete the pod (GLM5_ON_FAILURE=exit exits instead)"
    )


def main() -> int:
    try:
        values, _problems = state.supervised(os.environ)  # what preflight recorded failed.json under
    except Problems as err:
        return LOG.problems(err.problems)
    rpc = childutils.getRPCInterface(os.environ).supervisor

    def judge() -> Verdict | None:
        """The healthcheck's verdict from the log, with the current start's settings (nothing to judge when not
        even glm5.toml's folders can be used: then no server runs)."""
        try:
            return probe.verdict(probe.settings(os.environ))
        except Problems:
            return None

    while True:
        headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
        event, _data = childutils.eventdata(payload + "\n")
        try:
            if headers["eventname"].startswith("TICK_"):
                keep(values["state_dir"])
                # asks the judge only while the server runs: never under invalid settings
                if watch(rpc, judge, values["state_dir"], int(values["start_retries"])) == STOPPED:
                    give_up(HUNG, values, rpc)
            else:
                on_event(headers["eventname"], event, values, rpc)
        except (xmlrpc.client.Fault, OSError) as err:  # supervisord shutting down: nothing is left to start
            LOG.warning(f"{headers['eventname']} of {event.get('processname')}: supervisord refused: {err}")
        childutils.listener.ok(sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
