"""A stand-in for the `docker` CLI on a host where the compose service may already have a container.

It records every argv (one JSON list per line in $DOCKER_DOUBLE_LOG) and answers what ci/smoke and ci/bench ask
before and around a boot, in the real commands' output shapes:
- `docker version --format {{.Server.Version}}`: `27.3.1`; `docker compose version --short`: `2.33.1`
  (both as ci/host_versions.py cites them);
- `docker compose ... ps --all --quiet glm5`: the service's container IDs, one per line, as 64 hex digits
  (`docker-compose ps -q app` printed `25d3b2c4feb9...a3233231`, docker/compose#5379); the IDs are the lines of
  $DOCKER_DOUBLE_CONTAINERS (none when it is unset or empty). `up` adds one, `rm` empties it.
Every other command succeeds silently: the test reads the log to see what was asked.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NEW_ID = "25d3b2c4feb9ff9db4780bfd196b33916d849df5314e2a7f46b6fadae3a33231"


def main(argv: list[str]) -> int:
    with Path(os.environ["DOCKER_DOUBLE_LOG"]).open("a") as log:
        log.write(json.dumps(argv) + "\n")
    containers = Path(os.environ["DOCKER_DOUBLE_CONTAINERS"])
    words = [w for w in argv if not w.startswith("-") and not w.endswith((".yml", ".json"))]
    if argv[:1] == ["version"]:
        print("27.3.1")
    elif words[:2] == ["compose", "version"]:
        print("2.33.1")
    elif words[:2] == ["compose", "ps"] and "--quiet" in argv:
        print(containers.read_text() if containers.exists() else "", end="")
    elif words[:2] == ["compose", "up"]:
        containers.write_text(NEW_ID + "\n")
    elif words[:2] == ["compose", "rm"]:
        containers.write_text("")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
