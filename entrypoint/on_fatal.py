"""supervisord event listener: when the server goes FATAL (its starts kept failing), record why in the
state directory (`fatal`, and `failed.json` with the last start's reason; entrypoint/state.py) and shut
supervisord down; entrypoint.sh then waits in `failed` (or exits 70 with GLM5_ON_FAILURE=exit). Speaks the
listener protocol on stdout (READY / RESULT); everything else goes to stderr."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from common.report import FATAL, Log, Problems
from entrypoint import settings, state

WATCHED = {"sglang"}
LOG = Log("glm5-serve")


def fields(line: str) -> dict[str, str]:
    return dict(token.split(":", 1) for token in line.split())


def last_failure() -> str:
    """Why the last start failed, as the healthcheck reads it from the server log."""
    from healthcheck import logscan, phase

    log_dir = settings.resolve(os.environ)["log_dir"]
    try:
        scan = logscan.scan(logscan.read_tail(Path(log_dir) / state.SERVER_LOG))
    except OSError:
        return "no server log"
    return phase.explain_failure(scan) if scan.failure else "it exited without a failure line in the log"


def main() -> int:
    try:
        values = settings.resolve(os.environ)
        state.require_folders(values)
    except Problems as err:
        return LOG.problems(err.problems)
    state_dir = values["state_dir"]
    while True:
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        header = fields(sys.stdin.readline())
        payload = sys.stdin.read(int(header["len"]))
        event = fields(payload.split("\n", 1)[0])
        if header["eventname"] == "PROCESS_STATE_FATAL" and event.get("processname") in WATCHED:
            reason = f"{event['processname']} went FATAL: it exited during start more than GLM5_START_RETRIES times"
            state.write_fatal(state_dir, reason)
            state.write_failed(state_dir, FATAL, f"{reason}; the last start: {last_failure()}")
            LOG.error(f"{reason}; stopping the container (see server.log)")
            os.kill(os.getppid(), signal.SIGTERM)
        sys.stdout.write("RESULT 2\nOK")
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
