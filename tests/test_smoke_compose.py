"""ci/smoke and ci/bench without --url on a host whose compose service may already serve: the real tools against
a `docker` stand-in (tests/doubles/docker_double.py) that records what they ask of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import readiness
from common.report import SERVER_EXISTS
from conftest import ROOT

DOUBLE = ROOT / "tests" / "doubles" / "docker_double.py"
RUNNING_ID = "9c853627faf7d84db874cfa1da7d4f8f811f94042a2b566d53b59f8f64802c46"
TOUCHING = {"up", "down", "rm", "stop", "restart", "kill", "create", "start"}


def docker_host(tmp_path: Path, *containers: str) -> dict[str, str]:
    """An environment whose `docker` is the double, with these containers of the service already there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DOUBLE}" "$@"\n')
    (bin_dir / "docker").chmod(0o755)
    (tmp_path / "containers").write_text("".join(f"{c}\n" for c in containers))
    return os.environ | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DOCKER_DOUBLE_LOG": str(tmp_path / "docker.log"),
        "DOCKER_DOUBLE_CONTAINERS": str(tmp_path / "containers"),
    }


def asked(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "docker.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def compose_verbs(tmp_path: Path) -> set[str]:
    return {w for argv in asked(tmp_path) if argv[:1] == ["compose"] for w in argv if w in TOUCHING}


@pytest.mark.parametrize(
    "tool",
    [pytest.param(["ci/smoke"], marks=pytest.mark.full), ["ci/bench", "--sweep", "ci/sweep-sm120.toml"]],
)  # ci/smoke runs in .venv-smoke
def test_a_server_already_there_is_never_touched(tmp_path: Path, tool: list[str]) -> None:
    env = docker_host(tmp_path, RUNNING_ID)
    done = subprocess.run(
        [str(ROOT / tool[0]), *tool[1:], *(["--report-dir"] if tool[0] == "ci/smoke" else ["--out"]),
         str(tmp_path / "out"), "--timeout", "5"],
        capture_output=True, text=True, env=env, check=False, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == SERVER_EXISTS, done.stdout + done.stderr
    assert "9c853627faf7" in done.stderr and "--url http://127.0.0.1:" in done.stderr
    assert ["compose", "-f", str(ROOT / "docker-compose.yml"), "ps", "--all", "--quiet", "glm5"] in asked(
        tmp_path
    )
    assert compose_verbs(tmp_path) == set(), asked(tmp_path)


def test_what_it_booted_it_alone_removes_and_only_its_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in docker_host(tmp_path).items():
        monkeypatch.setenv(key, value)
    target = readiness.Compose(readiness.Connection("http://127.0.0.1:30000", None), tmp_path)
    target.stop()  # nothing booted: nothing to remove
    assert compose_verbs(tmp_path) == set()
    target.boot({})
    assert (tmp_path / target.BOOTED).exists()  # a killed tool leaves this: the workflow's clean-up reads it
    target.boot({"GLM5_SPECULATIVE": "mtp"})  # a sweep's next variant replaces its own container
    target.stop()
    assert not (tmp_path / target.BOOTED).exists()
    target.stop()
    verbs = [[w for w in argv if w in TOUCHING] for argv in asked(tmp_path) if argv[:1] == ["compose"]]
    assert [v for v in verbs if v] == [
        ["up"],
        ["up"],
        ["rm"],
    ]  # `rm --stop --force glm5`, once; never `down`
    assert asked(tmp_path)[-1][-3:] == ["--stop", "--force", "glm5"]
