"""entrypoint.sh + the real supervisord running the SGLang server test double: start, restart, FATAL, stop."""

from __future__ import annotations

import configparser
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, healthcheck_json, kit_env
from helpers.container import POLL, Container, start

pytestmark = pytest.mark.boots  # boots processes or runs real tools: not in ci/test --fast

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
    c = start(tmp_path, "crash-loading", GLM5_ON_FAILURE="exit")
    containers.append(c)
    assert c.proc.wait(timeout=60) == 70
    assert "2 starts in a row ended before they were verified" in c.entrypoint_output.read_text()
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


def test_preflight_failure_starts_no_server(tmp_path: Path, containers: list[Container]) -> None:
    c = start(
        tmp_path,
        GLM5_SKIP_PREFLIGHT="gpu,shm,flashinfer,flags",
        GLM5_MODEL_DIR=str(tmp_path / "none"),
        GLM5_ON_FAILURE="exit",
    )
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
        env=kit_env(GLM5_HOME=str(ROOT)),
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
    # The environment entrypoint.sh gives supervisord: launch --supervisor-env's lines, and GLM5_HOME.
    lines = subprocess.run(
        [str(ROOT / "entrypoint/launch"), "--supervisor-env"],
        env=kit_env(GLM5_LOG_MAX_BYTES="1048576", GLM5_LOG_BACKUPS="2"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    monkeypatch.setenv("GLM5_HOME", "/opt/glm5")
    for line in lines:
        monkeypatch.setenv(*line.split("=", 1))
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
    assert program["stopwaitsecs"] == "%(ENV_SV_DRAIN_SECONDS)s"
    # SIGTERM to the server alone (it drains and stops its schedulers), the group killed only at the bound.
    assert program["stopasgroup"] == "false" and program["killasgroup"] == "true"
    assert program["stdout_logfile_maxbytes"] == "%(ENV_SV_LOG_MAX_BYTES)s"


def test_serve_takes_no_arguments(tmp_path: Path) -> None:
    """Arguments after serve were dropped silently; now they are refused with where the flags belong."""
    done = subprocess.run(
        [str(ROOT / "entrypoint/entrypoint.sh"), "serve", "--max-running-requests", "64"],
        capture_output=True,
        text=True,
        env=kit_env(GLM5_HOME=str(ROOT)),
        check=False,
    )
    assert done.returncode == 2
    assert (
        "serve takes no arguments (got: --max-running-requests 64); put sglang flags in GLM5_EXTRA_ARGS"
        in done.stderr
    )


def test_paths_with_spaces(tmp_path: Path, containers: list[Container]) -> None:
    """Log and state folders with spaces: supervisord's commands, the log tail and the probe cope."""
    # short: supervisord's socket path has a limit
    home = Path(tempfile.mkdtemp(prefix="a folder with spaces "))
    c = start(home)
    containers.append(c)
    c.wait_healthy()
    assert (home / "log" / "server.log").exists() and (home / "run" / "launch.json").exists()
    deadline = time.monotonic() + 10  # tail -F polls once a second
    while "The server is fired up" not in c.entrypoint_output.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "The server is fired up" in c.entrypoint_output.read_text()  # logtail followed the spaced path


def stream_in_background(port: int, out: list[str]) -> threading.Thread:
    """A streaming chat request of 60 chunks (slow-stream: 3 s), its SSE lines collected in `out`."""

    def run() -> None:
        body = json.dumps(
            {
                "model": "glm-5",
                "messages": [{"role": "user", "content": "Count to 60"}],
                "stream": True,
                "max_tokens": 60,
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                out.extend(line.decode().strip() for line in response if line.strip())
        except OSError as err:
            out.append(f"cut: {err}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_in_flight_stream_completes_when_the_container_stops(
    tmp_path: Path, containers: list[Container]
) -> None:
    """docker stop during a streaming request: SGLang's drain finishes it; the schedulers are not cut first."""
    c = start(tmp_path, "slow-stream", GLM5_DRAIN_SECONDS="30")
    containers.append(c)
    c.wait_healthy()
    lines: list[str] = []
    thread = stream_in_background(c.port, lines)
    deadline = time.monotonic() + 10
    while not lines and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lines, "the stream did not start"
    c.proc.send_signal(signal.SIGTERM)
    thread.join(timeout=30)
    assert lines[-1] == "data: [DONE]", lines[-3:]
    assert '"finish_reason": "stop"' in lines[-2]
    assert c.proc.wait(timeout=30) == 0
    log = c.output()
    assert (
        "Draining requests and shutting down" in log
        and "Gracefully exiting... Remaining number of requests 1" in log
    )
    assert c.leftovers() == []


def test_a_stop_during_preflight_is_prompt(tmp_path: Path, containers: list[Container]) -> None:
    """PID 1 passes SIGTERM on from the first moment: a slow preflight (here nvidia-smi hanging) stops at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexec sleep 60\n")  # one process, as the real binary is
    (bin_dir / "nvidia-smi").chmod(0o755)
    c = start(
        tmp_path,
        GLM5_SKIP_PREFLIGHT="shm,model,flashinfer,flags",
        PATH=f"{bin_dir}:{os.environ['PATH']}",
    )
    containers.append(c)
    deadline = time.monotonic() + 20
    while not any("sleep" in argv for argv in c.commands()) and time.monotonic() < deadline:
        time.sleep(0.1)
    began = time.monotonic()
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=15) == 0
    # Not the 60 s of the hung nvidia-smi: supervisord stops its programs one priority at a time (about a second each)
    assert time.monotonic() - began < 10
    assert "spawned: 'sglang'" not in c.entrypoint_output.read_text()  # the server never started
    assert not c.log.exists() and c.leftovers() == []


def test_a_stop_during_capture_is_prompt_and_leaves_nothing(
    tmp_path: Path, containers: list[Container]
) -> None:
    """Before its first request SGLang has no drain handler: SIGTERM ends the main process, the schedulers follow
    (PR_SET_PDEATHSIG) and launch reaps the rest; nothing to drain, nothing left behind."""
    # capture takes ~30 s; a drain bound far above a prompt stop's time (1-5 s, 5.3 s seen on 2 loaded cores), so
    # a stop that waited for a drain (or was killed at the bound) cannot pass for a prompt one
    c = start(tmp_path, SGLANG_DOUBLE_TICK="0.2", GLM5_DRAIN_SECONDS="40")
    containers.append(c)
    deadline = time.monotonic() + 30
    while "Capturing prefill shape" not in c.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    began = time.monotonic()
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=30) == 0
    assert time.monotonic() - began < 15
    assert "Gracefully exiting" not in c.output()
    assert c.leftovers() == []


def test_the_api_key_is_in_no_argv_no_log_and_no_state_file(
    tmp_path: Path, containers: list[Container]
) -> None:
    """SGLang 0.5.23 logs server_args with api_key in clear and takes --api-key on its command line: the key must
    still appear in no process's argv, no log the kit writes, no state file, and the key file must go at stop."""
    key = "k-5ecret-7e57-value"
    c = start(tmp_path, GLM5_API_KEY=key)
    containers.append(c)
    c.wait_healthy()
    assert readiness_ok_with_key(c.port, key)
    argvs = c.commands()
    assert argvs and not [a for a in argvs if key in a], argvs
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=30) == 0
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert [p for p in written if key.encode() in p.read_bytes()] == []
    assert "server_args={" in c.output() and "'api_key': '<redacted>'" in c.output()
    assert not list((tmp_path / "run").glob("*.yaml"))  # the private config file is removed at exit


def readiness_ok_with_key(port: int, key: str) -> bool:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return bool(response.status == 200)


def probe_json(c: Container, *args: str) -> tuple[int, dict[str, Any]]:
    return healthcheck_json(c.target.env, *args)


def wait_for_recorded_failure(c: Container) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        _, found = probe_json(c)
        if found.get("failed_code") is not None:  # the key is always there; None until recorded
            return found
        assert c.proc.poll() is None, f"the container exited ({c.proc.poll()}) instead of waiting"
        assert time.monotonic() < deadline, found
        time.sleep(POLL)


def test_a_server_that_keeps_failing_stays_up_failed_instead_of_reloading(
    tmp_path: Path, containers: list[Container]
) -> None:
    """GLM5_ON_FAILURE=wait (the default): after FATAL the container waits, unhealthy, with the reason; no restart
    policy sees an exit, so the weights are loaded 1 + GLM5_START_RETRIES times in all, not forever."""
    c = start(tmp_path, "crash-loading")
    containers.append(c)
    found = wait_for_recorded_failure(c)
    assert found["phase"] == "failed" and found["failed_code"] == 70
    assert "GLM5_START_RETRIES=1" in found["reason"] and "TllmGenFmhaRunner" in found["reason"]
    assert probe_json(c)[0] == 1  # not ready
    assert probe_json(c, "--live")[0] == 0  # and not restarted: a restart cannot fix it
    # the start is over: the startup budget does not restart it either
    assert probe_json(c, "--started")[0] == 0
    time.sleep(2)
    assert c.proc.poll() is None and c.output().count("glm5-serve: server start #") == 2
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=15) == 70  # the code, at the stop
    assert c.leftovers() == []


def test_an_empty_model_folder_is_one_clear_message_and_no_loop(
    tmp_path: Path, containers: list[Container]
) -> None:
    """What Docker leaves when GLM5_MODEL_HOST_DIR does not exist on the host: an empty folder."""
    empty = tmp_path / "models"
    empty.mkdir()
    c = start(tmp_path, GLM5_SKIP_PREFLIGHT="gpu,shm,flashinfer,flags", GLM5_MODEL_DIR=str(empty))
    containers.append(c)
    found = wait_for_recorded_failure(c)
    assert found["failed_code"] == 30
    assert found["reason"].startswith(f"preflight: GLM5_MODEL_HOST_DIR: {empty} is empty")
    assert "docker compose run --rm download" in found["reason"] and "hf download" in found["reason"]
    assert not c.log.exists()  # no server was started, so nothing was loaded
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=15) == 30
