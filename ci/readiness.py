"""One notion of a target and one wait-until-ready, for ci/smoke, ci/bench and the tests.

A target is where the server runs:
- Compose: the compose service `glm5` on this host (`docker compose up -d`), read with the healthcheck inside;
- Local: entrypoint/entrypoint.sh from this checkout as a child process (bare metal; the tests with the
  server double), read with the healthcheck from this checkout;
- Url: a server that is already running; read with the healthcheck when its log is on this machine.

Every target has the same URL, port and API key rules (`connection`): the host port is GLM5_HOST_PORT, the
key GLM5_API_KEY or GLM5_API_KEY_FILE. `wait_until_ready` applies one rule to all of them: ready when
/health answers 200 and the healthcheck (where it can be read) says `ready`; failed when the healthcheck
says `failed` or the target exited; a start that began before this boot counts as still starting.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configuration import settings, state
from healthcheck.probe import http_status

ROOT = Path(__file__).resolve().parent.parent
SERVICE = "glm5"
HEALTHCHECK_IN_IMAGE = "healthcheck/healthcheck"


class ServerExists(Exception):
    """The compose service has a container this tool did not start: booting would replace it, so nothing is done."""


@dataclass(frozen=True)
class Connection:
    url: str
    api_key: str | None


CONTAINER_ENV = (
    "glm5.env"  # the container's settings, beside docker-compose.yml (the quick start puts the key there)
)


def connection(environ: Mapping[str, str], url: str | None = None, root: Path = ROOT) -> Connection:
    """The server's base URL (default: this host's published port) and API key; raises report.Problems.
    Host settings come from the kit's .env as docker compose reads them, the shell winning; the key, when neither
    sets one, from glm5.env, where the quick start writes it (its GLM5_API_KEY_FILE names a path inside the
    container: a key file on this host goes in the shell or .env)."""
    host = settings.host_environment(environ, root)
    if not any(host.get(k, "").strip() for k in ("GLM5_API_KEY", "GLM5_API_KEY_FILE")):
        key = settings.read_dotenv(root / CONTAINER_ENV).get("GLM5_API_KEY", "").strip()
        host |= {"GLM5_API_KEY": key} if key else {}
    values = settings.resolve(host, where="ci")
    base = url or f"http://127.0.0.1:{values['host_port']}"
    return Connection(base.rstrip("/"), values["api_key"])


def log_of(environ: Mapping[str, str]) -> Path | None:
    """The server log on this machine, when GLM5_LOG_DIR names a folder here."""
    log_dir = environ.get("GLM5_LOG_DIR", "").strip()
    return Path(log_dir, state.SERVER_LOG) if log_dir else None


def first_json(text: str) -> Any:
    """The JSON document in a command's output: the whole text, else its first line that parses."""
    for candidate in (text, *text.splitlines()):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


class Target:
    """The interface every target offers; the defaults suit a server this tool did not start."""

    label = "server"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def boot(self, env: Mapping[str, str]) -> None:
        """Start the server with these extra settings (no-op for a running server)."""

    def state(self) -> dict[str, Any] | None:
        """The healthcheck's JSON for this server, or None where it cannot be read."""
        return None

    def exited(self) -> str | None:
        """Why the server's container or process is gone, or None while it runs."""
        return None

    def log_tail(self, lines: int = 40) -> str:
        return "(the server's log is not on this machine)"

    def stop(self) -> None:
        """Stop what boot started (no-op for a running server)."""


class Url(Target):
    """A running server; its log is read when GLM5_LOG_DIR names a folder on this machine."""

    label = "url"

    def __init__(self, conn: Connection, environ: Mapping[str, str]) -> None:
        super().__init__(conn)
        self.env = settings.container_environment(environ)  # the healthcheck refuses host-side settings
        self.log = log_of(environ)

    def state(self) -> dict[str, Any] | None:
        if self.log is None or not self.log.exists():
            return None
        return local_healthcheck(self.conn.url, self.env)

    def log_tail(self, lines: int = 40) -> str:
        if self.log is None or not self.log.exists():
            return super().log_tail(lines)
        text = self.log.read_text(errors="replace").replace("\r", "\n")
        return "\n".join(text.splitlines()[-lines:])


