"""supervisord event listener: when the server goes FATAL (its starts kept failing), record why in the
state directory (entrypoint/state.py) and shut supervisord down; entrypoint.sh then exits 70. Speaks the
listener protocol on stdout (READY / RESULT); everything else goes to stderr."""

from __future__ import annotations

import os
import signal
import sys

from common.report import Log
from entrypoint import settings, state

WATCHED = {"sglang"}
LOG = Log("glm5-serve")


def fields(line: str) -> dict[str, str]:
    return dict(token.split(":", 1) for token in line.split())


def main() -> None:
    state_dir = settings.resolve(os.environ)["state_dir"]
    while True:
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        header = fields(sys.stdin.readline())
        payload = sys.stdin.read(int(header["len"]))
        event = fields(payload.split("\n", 1)[0])
        if header["eventname"] == "PROCESS_STATE_FATAL" and event.get("processname") in WATCHED:
            reason = f"{event['processname']} went FATAL: it exited during start more than GLM5_START_RETRIES times"
            state.write_fatal(state_dir, reason)
            LOG.error(f"{reason}; stopping the container (see server.log)")
            os.kill(os.getppid(), signal.SIGTERM)
        sys.stdout.write("RESULT 2\nOK")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
