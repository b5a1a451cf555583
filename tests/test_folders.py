"""The state and log folders (GLM5_STATE_DIR, GLM5_LOG_DIR): every tool that writes there creates a missing one
where its parent allows, and refuses one it cannot use with exit 3 and a line naming the setting and the fix,
never a traceback. Each writer is run as its executable: launch (--prepare, --serve, --supervisor-env), on-fatal,
the exporter and entrypoint.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from common.report import INVALID_SETTING
from conftest import ROOT, appeared, image_folders, kit_env
from entrypoint import state
from helpers.unprivileged import reachable_copy

WRITERS = {
    "launch --prepare": ["entrypoint/launch", "--prepare"],
    "launch --serve": ["entrypoint/launch", "--serve"],
    "launch --supervisor-env": ["entrypoint/launch", "--supervisor-env"],
    "on-fatal": ["entrypoint/on-fatal"],
    "exporter": ["monitoring/exporter", "--once"],
}


def run(argv: list[str], root: Path = ROOT, prefix: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
    full = kit_env(GLM5_SKIP_PREFLIGHT="all", GLM5_SERVER_PROGRAM="true") | env
    return subprocess.run(
        [*prefix, str(root / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        env=full,
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


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("name", sorted(state.FOLDERS))
def test_every_writer_refuses_a_folder_under_a_regular_file(tmp_path: Path, writer: str, name: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    folder = blocker / "glm5"  # NotADirectoryError before this check
    refused(run(WRITERS[writer], **{name: str(folder)}), name, folder)


@pytest.mark.parametrize("name", sorted(state.FOLDERS))
def test_a_regular_file_in_the_folders_place_is_refused(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "glm5"
    folder.write_text("not a folder\n")
    refused(run(WRITERS["launch --prepare"], **{name: str(folder)}), name, folder)


def test_launch_prepare_creates_both_folders_and_records_there(tmp_path: Path) -> None:
    """The fresh machine's case (issue: CI red on a fresh machine): neither folder exists yet."""
    run_dir, log_dir = tmp_path / "new" / "run", tmp_path / "new" / "log"
    done = run(WRITERS["launch --prepare"], GLM5_STATE_DIR=str(run_dir), GLM5_LOG_DIR=str(log_dir))
    assert done.returncode == 0, done.stderr
    assert (run_dir / state.DOCTOR).is_file() and log_dir.is_dir()


def test_on_fatal_creates_a_missing_state_folder_before_it_records(tmp_path: Path) -> None:
    run_dir = tmp_path / "gone" / "run"
    event = "processname:sglang groupname:sglang from_state:BACKOFF pid:1"
    header = f"ver:3.0 server:supervisor serial:1 pool:fatal poolserial:1 eventname:PROCESS_STATE_FATAL len:{len(event)}\n"
    listener = subprocess.Popen(  # under a shell that ignores the SIGTERM on-fatal sends its parent (supervisord)
        ["bash", "-c", 'trap "" TERM; "$0"; :', str(ROOT / "entrypoint/on-fatal")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kit_env(GLM5_STATE_DIR=str(run_dir)),
    )
    assert listener.stdin is not None and listener.stdout is not None
    assert listener.stdout.readline() == "READY\n"
    listener.stdin.write(header + event)
    listener.stdin.flush()
    assert listener.stdout.read(len("RESULT 2\nOK")) == "RESULT 2\nOK"
    listener.kill()
    listener.wait()
    failed = state.read_failed(run_dir)
    assert failed is not None and failed["code"] == 70


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop to UID 1000")
@pytest.mark.parametrize("name", sorted(state.FOLDERS))
def test_a_folder_the_user_cannot_write_is_refused(tmp_path: Path, name: str) -> None:
    """As the image's UID 1000 (root writes anywhere): a folder owned by root, mode 0755."""
    copy = reachable_copy("common", "entrypoint", "healthcheck")
    try:
        folder = copy / "owned-by-root"
        folder.mkdir(mode=0o755)
        prefix = ("setpriv", "--reuid=1000", "--regid=1000", "--clear-groups")
        home = {"HOME": str(copy), "GLM5_STATE_DIR": str(copy / "run"), "GLM5_LOG_DIR": str(copy / "log")}
        (copy / "run").mkdir(mode=0o777)
        (copy / "log").mkdir(mode=0o777)
        done = run(WRITERS["launch --prepare"], copy, prefix, **(home | {name: str(folder)}))
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