def local_healthcheck(url: str, env: Mapping[str, str]) -> dict[str, Any] | None:
    done = subprocess.run(
        [str(ROOT / HEALTHCHECK_IN_IMAGE), "--json", "--url", url],
        capture_output=True,
        text=True,
        env=dict(env),
        check=False,
    )
    state: dict[str, Any] | None = first_json(done.stdout)
    return state


class Local(Url):
    """entrypoint/entrypoint.sh from this checkout, as a child in its own session."""

    label = "local"

    def __init__(
        self,
        conn: Connection,
        environ: Mapping[str, str],
        output: Path,
        stop_timeout: float = 180,
        wrapper: Sequence[str] = (),
    ) -> None:
        super().__init__(conn, environ)
        # A command the entrypoint runs under (tests: bubblewrap's read-only root).
        self.wrapper = list(wrapper)
        # Each boot is this plus its own settings, never an earlier boot's; as in a container, the host-side
        # settings (the ci tools' own, docker compose's) stay outside.
        self.base = settings.container_environment(environ)
        self.output, self.stop_timeout = output, stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def boot(self, env: Mapping[str, str]) -> None:
        self.stop()
        self.env = self.base | dict(env)
        self.log = log_of(self.env)
        with self.output.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.wrapper, str(ROOT / "entrypoint" / "entrypoint.sh")],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def exited(self) -> str | None:
        if self.proc is None or self.proc.poll() is None:
            return None
        return f"the entrypoint exited with {self.proc.returncode} (its output: {self.output})"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


