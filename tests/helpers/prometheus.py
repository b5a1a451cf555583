"""Debian's prometheus on loopback, with the kit's scrape config and alerts aimed at local targets, for tests."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from conftest import ROOT
from helpers.container import free_port

PROM = ROOT / "monitoring" / "prometheus"


class Prometheus:
    """Debian's prometheus, on loopback, with the shipped scrape config and alerts aimed at local targets."""

    def __init__(self, tmp: Path, targets: dict[str, str], wrapper: tuple[str, ...] = ()) -> None:
        config = yaml.safe_load((PROM / "prometheus.yml").read_text())
        config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(PROM / "alerts.yml")]
        for job in config["scrape_configs"]:
            job.pop("dns_sd_configs", None)
            job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        check = subprocess.run(
            ["promtool", "check", "config", str(tmp / "prometheus.yml")], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = tmp / "prometheus.out"
        self.proc = subprocess.Popen(
            [*wrapper, "prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.output.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.output.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, self.output.read_text()[-3000:]
            time.sleep(0.5)

    def wait_up(self, jobs: set[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.output.read_text()[-3000:]
            try:
                up = {r["metric"]["job"] for r in self.query("up == 1")}
            except OSError:
                up = set()
            if jobs <= up:
                return
            assert time.monotonic() < deadline, f"up: {up}, want {jobs}\n{self.output.read_text()[-2000:]}"
            time.sleep(0.5)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
