"""Every state of a start is observable: the real entrypoint.sh and supervisord boot the server double into
starting, ready, each failure (an invalid setting, preflight, FATAL) and stopping, and in each the exporter answers
on its port and `healthcheck --status` explains. A failure waits with supervisord and the exporter up
(GLM5_ON_FAILURE=wait) and the container exits with the recorded code once stopped; with =exit it exits at once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from configuration import state
from conftest import ROOT, image_folders
from helpers.container import Container, free_port, start, stop_inside
from helpers.container import exporter_samples as scrape
from helpers.sandbox import NEEDS_BWRAP, sandbox, with_image_folders

pytestmark = pytest.mark.boots  # each test boots supervisord and the double

NO_MODEL = {"GLM5_SKIP_PREFLIGHT": "gpu,shm,flashinfer,flags"}


def phase(samples: dict[str, float]) -> str | None:
    return next((k.split('"')[1] for k, v in samples.items() if k.startswith("glm5_start_phase") and v), None)


def wait_for_failure(c: Container, port: int, code: int, timeout: float = 60) -> dict[str, float]:
    """Scrape until the phase is failed with this code (a crashing start reads failed from its log before FATAL)."""
    deadline, seen = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            samples = scrape(port)
        except OSError:
            samples = {}
        seen = phase(samples), samples.get("glm5_start_failure_code{}")
        if seen == ("failed", code):
            return samples
        assert c.proc.poll() is None, f"the container exited ({c.proc.poll()}) in phase {seen}"  # type: ignore[attr-defined]
        time.sleep(0.3)
    raise AssertionError(
        f"phase and code {seen}, not failed {code}, after {timeout}s:\n{c.entrypoint_output.read_text()}"
    )


def status(c: Container, wrapper: tuple[str, ...] = ()) -> str:
    done = subprocess.run(
        [*wrapper, str(ROOT / "healthcheck/healthcheck"), "--status"],
        env=c.target.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout + done.stderr


def boot(tmp: Path, mode: str = "ok", wrapper: tuple[str, ...] = (), **env: str) -> tuple[Container, int]:
    port = free_port()
    return start(tmp, mode, wrapper, GLM5_EXPORTER_PORT=str(port), **env), port


def stop(c: Container) -> int:
    c.proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    return int(c.proc.wait(timeout=30))  # type: ignore[attr-defined]


def test_starting_then_ready_then_stopping_each_answers(tmp_path: Path, containers: list[Container]) -> None:
    c, port = boot(tmp_path, "slow-drain", SGLANG_DOUBLE_TICK="0.05")
    containers.append(c)
    phases = set()
    deadline = time.monotonic() + 90
    while phase(samples := scrape_when_up(port, deadline)) != "ready":
        phases.add(phase(samples))
        time.sleep(0.2)
    assert phases - {None, "ready"}, "no scrape before ready saw the start"
    assert "Capture" in status(c) or "ready" in status(c)
    c.proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    time.sleep(1)  # the server drains a request that never ends, for GLM5_DRAIN_SECONDS (3 s)
    assert c.proc.poll() is None and scrape(port), "the exporter stopped before the server's drain ended"  # type: ignore[attr-defined]
    assert c.proc.wait(timeout=30) == 0  # type: ignore[attr-defined]


def scrape_when_up(port: int, deadline: float) -> dict[str, float]:
    while True:
        try:
            return scrape(port)
        except OSError:
            assert time.monotonic() < deadline, "the exporter never answered"
            time.sleep(0.2)


@pytest.mark.parametrize(
    ("why", "mode", "env", "code", "explained"),
    [
        ("invalid setting", "ok", {"GLM5_MEM_FRACTION_STATIC": "lots"}, 3, "GLM5_MEM_FRACTION_STATIC"),
        ("preflight", "ok", NO_MODEL, 30, "hf download nvidia/GLM-5-NVFP4"),
        ("FATAL", "crash-loading", {}, 70, "2 starts in a row ended before they were verified"),
        # Judged from the log while the server keeps running: it exited 0 once (nothing recorded it).
        ("short capture", "short-capture", {}, 74, "decode CUDA graphs: captured"),
    ],
)
def test_a_failure_waits_scraped_and_explained_then_exits_with_its_code(
    tmp_path: Path,
    containers: list[Container],
    why: str,
    mode: str,
    env: dict[str, str],
    code: int,
    explained: str,
) -> None:
    if why == "preflight":
        env = env | {"GLM5_MODEL_DIR": str(tmp_path / "none")}
    c, port = boot(tmp_path, mode, **env)
    containers.append(c)
    wait_for_failure(c, port, code)
    said = status(c)
    assert "failed" in said and explained in said, said
    time.sleep(1)
    assert c.proc.poll() is None, "a failure a restart cannot fix must wait, not exit into a restart loop"  # type: ignore[attr-defined]
    assert phase(scrape(port)) == "failed"
    assert stop(c) == code


@pytest.mark.parametrize(("env", "code"), [({"GLM5_MEM_FRACTION_STATIC": "lots"}, 3), (NO_MODEL, 30)])
def test_with_on_failure_exit_the_container_exits_at_once_with_the_code(
    tmp_path: Path, containers: list[Container], env: dict[str, str], code: int
) -> None:
    env = env | {"GLM5_MODEL_DIR": str(tmp_path / "none"), "GLM5_ON_FAILURE": "exit"}
    c, _port = boot(tmp_path, **env)
    containers.append(c)
    assert c.proc.wait(timeout=30) == code  # type: ignore[attr-defined]
    assert "spawned: 'sglang'" not in c.entrypoint_output.read_text()


def test_with_on_failure_exit_a_restarted_container_keeps_the_bound_and_starts_nothing(
    tmp_path: Path, containers: list[Container]
) -> None:
    """Issue 52: compose's state folder is a tmpfs, new at each restart of the container, and the count of starts
    that ended before they were verified lived there: with GLM5_ON_FAILURE=exit and `restart: unless-stopped` each
    restart made GLM5_START_RETRIES + 1 more starts (on the box as many loads of 410 GB), without end. Docker's
    restart here: the same log folder (compose's volume), a new state folder."""
    first, _port = boot(tmp_path, "crash-loading", GLM5_ON_FAILURE="exit")
    containers.append(first)
    assert first.proc.wait(timeout=60) == 70  # type: ignore[attr-defined]
    starts = first.log.read_text().count(state.MARKER_TEXT)
    assert starts == 2  # the first start and GLM5_START_RETRIES=1
    for _restart in range(2):
        shutil.rmtree(tmp_path / "run")  # the tmpfs goes with the container
        said = first.entrypoint_output.stat().st_size
        again, _port = boot(tmp_path, "crash-loading", GLM5_ON_FAILURE="exit")
        containers.append(again)
        assert again.proc.wait(timeout=60) == 70  # type: ignore[attr-defined]
        shown = again.entrypoint_output.read_text()[said:]
        assert again.log.read_text().count(state.MARKER_TEXT) == starts, f"the server started again:\n{shown}"
        assert "spawned: 'sglang'" not in shown
        assert "counted across this container's restarts" in shown and "--force-recreate" in shown, shown


@NEEDS_BWRAP
@pytest.mark.parametrize("name", ["GLM5_STATE_DIR", "GLM5_LOG_DIR"])
def test_an_unusable_folder_falls_back_to_the_images_and_is_reported_there(
    tmp_path: Path, containers: list[Container], name: str
) -> None:
    """supervisord's own folders: one set that cannot be used gives way to glm5.toml's default (the image's, here
    a folder of the test's in a read-only root), so supervisord, the exporter and the healthcheck still run and
    report the invalid setting with its fix."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    folders = image_folders()
    wrapper = with_image_folders(sandbox(ROOT, ("rw", tmp_path)), tmp_path, folders)
    aimed = {"GLM5_STATE_DIR": str(tmp_path / "run"), "GLM5_LOG_DIR": str(tmp_path / "log")}
    c, port = boot(tmp_path, wrapper=wrapper, **(aimed | {name: str(blocker / "glm5")}))
    containers.append(c)
    wait_for_failure(c, port, 3)
    said = status(c, wrapper)
    assert f"{name}={blocker / 'glm5'}: cannot create it or write to it" in said, said
    assert "mount a writable folder there" in c.entrypoint_output.read_text()  # docker logs names the fix too
    recorded = tmp_path / ("run-glm5" if name == "GLM5_STATE_DIR" else "run") / "failed.json"
    assert json.loads(recorded.read_text())["code"] == 3  # the state folder's fallback, when it was the one
    assert stop_inside(c) == 3


def test_a_hung_start_is_restarted_inside_the_container_then_recorded_when_it_hangs_again(
    tmp_path: Path, containers: list[Container]
) -> None:
    """Docker never restarts an unhealthy container: the lifecycle listener's stall watchdog (TICK_5) does, with the
    healthcheck's own decision. The stall is the log's age: set back by two minutes past GLM5_STALL_SECONDS (60)."""
    c, port = boot(tmp_path, "hang-loading", GLM5_STALL_SECONDS="60")
    containers.append(c)
    deadline = time.monotonic() + 60
    while phase(scrape_when_up(port, deadline)) != "loading":
        assert time.monotonic() < deadline, c.entrypoint_output.read_text()
        time.sleep(0.2)
    log = c.tmp / "log" / "server.log"
    time.sleep(6)  # more than one tick: a silent but young start is left alone
    assert "restarting the server" not in c.entrypoint_output.read_text()
    starts = log.read_text().count("server_args=")
    past = time.time() - 180
    os.utime(log, (past, past))
    deadline = time.monotonic() + 30
    while "restarting the server" not in c.entrypoint_output.read_text():
        assert time.monotonic() < deadline, c.entrypoint_output.read_text()
        time.sleep(0.2)
    assert "no server log output for" in c.entrypoint_output.read_text()
    deadline = time.monotonic() + 30
    while log.read_text().count("server_args=") == starts:  # a new start writes the log again
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.2)
    time.sleep(6)
    assert c.entrypoint_output.read_text().count("restarting the server") == 1  # the new start is young again
    assert c.proc.poll() is None  # type: ignore[attr-defined]
    # It hangs again the same way: past GLM5_START_RETRIES (1) the kit records it and restarts it no more.
    os.utime(log, (time.time() - 180, time.time() - 180))
    samples = wait_for_failure(c, port, 73, timeout=30)
    assert (
        samples.get("glm5_start_hung{}") == 0
    )  # a recorded failure, not a hang: liveness passes, the pod waits
    assert (
        "2 starts in a row ended before they were verified (GLM5_START_RETRIES=1), the last hung" in status(c)
    )
    assert (
        subprocess.run(
            [str(ROOT / "healthcheck/healthcheck"), "--live"], env=c.target.env, timeout=60
        ).returncode
        == 0
    )
    time.sleep(6)
    assert c.entrypoint_output.read_text().count("restarting the server") == 1
    assert stop(c) == 73  # the container's exit code is the recorded failure's