class Compose(Target):
    """The compose service on this host; extra settings go in an override file beside the outputs.

    It boots only where the service has no container (running or stopped) of its own: one found is someone's
    server, and `up --force-recreate` would replace it. What it booted, it alone removes (`rm --stop`, that one
    service: `down` would stop the whole project, the gateway and monitoring profiles too). While its container
    stands, the file BOOTED in the scratch folder says so, for a clean-up after the tool was killed."""

    label = "compose"
    BOOTED = "compose-booted"

    def __init__(self, conn: Connection, scratch: Path) -> None:
        super().__init__(conn)
        self.scratch = scratch
        self.files = ["-f", str(ROOT / "docker-compose.yml")]
        self.booted = False

    def containers(self) -> list[str]:
        """The service's container IDs, running or not (`docker compose ps --all --quiet`: one ID per line)."""
        done = self.run("ps", "--all", "--quiet", SERVICE)
        if done.returncode != 0:
            raise RuntimeError(f"docker compose ps failed: {(done.stdout + done.stderr).strip()[-800:]}")
        return done.stdout.split()

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "compose", *self.files, *args], cwd=ROOT, capture_output=True, text=True, check=False
        )

    def boot(self, env: Mapping[str, str]) -> None:
        self.files = ["-f", str(ROOT / "docker-compose.yml")]
        found = [] if self.booted else self.containers()
        if found:
            raise ServerExists(
                f"the compose service {SERVICE} already has a container ({found[0][:12]}), which this tool did not "
                f"start: nothing was touched. Test the running server instead: --url {self.conn.url}; or, if it may go, "
                f"remove it first: docker compose rm --stop {SERVICE}"
            )
        if env:
            override = self.scratch / "compose.override.json"
            override.write_text(json.dumps({"services": {SERVICE: {"environment": dict(env)}}}))
            self.files += ["-f", str(override)]
        self.booted = True  # from here on the container is this tool's, even if `up` fails halfway
        (self.scratch / self.BOOTED).write_text(f"docker compose rm --stop --force {SERVICE}\n")
        done = self.run("up", "-d", "--force-recreate", SERVICE)
        if done.returncode != 0:
            raise RuntimeError(f"docker compose up failed: {(done.stdout + done.stderr).strip()[-800:]}")

    def exec(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("exec", "-T", SERVICE, *args)

    def state(self) -> dict[str, Any] | None:
        home = settings.resolve({})["home"]
        state: dict[str, Any] | None = first_json(
            self.exec(f"{home}/{HEALTHCHECK_IN_IMAGE}", "--json").stdout
        )
        return state

    def exited(self) -> str | None:
        done = self.run("ps", "--all", "--format", "{{.State}} {{.ExitCode}}", SERVICE)
        words = done.stdout.split()
        if words and words[0] in ("exited", "dead"):
            return f"the container exited with {words[1] if len(words) > 1 else '?'} (docker compose logs {SERVICE})"
        return None

    def log_tail(self, lines: int = 40) -> str:
        return self.run("logs", "--no-color", "--tail", str(lines), SERVICE).stdout

    def stop(self) -> None:
        if self.booted:
            self.run("rm", "--stop", "--force", SERVICE)
            (self.scratch / self.BOOTED).unlink(missing_ok=True)
            self.booted = False


@dataclass
class Readiness:
    ready: bool
    state: dict[str, Any] | None
    reason: str
    seconds: float


def describe(state: dict[str, Any] | None, health: int | str) -> str:
    if state is None:
        return f"/health: {health}"
    text = state["phase"]
    if state["phase"] == "capturing":
        text += (
            f" (prefill {state.get('prefill_captured')}/{state.get('prefill_expected')}, "
            f"decode {state.get('decode_captured')}/{state.get('decode_expected')})"
        )
    if state.get("reason"):
        text += f": {state['reason']}"
    return f"{text}; /health: {health}"


def stale(state: dict[str, Any], since: datetime.datetime | None) -> bool:
    """The healthcheck describes a start from before this boot (an earlier variant's, still in the log),
    or no start at all yet while nothing has failed. Without a boot (`since` None) any start counts."""
    if since is None:
        return False
    started = state.get("started_at")
    if started is None:
        return bool(state["phase"] != "failed")
    return datetime.datetime.fromisoformat(started) < since


def wait_until_ready(
    target: Target,
    timeout: float,
    poll: float,
    since: datetime.datetime | None,
    progress: Callable[[str], None],
    through_restarts: bool = False,
) -> Readiness:
    """Poll until the start that began at or after `since` (None: the server was not booted by us, any start
    counts) is ready or failed, or `timeout` passes;
    print each change of phase through `progress`. `through_restarts`: a failed start does not end the wait
    while the target runs (supervisord starts the server again); only the target's exit does."""
    began, last = time.monotonic(), ""
    state: dict[str, Any] | None = None
    while True:
        elapsed = time.monotonic() - began
        health = http_status(target.conn.url)
        state = target.state()
        if state is not None and stale(state, since):
            state = {"phase": "starting", "reason": "no start since the boot yet"}
        line = describe(state, health)
        if line != last:
            progress(f"[{elapsed:6.0f}s] {line}")
            last = line
        if state is not None and state["phase"] == "failed" and not through_restarts:
            return Readiness(False, state, str(state.get("reason")), elapsed)
        if health == 200 and (state is None or state["phase"] == "ready"):
            return Readiness(True, state, "", elapsed)
        gone = target.exited()
        if gone:
            return Readiness(False, state, gone, elapsed)
        if elapsed >= timeout:
            return Readiness(False, state, f"not ready within {timeout:.0f}s", elapsed)
        time.sleep(poll)


def now() -> datetime.datetime:
    """The boot time to pass as `since` (a second early: log timestamps have second resolution)."""
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)


def say(prog: str) -> Callable[[str], None]:
    def progress(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stdout, flush=True)

    return progress
