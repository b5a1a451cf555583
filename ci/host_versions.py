"""The Docker Engine and Compose versions the compose file needs, checked on the host before a boot.

docker-compose.yml uses the healthcheck's `start_interval` (Docker Engine 25 or newer) and `env_file` with
`required: false` (Compose 2.24 or newer); older ones refuse the file or ignore the option. Versions are read
with `docker version --format '{{.Server.Version}}'` (e.g. `27.3.1`) and `docker compose version --short`
(`2.33.1`; `v2.2.3` before Compose 2.3.3, docker/compose#9272; "unknown flag: --short" on Docker 20.10's
compose plugin, devcontainers/cli#650).
"""

from __future__ import annotations

import re
import subprocess

MIN_ENGINE = (25, 0)
MIN_COMPOSE = (2, 24)
VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def parse(text: str) -> tuple[int, int] | None:
    m = VERSION.match(text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def problems(engine: str, compose: str) -> list[str]:
    """What is too old or unreadable, each with the fix; empty when both are new enough."""
    found = []
    for what, text, least, why in (
        ("Docker Engine", engine, MIN_ENGINE, "the healthcheck's start_interval"),
        ("Docker Compose", compose, MIN_COMPOSE, "env_file's required: false"),
    ):
        version = parse(text)
        want = ".".join(map(str, least))
        if version is None:
            found.append(
                f"{what} version unreadable ({text.strip()[:80]!r}): {want} or newer is needed for {why}"
            )
        elif version < least:
            found.append(
                f"{what} {text.strip()} is older than {want} (needed for {why}): update it (docs.docker.com/engine/install)"
            )
    return found


def read() -> tuple[str, str]:
    def run(*argv: str) -> str:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except OSError as err:
            return f"({argv[0]}: {err.strerror})"
        return done.stdout if done.returncode == 0 else (done.stderr or done.stdout)

    return run("docker", "version", "--format", "{{.Server.Version}}"), run(
        "docker", "compose", "version", "--short"
    )
