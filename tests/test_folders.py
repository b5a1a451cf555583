"""The state and log folders (GLM5_STATE_DIR, GLM5_LOG_DIR): every tool that writes there creates a missing one
where its parent allows, and names one it cannot use with a line naming the setting and the fix, never a
traceback. The server (launch --serve) refuses it with exit 3; what runs under supervisord before it (launch
--supervisor-env and --prepare, the lifecycle listener, the exporter) falls back to glm5.toml's folder, so the
failure is recorded and scraped there, and exits 3 only when that one cannot be used either. Each writer is run
as its executable; the fallback inside bubblewrap, so that nothing is made on this host's /run or /var/log."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from common.report import INVALID_SETTING
from configuration import settings, state
from conftest import ROOT, appeared, image_folders, kit_env
from entrypoint import lifecycle
from healthcheck import logscan, phase
from helpers.judging import observation
from helpers.sandbox import NEEDS_BWRAP, sandbox, with_image_folders
from helpers.unprivileged import reachable_copy

WRITERS = {
    "launch --prepare": ["entrypoint/launch", "--prepare"],
    "launch --supervisor-env": ["entrypoint/launch", "--supervisor-env"],
    "lifecycle": ["entrypoint/lifecycle"],
    "exporter": ["monitoring/exporter", "--once"],
}
SERVE = ["entrypoint/launch", "--serve"]


def run(
    argv: list[str], root: Path = ROOT, prefix: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    full = kit_env(GLM5_SKIP_PREFLIGHT="all", GLM5_SERVER_PROGRAM="true") | env
    return subprocess.run(
        [*prefix, str(root / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        env=full,
        cwd=root,  # python -m puts the working folder on the path: the kit's own, not the checkout
        stdin=subprocess.DEVNULL,
        check=False,
        timeout=120,
    )


def refused(done: subprocess.CompletedProcess[str], name: str, folder: Path) -> None:
    assert done.returncode == INVALID_SETTING, done.stderr
    assert f"{name}={folder}: cannot create it or write to it as UID" in done.stderr
    assert f"fix: mount a writable folder there, or set {name}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_folder_is_created_where_its_parent_allows(tmp_path: Path) -> None:
    for kind in ("STATE", "LOG"):
        folder = tmp_path / kind / "deeper" / "still"
        assert state.folder_problem(f"GLM5_{kind}_DIR", folder) is None
        assert folder.is_dir()


@pytest.mark.parametrize("name", sorted(state.FOLDERS))
def test_the_server_refuses_a_folder_under_a_regular_file(tmp_path: Path, name: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    folder = blocker / "glm5"  # NotADirectoryError before this check
    refused(run(SERVE, **{name: str(folder)}), name, folder)


@pytest.mark.parametrize("name", sorted(state.FOLDERS))
def test_the_server_refuses_a_regular_file_in_the_folders_place(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "glm5"
    folder.write_text("not a folder\n")
    refused(run(SERVE, **{name: str(folder)}), name, folder)


@NEEDS_BWRAP
@pytest.mark.boots
@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("name", sorted(state.FOLDERS))
def test_with_no_usable_fallback_every_writer_refuses_naming_both(
    tmp_path: Path, writer: str, name: str
) -> None:
    """In a read-only root without the image's folders: the folder set and glm5.toml's are both named."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    folder = blocker / "glm5"
    done = run(WRITERS[writer], prefix=sandbox(ROOT, ("rw", tmp_path)), **{name: str(folder)})
    refused(done, name, folder)
    default = settings.declarations()[name].default
    assert f"{name}={default}: cannot create it or write to it" in done.stderr


