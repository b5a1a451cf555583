"""The container as entrypoint.sh runs it, on this machine: the real supervisord, the SGLang server test double."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from conftest import ROOT

DOUBLE = ROOT / "tests" / "doubles" / "sglang_server_double.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Container:
    """entrypoint.sh as PID 1 would run it, on this machine, with the double as the server program."""

    proc: subprocess.Popen[str]
    port: int
    tmp: Path

    @property
    def log(self) -> Path:
        return self.tmp / "log" / "server.log"

    def health(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as err:
            return err.code
        except OSError:
            return 0

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.health() == 200:
                return
            assert self.proc.poll() is None, f"entrypoint exited {self.proc.returncode}: {self.output()}"
            time.sleep(0.2)
        raise AssertionError(f"not healthy in {timeout}s: {self.output()}")

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else "(no server.log)"

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


def start(tmp: Path, mode: str = "ok", **env: str) -> Container:
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GLM5_", "SGLANG_DOUBLE"))}
    full |= {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "GLM5_HOME": str(ROOT),
        "GLM5_LOG_DIR": str(tmp / "log"),
        "GLM5_STATE_DIR": str(tmp / "run"),
        "GLM5_PORT": str(port),
        "GLM5_SKIP_PREFLIGHT": "all",
        "GLM5_SERVER_PROGRAM": f"{sys.executable} {DOUBLE}",
        "GLM5_START_SECONDS": "4",
        "GLM5_START_RETRIES": "1",
        "GLM5_DRAIN_SECONDS": "3",
        "SGLANG_DOUBLE_MODE": mode,
        "SGLANG_DOUBLE_STATE": str(tmp),
    } | env
    proc = subprocess.Popen(
        [str(ROOT / "entrypoint" / "entrypoint.sh")],
        env=full,
        stdout=(tmp / "stdout").open("w"),
        stderr=(tmp / "stderr").open("w"),
        text=True,
        start_new_session=True,
    )
    return Container(proc, port, tmp)
