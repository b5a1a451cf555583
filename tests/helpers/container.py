"""The container as entrypoint.sh runs it, on this machine: the real supervisord, the SGLang server test double.

A thin layer over ci/readiness.py's Local target, so the tests boot and wait exactly as ci/smoke and ci/bench do.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from ci import readiness
from conftest import ROOT

DOUBLE = ROOT / "tests" / "doubles" / "sglang_server_double.py"


# Seconds between the readiness polls of a test waiting for a start: each runs the healthcheck, a Python process of
# about 0.1 s of CPU; at 0.2 s a waiting test kept a third of a core busy (a start read healthy in 9.0-9.4 s and 3.1-3.9
# CPU-s in all; at 1.0 s in 7.4-7.5 s and 2.6-2.8 CPU-s, on 2 cores).
POLL = 0.5
LISTEN_PORTS = range(20000, 32768)  # below Linux's ephemeral range (ip_local_port_range: 32768-60999)


def worker_ports(environ: Mapping[str, str] = os.environ) -> Iterator[int]:
    """This xdist worker's share of LISTEN_PORTS (every count-th port from its index), taken in turn from a random
    place: no two workers, and no two picks of one worker until its share is used up, hand out the same number (a
    random pick from the whole range gave a gateway's metrics port to two tests at once)."""
    name = environ.get("PYTEST_XDIST_WORKER", "gw0")
    index, count = int(name.removeprefix("gw") or 0), int(environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = LISTEN_PORTS[index::count]
    first = random.randrange(len(share))
    return itertools.cycle(itertools.chain(share[first:], share[:first]))


PORTS = worker_ports()


def free_port() -> int:
    """A port free now, for a server that binds it seconds later: never one from the ephemeral range, where the
    kernel hands the same number to an outgoing connection meanwhile (a client's 32 concurrent requests took a
    booting replica's port, and its gate then verified another replica), nor one another pick of this run holds."""
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("unreachable: the ports cycle")


@dataclass
class Container:
    """entrypoint.sh as PID 1 would run it, with the double as the server program."""

    target: readiness.Local
    port: int
    tmp: Path

    @property
    def proc(self) -> object:
        assert self.target.proc is not None
        return self.target.proc

    @property
    def exporter_port(self) -> int:
        return int(self.target.env["GLM5_EXPORTER_PORT"])

    @property
    def log(self) -> Path:
        return self.tmp / "log" / "server.log"

    @property
    def entrypoint_output(self) -> Path:
        """What entrypoint.sh and supervisord printed (docker logs), stdout and stderr together."""
        return self.target.output

    def health(self) -> int | str:
        return readiness.http_status(f"http://127.0.0.1:{self.port}")

    def wait_healthy(self, timeout: float = 60, through_restarts: bool = False) -> None:
        waited = readiness.wait_until_ready(
            self.target, timeout, POLL, readiness.now(), lambda _line: None, through_restarts
        )
        assert waited.ready, f"not ready: {waited.reason}\n{self.output()}"

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else "(no server.log)"

    def commands(self) -> list[str]:
        """The command lines of leftovers(), skipping any that exits while they are read."""
        found = []
        for p in self.leftovers():
            try:
                found.append(" ".join(p.cmdline()))
            except psutil.Error:
                continue
        return found

    def leftovers(self) -> list[psutil.Process]:
        """Processes started for this run that are still alive (matched by their environment)."""
        mine = []
        for p in psutil.process_iter():
            try:
                if (
                    p.environ().get("SGLANG_DOUBLE_STATE") == str(self.tmp)
                    and p.status() != psutil.STATUS_ZOMBIE
                ):
                    mine.append(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return mine


def exporter_samples(port: int) -> dict[str, float]:
    """The kit's exporter's answer on `port`, read with prometheus-client's own parser: {sample name{labels}: value};
    raises when nothing answers."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    return samples


def environment(tmp: Path, port: int, mode: str = "ok", **env: str) -> dict[str, str]:
    """The container's environment on this machine: the kit from this checkout, the double as the server."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GLM5_", "SGLANG_DOUBLE"))}
    return (
        full
        | {
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "GLM5_HOME": str(ROOT),
            "GLM5_LOG_DIR": str(tmp / "log"),
            "GLM5_STATE_DIR": str(tmp / "run"),
            "GLM5_PORT": str(port),
            "GLM5_EXPORTER_PORT": str(free_port()),
            "GLM5_SKIP_PREFLIGHT": "all",
            "GLM5_SERVER_PROGRAM": f"{sys.executable} {DOUBLE}",
            "GLM5_START_RETRIES": "1",
            "GLM5_DRAIN_SECONDS": "3",
            "SGLANG_DOUBLE_MODE": mode,
            "SGLANG_DOUBLE_STATE": str(tmp),
        }
        | env
    )


def start(
    tmp: Path, mode: str = "ok", wrapper: tuple[str, ...] = (), port: int | None = None, **env: str
) -> Container:
    """The container on `port` (a free one by default: a replacement takes its predecessor's)."""
    port = port or free_port()
    full = environment(tmp, port, mode, **env)
    conn = readiness.Connection(f"http://127.0.0.1:{port}", None)
    target = readiness.Local(conn, full, tmp / "entrypoint.out", stop_timeout=20, wrapper=wrapper)
    target.boot({})
    return Container(target, port, tmp)


def command_of(process: psutil.Process) -> str:
    """Its command line; empty for a process that ended meanwhile (a zombie, or gone: the tree changes under us)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def stop_inside(c: Container) -> int:
    """SIGTERM to the entrypoint inside the sandbox (bubblewrap passes no signal on), then bubblewrap's exit code."""
    bwrap = psutil.Process(c.target.proc.pid)  # type: ignore[union-attr]
    inside = [p for p in bwrap.children(recursive=True) if "entrypoint.sh" in command_of(p)]
    assert inside, "the entrypoint is not running inside the sandbox"
    inside[0].send_signal(signal.SIGTERM)
    return int(c.target.proc.wait(timeout=60))  # type: ignore[union-attr]
