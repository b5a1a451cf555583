"""The real SGLang Model Gateway (smg, started by gateway/launch with a discovery file) on loopback, for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from conftest import ROOT
from helpers.container import Container, free_port, start

KEY = "gateway-test-key-0123456789"
ADMIN_KEY = "gateway-operator-key-9876543210"  # GLM5_ADMIN_API_KEY: smg's control plane, never the clients'
LAUNCH = ROOT / "gateway" / "launch"


class Gateway:
    def __init__(
        self,
        tmp: Path,
        workers: dict[str, Container],
        wrapper: tuple[str, ...] = (),
        smg_flags: tuple[str, ...] = (),
        rotation: Path | None = None,
        launch_flags: tuple[str, ...] = (),
        **env: str,
    ) -> None:
        self.tmp, self.port, self.metrics, self.rotation_metrics = tmp, free_port(), free_port(), free_port()
        self.discovery = tmp / "workers.json"
        # What smg reads: the ready replicas (gateway/rotation.py).
        self.rotation = rotation or tmp / "rotation" / "workers.json"
        self.write(workers)
        env = (
            {k: v for k, v in os.environ.items() if not k.startswith("GLM5_")}
            | {
                "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                "GLM5_API_KEY": KEY,
                "GLM5_ADMIN_API_KEY": ADMIN_KEY,
            }
            | env
        )
        fast = ["--health-check-interval-secs", "1", "--worker-startup-check-interval", "1",
                "--health-failure-threshold", "2"]  # fmt: skip
        self.output, self.env = tmp / "gateway.out", env
        self.launch = [
            str(LAUNCH),
            "--discovery-file",
            str(self.discovery),
            "--rotation-file",
            str(self.rotation),
            "--rotation-metrics-port",
            str(self.rotation_metrics),
            *launch_flags,
        ]
        self.proc = subprocess.Popen(
            [*wrapper, *self.launch, "--",
             "--host", "127.0.0.1", "--port", str(self.port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(self.metrics), "--health-check-port", str(free_port()), *fast, *smg_flags],
            env=env, stdout=self.output.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def argv(self) -> list[str]:
        """smg's arguments as gateway/launch builds them for this gateway's files and environment (--dry-run)."""
        done = subprocess.run(
            [*self.launch, "--dry-run"], env=self.env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def write(self, workers: dict[str, Container]) -> None:
        """The operator's file; each replica's exporter (its /ready) is on a port of its own here."""
        doc = {
            "version": 1,
            "workers": [
                {
                    "id": k,
                    "url": f"http://127.0.0.1:{c.port}",
                    "ready_url": f"http://127.0.0.1:{c.exporter_port}/ready",
                }
                for k, c in workers.items()
            ],
        }
        staged = self.discovery.with_suffix(".tmp")
        staged.write_text(json.dumps(doc))
        staged.replace(self.discovery)  # atomic, as an operator's editor or `mv` does

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def readiness(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self.url + "/readiness", timeout=5) as r:
                return dict(json.loads(r.read()))
        except (OSError, ValueError):
            return {}

    def registered(self) -> list[str]:
        """The urls of the workers smg routes to (not draining), read with the operator's key."""
        request = urllib.request.Request(self.url + "/workers")
        request.add_header("Authorization", f"Bearer {self.env.get('GLM5_ADMIN_API_KEY', ADMIN_KEY)}")
        with urllib.request.urlopen(request, timeout=10) as r:
            listed = json.loads(r.read())
        return sorted(str(w["url"]) for w in listed.get("workers", []) if w.get("status") != "draining")

    def wait_healthy(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.readiness().get("healthy_workers") != n:
            assert self.proc.poll() is None, self.output.read_text()
            assert time.monotonic() < deadline, f"{self.readiness()}\n{self.output.read_text()[-3000:]}"
            time.sleep(0.3)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)


def chat_request(url: str, body: dict[str, Any], key: str | None = KEY) -> urllib.request.Request:
    """A POST of BODY to the chat route as the clients send it: JSON, the bearer key when given."""
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    return request


def chat(url: str, text: str, key: str | None = KEY, **extra: Any) -> tuple[int, dict[str, Any]]:
    body = {"model": "glm-5", "messages": [{"role": "user", "content": text}], "max_tokens": 16} | extra
    request = chat_request(url, body, key)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            raw = r.read()
            # A streamed answer is server-sent events, not one JSON document: its text.
            return r.status, {"body": raw.decode(errors="replace")} if body.get("stream") else dict(
                json.loads(raw)
            )
    except urllib.error.HTTPError as err:
        return err.code, {"body": err.read().decode(errors="replace")}
    except (urllib.error.URLError, ConnectionError):
        return 0, {}  # nothing listening yet


def p99(seconds: list[float]) -> float:
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def in_rotation(gw: Gateway, c: Container) -> bool:
    try:
        return f"127.0.0.1:{c.port}" in gw.rotation.read_text()
    except OSError:
        return False


def wait_for(what: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def two_replicas(tmp_path: Path, containers: list[Container], env: dict[str, str]) -> dict[str, Container]:
    """Replicas a and b, each the kit's container start, ready one after the other."""
    replicas = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        replicas[name] = start(tmp_path / name, **env)
        containers.append(replicas[name])
        replicas[name].wait_healthy()
    return replicas


def replace_each(
    gw: Gateway,
    replicas: dict[str, Container],
    containers: list[Container],
    env: dict[str, str],
    *modes: str,
    stop_timeout: float = 40,
) -> dict[str, Container]:
    """The README's rolling replacement, one replica at a time: stop it (docker stop, a pod deletion: SIGTERM and
    its drain), start its replacement on the same ports, and go on only once the rotation lists it and smg routes
    to it (its health checks passed: the rotation's listing alone does not make smg send it work)."""
    replaced = {}
    for name, old in replicas.items():
        old.proc.send_signal(signal.SIGTERM)
        assert old.proc.wait(timeout=stop_timeout) == 0
        (old.tmp.parent / f"{name}2").mkdir()
        new = start(
            old.tmp.parent / f"{name}2",
            *modes,
            port=old.port,
            GLM5_EXPORTER_PORT=str(old.exporter_port),
            **env,
        )
        containers.append(new)
        wait_for(lambda new=new: in_rotation(gw, new), 90)  # ready and verified: the rotation takes it
        gw.wait_healthy(len(replicas))
        replaced[name] = new
    return replaced