@NEEDS_BWRAP
@pytest.mark.boots
@pytest.mark.parametrize("name", sorted(state.FOLDERS))
def test_supervisord_is_given_the_images_folder_when_the_one_set_is_unusable(
    tmp_path: Path, name: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    wrapper = with_image_folders(sandbox(ROOT, ("rw", tmp_path)), tmp_path, image_folders())
    done = run(WRITERS["launch --supervisor-env"], prefix=wrapper, **{name: str(blocker / "glm5")})
    assert done.returncode == 0, done.stderr
    key = f"SV_{state.FOLDERS[name].upper()}"
    assert f"{key}={settings.declarations()[name].default}" in done.stdout.splitlines()


def test_an_invalid_setting_gives_supervisord_its_default_and_preflight_records_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {"GLM5_STATE_DIR": str(run_dir), "GLM5_START_RETRIES": "many", "GLM5_DRAIN_SECONDS": "7"}
    lines = run(WRITERS["launch --supervisor-env"], **env).stdout.splitlines()
    assert f"SV_START_RETRIES={settings.declarations()['GLM5_START_RETRIES'].default}" in lines
    assert "SV_DRAIN_SECONDS=7" in lines and f"SV_STATE_DIR={run_dir}" in lines  # the valid ones as set
    done = run(WRITERS["launch --prepare"], **env)
    assert done.returncode == INVALID_SETTING and "GLM5_START_RETRIES" in done.stderr
    failed = state.read_failed(run_dir)
    assert (
        failed is not None and failed["code"] == INVALID_SETTING and "GLM5_START_RETRIES" in failed["reason"]
    )


def test_launch_prepare_creates_both_folders_and_records_there(tmp_path: Path) -> None:
    """The fresh machine's case (issue: CI red on a fresh machine): neither folder exists yet."""
    run_dir, log_dir = tmp_path / "new" / "run", tmp_path / "new" / "log"
    done = run(WRITERS["launch --prepare"], GLM5_STATE_DIR=str(run_dir), GLM5_LOG_DIR=str(log_dir))
    assert done.returncode == 0, done.stderr
    assert (run_dir / state.DOCTOR).is_file() and log_dir.is_dir()


class FakeSupervisor:
    """Records what the lifecycle listener asks of supervisord's XML-RPC, as supervisor 4.3.0 names it
    (supervisor/rpcinterface.py: startProcess(name, wait), stopProcess(name, wait), getProcessInfo(name) with its
    'exitstatus' and 'statename', shutdown()); the events' payload fields (processname; `expected` 0/1 on
    PROCESS_STATE_EXITED) are supervisor/events.py's."""

    def __init__(self, exitstatus: int = 0, statename: str = "RUNNING") -> None:
        self.calls: list[str] = []
        self.exitstatus = exitstatus
        self.statename = statename

    def startProcess(self, name: str, wait: bool) -> bool:
        self.calls.append(f"start {name}")
        return True

    def stopProcess(self, name: str, wait: bool) -> bool:
        self.calls.append(f"stop {name}")
        return True

    def getProcessInfo(self, name: str) -> dict[str, int | str]:
        return {"exitstatus": self.exitstatus, "statename": self.statename}

    def shutdown(self) -> bool:
        self.calls.append("shutdown")
        return True


def listener_values(folder: Path, retries: int, on_failure: str = "wait") -> dict[str, Any]:
    """What entrypoint/lifecycle's watch reads of the settings: the state and log folders (one folder here), the
    retries and GLM5_ON_FAILURE."""
    return {
        "state_dir": str(folder),
        "log_dir": str(folder),
        "start_retries": retries,
        "on_failure": on_failure,
    }


def folders(tmp: Path) -> dict[str, str]:
    return {"GLM5_STATE_DIR": str(tmp / "gone" / "run"), "GLM5_LOG_DIR": str(tmp / "log")}


def test_the_listener_records_a_fatal_server_in_a_state_folder_it_made(tmp_path: Path) -> None:
    values, problems = state.supervised(folders(tmp_path))
    assert problems == [] and (tmp_path / "gone" / "run").is_dir()
    rpc = FakeSupervisor()
    lifecycle.on_event("PROCESS_STATE_FATAL", {"processname": "sglang"}, values, rpc)
    failed = state.read_failed(values["state_dir"])
    assert failed is not None and failed["code"] == 70 and rpc.calls == []  # GLM5_ON_FAILURE=wait: stays up
    assert (failed["kind"], failed["start"]) == (
        "exited",
        0,
    )  # no start made: the record names the latest, none
    lifecycle.on_event("PROCESS_STATE_FATAL", {"processname": "sglang"}, values | {"on_failure": "exit"}, rpc)
    assert rpc.calls == []  # given up already: one record, one decision
    state.clear_failed(values["state_dir"])
    lifecycle.on_event("PROCESS_STATE_FATAL", {"processname": "sglang"}, values | {"on_failure": "exit"}, rpc)
    assert rpc.calls == ["shutdown"]


def test_the_listener_starts_the_server_only_after_preflight_passed(tmp_path: Path) -> None:
    values, _ = state.supervised(folders(tmp_path))
    rpc = FakeSupervisor(exitstatus=31)
    lifecycle.on_event("PROCESS_STATE_EXITED", {"processname": "exporter", "expected": "1"}, values, rpc)
    assert rpc.calls == []
    lifecycle.on_event("PROCESS_STATE_EXITED", {"processname": "preflight", "expected": "0"}, values, rpc)
    # preflight died before recording: its code, where to look
    failed = state.read_failed(values["state_dir"])
    assert rpc.calls == [] and failed is not None and failed["code"] == 31
    lifecycle.on_event("PROCESS_STATE_EXITED", {"processname": "preflight", "expected": "1"}, values, rpc)
    assert rpc.calls == ["start sglang"]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to UID 1000"
)
@pytest.mark.parametrize("name", sorted(state.FOLDERS))
def test_a_folder_the_user_cannot_write_is_refused(tmp_path: Path, name: str) -> None:
    """As the image's UID 1000 (root writes anywhere): a folder owned by root, mode 0755."""
    copy = reachable_copy("common", "configuration", "entrypoint", "healthcheck", "kernels")
    try:
        folder = copy / "owned-by-root"
        folder.mkdir(mode=0o755)
        prefix = ("setpriv", "--reuid=1000", "--regid=1000", "--clear-groups")
        home = {"HOME": str(copy), "GLM5_STATE_DIR": str(copy / "run"), "GLM5_LOG_DIR": str(copy / "log")}
        (copy / "run").mkdir(mode=0o777)
        (copy / "log").mkdir(mode=0o777)
        done = run(SERVE, copy, prefix, **(home | {name: str(folder)}))
        refused(done, name, folder)
        assert "as UID 1000" in done.stderr
    finally:
        shutil.rmtree(copy)


