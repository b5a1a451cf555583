"""entrypoint.sh + the real supervisord running the SGLang server test double: start, restart, FATAL, stop."""

from __future__ import annotations

import configparser
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT
from helpers.container import Container, start

CONF = ROOT / "entrypoint" / "supervisord.conf"


def test_serves_and_stops_cleanly_on_sigterm(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path)
    containers.append(c)
    c.wait_healthy()
    log = c.output()
    assert "===== glm5-serve: server start #1" in log
    assert "Capture target decode CUDA graph end. bs=[1, 2, 4" in log
    time.sleep(1.5)  # logtail polls: docker logs (stdout) gets the same lines
    stdout = c.entrypoint_output.read_text()
    assert "The server is fired up and ready to roll!" in stdout
    assert "glm5-serve: server start #1" in stdout
    assert len(c.leftovers()) >= 2  # the server and its scheduler stand-in
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=15) == 0
    assert c.leftovers() == []


def test_crash_restarts_with_a_new_marker(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path, "crash-once")
    containers.append(c)
    c.wait_healthy(through_restarts=True)
    log = c.output()
    assert "RuntimeError: TllmGenFmhaRunner" in log
    assert log.index("server start #1") < log.index("RuntimeError") < log.index("server start #2")
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=15) == 0


def test_repeated_failure_goes_fatal_and_exits_non_zero(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path, "crash-loading")
    containers.append(c)
    assert c.proc.wait(timeout=60) == 70
    assert "went FATAL" in c.entrypoint_output.read_text()
    assert c.output().count("glm5-serve: server start #") == 2  # first start + GLM5_START_RETRIES=1
    assert c.leftovers() == []


def test_sigterm_drain_is_bounded(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path, "slow-drain")
    containers.append(c)
    c.wait_healthy()
    began = time.monotonic()
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=30) == 0
    elapsed = time.monotonic() - began
    assert 2.5 <= elapsed < 10, f"stop took {elapsed:.1f}s with GLM5_DRAIN_SECONDS=3"
    assert "Gracefully exiting... Remaining number of requests 1" in c.output()
    assert c.leftovers() == []


def test_preflight_failure_stops_before_supervisord(tmp_path: Path, containers: list[Container]) -> None:
    c = start(tmp_path, GLM5_SKIP_PREFLIGHT="gpu,shm,flashinfer,flags", GLM5_MODEL_DIR=str(tmp_path / "none"))
    containers.append(c)
    assert c.proc.wait(timeout=30) == 30
    assert "hf download nvidia/GLM-5-NVFP4" in c.entrypoint_output.read_text()
    assert not c.log.exists()


def test_entrypoint_runs_other_commands(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(ROOT / "entrypoint/entrypoint.sh"),
            str(ROOT / "entrypoint/launch"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        env=os.environ | {"GLM5_HOME": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0 and "sglang.launch_server" in done.stdout


def test_supervisord_reads_every_key_in_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """supervisord ignores unknown keys silently: every key must be one its own loader asks for."""
    from supervisor import options

    asked: set[tuple[str, str]] = set()
    original = options.UnhosedConfigParser.get

    def recording(
        self: configparser.RawConfigParser, section: str, option: str, *a: object, **kw: object
    ) -> object:
        asked.add((section, option))
        return original(self, section, option, *a, **kw)

    monkeypatch.setattr(options.UnhosedConfigParser, "get", recording)
    for key in ("LOG_DIR", "STATE_DIR"):
        (tmp_path / key).mkdir()
        monkeypatch.setenv(f"GLM5_{key}", str(tmp_path / key))
    for key, value in {
        "HOME": "/opt/glm5",
        "START_SECONDS": "5",
        "START_RETRIES": "2",
        "DRAIN_SECONDS": "3",
    }.items():
        monkeypatch.setenv(f"GLM5_{key}", value)
    monkeypatch.setenv("GLM5_LOG_MAX_BYTES", "1000")
    monkeypatch.setenv("GLM5_LOG_BACKUPS", "2")
    options.ServerOptions().realize(args=["-c", str(CONF)])
    options.ClientOptions().realize(args=["-c", str(CONF)])
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";", "#"), strict=False)
    parser.read(CONF)
    unread = [
        (s, k)
        for s in parser.sections()
        if not s.startswith("rpcinterface:")
        for k in parser.options(s)
        if (s, k) not in asked
    ]
    assert unread == [], f"supervisord would ignore these keys: {unread}"


def test_drain_bound_matches_the_configuration() -> None:
    parser = configparser.RawConfigParser(inline_comment_prefixes=(";",), strict=False)
    parser.read(CONF)
    program = parser["program:sglang"]
    assert program["stopwaitsecs"] == "%(ENV_GLM5_DRAIN_SECONDS)s"
    assert program["stopasgroup"] == "true" and program["killasgroup"] == "true"
    assert program["stdout_logfile_maxbytes"] == "%(ENV_GLM5_LOG_MAX_BYTES)s"


def test_serve_takes_no_arguments(tmp_path: Path) -> None:
    """Arguments after serve were dropped silently; now they are refused with where the flags belong."""
    done = subprocess.run(
        [str(ROOT / "entrypoint/entrypoint.sh"), "serve", "--max-running-requests", "64"],
        capture_output=True,
        text=True,
        env=os.environ | {"GLM5_HOME": str(ROOT)},
        check=False,
    )
    assert done.returncode == 2
    assert (
        "serve takes no arguments (got: --max-running-requests 64); put sglang flags in GLM5_EXTRA_ARGS"
        in done.stderr
    )


def test_paths_with_spaces(tmp_path: Path, containers: list[Container]) -> None:
    """Log and state folders with spaces: supervisord's commands, the log tail and the probe cope."""
    home = tmp_path / "a folder with spaces"
    home.mkdir()
    c = start(home)
    containers.append(c)
    c.wait_healthy()
    assert (home / "log" / "server.log").exists() and (home / "run" / "launch.json").exists()
    deadline = time.monotonic() + 10  # tail -F polls once a second
    while "The server is fired up" not in c.entrypoint_output.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "The server is fired up" in c.entrypoint_output.read_text()  # logtail followed the spaced path
