"""ci/smoke --url end-to-end against the server test double, started through the real entrypoint and supervisord."""

from __future__ import annotations

import json
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ci import host_versions
from conftest import ROOT
from helpers.container import POLL, Container, start

pytestmark = pytest.mark.boots  # boots processes or runs real tools: not in ci/test --fast

SMOKE = ROOT / "ci" / "smoke"


def smoke(
    c: Container, *args: str, timeout: str = "60"
) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    report = c.tmp / "report"
    env = os.environ | {"GLM5_LOG_DIR": str(c.tmp / "log"), "GLM5_STATE_DIR": str(c.tmp / "run")}
    done = subprocess.run(
        [
            str(SMOKE),
            "--url",
            f"http://127.0.0.1:{c.port}",
            "--timeout",
            timeout,
            "--poll",
            str(POLL),
            "--report-dir",
            str(report),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=180,
    )
    data = json.loads((report / "smoke.json").read_text()) if (report / "smoke.json").exists() else {}
    return done, data


def test_smoke_passes_against_the_double(tmp_path: Path, containers: list[Container]) -> None:
    # A start slow enough that smoke's first poll (seconds on a loaded machine) still sees it starting.
    c = start(tmp_path, SGLANG_DOUBLE_TICK="0.08")
    containers.append(c)
    done, report = smoke(c)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9 passed, 0 failed" in done.stdout
    # progress shown
    assert "capturing (prefill" in done.stdout or "loading" in done.stdout or "starting" in done.stdout
    metrics = report["metrics"]
    assert isinstance(metrics, dict)
    assert metrics["time_to_ready_s"] >= 0 and metrics["ttft_s"] >= 0 and metrics["decode_tokens_per_s"] > 0
    assert metrics["verification"]["passed"] and metrics["verification"]["accuracy"] == 1.0  # type: ignore[index]
    suite = ET.parse(tmp_path / "report" / "smoke.xml").getroot()
    assert suite.get("tests") == "9" and suite.get("failures") == "0"
    assert [t.get("name") for t in suite] == [
        "models",
        "chat",
        "chat_stream",
        "completion",
        "tool_call",
        "reasoning",
        "verification",
        "decode_speed",
        "metrics",
    ]


def test_smoke_with_an_api_key(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path, GLM5_API_KEY="k-123-0123456789abcdef")
    containers.append(c)
    denied, _ = smoke(c, "--api-key", "wrong")
    assert denied.returncode == 1 and "answered 401" in denied.stdout + denied.stderr
    ok, _ = smoke(c, "--api-key", "k-123-0123456789abcdef")
    assert ok.returncode == 0, ok.stdout


@pytest.mark.parametrize(
    ("mode", "check", "message"),
    [
        ("empty-text", "chat", "empty content"),
        ("wrong-answer", "chat", "expected 'Paris' in the answer, got 'Lyon'"),
        ("wrong-model", "models", "not 'glm-5'"),
        ("no-tools", "tool_call", "no tool_calls"),
        ("no-reasoning", "reasoning", "reasoning parser (glm45) did not separate it"),
    ],
)
def test_smoke_fails_on_a_broken_server(
    tmp_path: Path, containers: list[Container], mode: str, check: str, message: str
) -> None:
    c = start(
        tmp_path, mode, GLM5_VERIFY="report"
    )  # the start's own gate would hold it at failed: ci/smoke's checks
    containers.append(c)
    done, report = smoke(c)
    assert done.returncode == 1
    assert f"FAIL {check}: " in done.stdout and message in done.stdout
    checks = {r["name"]: r for r in report["checks"]}  # type: ignore[union-attr]
    assert checks[check]["passed"] is False


def test_smoke_fails_when_never_ready(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path, "never-ready")
    containers.append(c)
    done, _ = smoke(c, timeout="5")
    assert done.returncode == 4  # NEVER_READY
    assert "never became ready" in done.stderr and "--- last log lines ---" in done.stderr
    assert "Uvicorn running" in done.stderr  # the last log lines are shown


def test_smoke_reports_a_start_its_own_verification_failed(
    tmp_path: Path, containers: list[Container]
) -> None:
    c = start(tmp_path, "wrong-in-batches")  # GLM5_VERIFY=enforce, the default: the start never turns ready
    containers.append(c)
    done, _ = smoke(c, timeout="60")
    assert done.returncode == 4, done.stdout + done.stderr  # NEVER_READY
    assert "verification failed, the server answers wrongly: arithmetic at batch " in done.stderr, done.stderr


def test_smoke_reports_a_failed_start_with_its_reason(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path, "oom-capture", GLM5_START_RETRIES="0")
    containers.append(c)
    done, _ = smoke(c, timeout="30")
    assert done.returncode == 4  # NEVER_READY
    assert "out of memory" in done.stderr


def test_the_host_needs_docker_25_and_compose_2_24() -> None:
    """Real output shapes: `docker version --format {{.Server.Version}}` and `docker compose version --short`
    (2.33.1 from getsentry/self-hosted#3605; v2.2.3 before Compose 2.3.3, docker/compose#9272; Docker 20.10's
    plugin: "unknown flag: --short", devcontainers/cli#650)."""
    assert host_versions.problems("27.3.1\n", "2.33.1\n") == []
    assert host_versions.problems("25.0.0", "v2.24.0") == []
    old = host_versions.problems("24.0.7\n", "v2.2.3\n")
    assert (
        len(old) == 2 and "Docker Engine 24.0.7 is older than 25.0" in old[0] and "start_interval" in old[0]
    )
    assert "Docker Compose v2.2.3 is older than 2.24" in old[1]
    unreadable = host_versions.problems("27.3.1", "unknown flag: --short\nSee 'docker --help'.\n")
    assert len(unreadable) == 1 and unreadable[0].startswith("Docker Compose version unreadable (")
    assert "unknown flag: --short" in unreadable[0] and unreadable[0].endswith(
        "2.24 or newer is needed for env_file's required: false"
    )


@pytest.mark.parametrize(
    ("mode", "named", "also_failing"),
    [
        ("garbage-past-length", "retrieval: wrong retrieval-16000, retrieval-32000", set()),
        (
            "wrong-in-batches",
            "arithmetic at batch 32: ",
            set(),
        ),  # how many overlap depends on the threads' timing
        ("mangled-tool-call", "tool: wrong tool-", {"tool_call"}),
    ],
)
def test_a_healthy_server_answering_wrongly_fails_the_verification_with_its_items_named(
    tmp_path: Path, containers: list[Container], mode: str, named: str, also_failing: set[str]
) -> None:
    """The failures users meet on SM120 NVFP4: healthy by every probe, wrong past a context length, wrong only in
    larger batches, a mangled tool call. The double answers each way; the verification names what went wrong."""
    c = start(tmp_path, mode, GLM5_VERIFY="report")  # serving though wrong: what ci/smoke itself must catch
    containers.append(c)
    done, report = smoke(c, timeout="120")
    assert done.returncode == 1, done.stdout + done.stderr
    checks = {r["name"]: r for r in report["checks"]}  # type: ignore[attr-defined]
    assert not checks["verification"]["passed"] and named in checks["verification"]["message"], checks[
        "verification"
    ]
    assert {n for n, r in checks.items() if not r["passed"]} == {"verification"} | also_failing
    assert "batch 1:" not in checks["verification"]["message"]  # alone, every mode answers right
    items = report["metrics"]["verification_items"]  # type: ignore[index]
    assert len(items) == 57 and all(
        {"kind", "batch", "prompt_tokens", "expected", "received", "seconds"} <= set(i) for i in items
    )