def test_the_run_check_names_an_image_folder_that_appeared(tmp_path: Path) -> None:
    """The check over the whole run (conftest.pytest_sessionfinish) on folders of this test's: only one absent
    at the start and present at the end is named; /models and /cache are not watched."""
    was_absent, stays_absent = tmp_path / "run-glm5", tmp_path / "var-log-glm5"
    assert appeared([was_absent, stays_absent]) == []
    was_absent.mkdir()
    assert appeared([was_absent, stays_absent]) == [was_absent]
    assert [str(f) for f in image_folders()] == ["/run/glm5", "/var/log/glm5"]


def test_a_state_folder_too_long_for_supervisords_socket_is_named(tmp_path: Path) -> None:
    folder = tmp_path / ("x" * (state.SOCKET_PATH_MAX - len(str(tmp_path)) - len(state.SOCKET)))
    problem = state.folder_problem("GLM5_STATE_DIR", folder)
    assert problem is not None and "too long for supervisord's socket" in str(problem)
    assert state.folder_problem("GLM5_STATE_DIR", folder.with_name("short")) is None


def test_the_watchdog_restarts_a_running_server_only_when_its_start_is_hung(tmp_path: Path) -> None:
    judged = phase.judge(observation(logscan.Scan(), verify="off"))
    hung = judged._replace(hung=True, reason="no server log output for 1900 s while loading")
    progressing = judged._replace(hung=False, reason="loading")
    for statename, found, calls in (
        ("RUNNING", progressing, []),
        ("STARTING", hung, ["stop sglang", "start sglang"]),
        ("RUNNING", hung, ["stop sglang", "start sglang"]),
        ("STOPPED", hung, []),  # preflight still running, or the server stopped: nothing to watch
        ("FATAL", hung, []),  # gave up: the failure waits for a fix
    ):
        rpc = FakeSupervisor(statename=statename)
        acted = lifecycle.watch(listener_values(tmp_path, 5), rpc, lambda found=found: found)
        assert acted == (lifecycle.RESTARTED if calls else None), statename
        assert rpc.calls == calls, statename
