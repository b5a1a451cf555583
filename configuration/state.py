"""The state contract between the kit's processes: the files in the state directory (GLM5_STATE_DIR) and
the start marker line in the server log. Only this module names them.

| file / line | written by | read by | what |
|---|---|---|---|
| `starts` | launch --serve | launch --serve | how many starts this container has made (the number in the marker) |
| `launch.json` | launch --serve, at each start | healthcheck, ci tools, people | the effective configuration of the current start (argv with secrets redacted, env, expected graph counts, port, log dir, health timeout), its start number, pid and time |
| `capture.json` | entrypoint/lifecycle (its TICK_5, the one writer: the one prober that runs under supervisord all the time, every 5 s, whether anyone asks or not) | every prober (the healthcheck, the exporter, the gate, the bundle) | what the log said of a start once its capture is done or it is ready, with its drain and what ended it merged in later (the log's tail window and its rotation lose the start's own lines); written only when it changes |
| `stopped.json` | launch --serve, when it passes a SIGTERM or SIGINT on to the server | every prober | `{"start", "signal", "at"}`: the start was told to stop (a container stop, supervisord's stop, the stall watchdog's restart); a start that reached ready reads draining from then on, even before the server logs its drain |
| `failed.json` | launch --prepare (an invalid setting, preflight), entrypoint/lifecycle (FATAL) | healthcheck, the exporter, entrypoint.sh (its exit code), people | a failure a restart cannot fix: `{"code", "reason", "at"}`; the container stays up showing it (GLM5_ON_FAILURE=wait); removed at the next prepare |
| `hangs.json` | entrypoint/lifecycle (its stall watchdog) | entrypoint/lifecycle, people | `{"starts": [N, ...], "last": reason}`: the starts in a row that hung; past GLM5_START_RETRIES the kit records the failure (exit code 73) instead of restarting again; removed once a start is ready. It survives a container restart where the state folder does (the pod's emptyDir; compose's tmpfs only within the container's life) |
| `doctor.json` | launch --prepare | launch --serve (into launch.json as `doctor_warnings`) | the doctor's warnings about this box |
| `verified.json` | verify/gate (after each start's warm-up) | healthcheck, the exporter, people | the start's verification: `{"start", "build_id", "passed", "accuracy", "reasons", "regressed", "results"}` (verify/run.py's summary); a start counts as ready only once its own is there and passed (GLM5_VERIFY) |
| `server-config.yaml` | launch --serve | the server (`--config`) | options that must be on no command line (the API key); mode 0600, removed when the server exits; the state dir is a tmpfs in compose and the pod |
| `supervisord.pid`, `supervisor.sock` | supervisord | supervisorctl | supervisord's own (named in supervisord.conf) |
| marker line in server.log | launch --serve | healthcheck (logscan) | `===== glm5-serve: server start #N at ISO-TIME pid P: ... =====`: everything after the last marker is the current start |

A record belongs to the current start only when its `start` equals the marker's number: a launch.json
or capture.json of an earlier start is never used for the current one. Stdlib only, cheap to import.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.report import Problem, Problems
from configuration import settings

SERVER_LOG = (
    "server.log"  # in GLM5_LOG_DIR: written by supervisord (the server's output), read by the healthcheck
)
LAUNCH = "launch.json"
CAPTURE = "capture.json"
STOPPED = "stopped.json"
HANGS = "hangs.json"
STARTS = "starts"
SERVER_CONFIG = "server-config.yaml"
FAILED = "failed.json"
DOCTOR = "doctor.json"
VERIFIED = "verified.json"  # the verification of the latest start (verify/gate.py)
FILES = (STARTS, LAUNCH, CAPTURE, STOPPED, HANGS, SERVER_CONFIG, FAILED, DOCTOR, VERIFIED)
MARKER_TEXT = "glm5-serve: server start #"
MARKER = re.compile(
    rb"glm5-serve: server start #(\d+) at (\S+)(?: pid \d+: decode graphs expected (\d+), prefill (\d+))?"
)


def marker_line(start: int, started_at: str, pid: int, decode_expected: int, prefill_expected: int) -> str:
    return (
        f"===== {MARKER_TEXT}{start} at {started_at} pid {pid}: decode graphs expected "
        f"{decode_expected}, prefill {prefill_expected} ====="
    )


SOCKET = "supervisor.sock"  # supervisord's, in the state folder (supervisord.conf)
SOCKET_PATH_MAX = 107  # a Unix socket's path (sun_path is 108 bytes with its terminating NUL)
# The folders the kit writes, by setting: what every writer checks before it writes (require_folders).
FOLDERS = {"GLM5_STATE_DIR": "state_dir", "GLM5_LOG_DIR": "log_dir"}


def folder_problem(name: str, folder: str | Path, create: bool = True) -> Problem | None:
    """Create the folder where its parent allows; a Problem (exit 3) when it is not a folder or not writable.
    With create=False (a reader: the healthcheck) a folder not made yet is no problem, one in a file's place is."""
    where = Path(folder)
    try:
        if create:
            where.mkdir(parents=True, exist_ok=True)
            usable = where.is_dir() and os.access(where, os.W_OK | os.X_OK)
        else:
            usable = not any(p.exists() and not p.is_dir() for p in (where, *where.parents))
    except OSError:  # a parent that is a file (NotADirectoryError), not writable, or on a read-only root
        usable = False
    if usable and name == "GLM5_STATE_DIR" and len(bytes(where / SOCKET)) > SOCKET_PATH_MAX:
        return Problem(
            f"{name}={folder}",
            f"is too long for supervisord's socket ({SOCKET}: at most {SOCKET_PATH_MAX} bytes in all)",
            f"use a shorter path, or unset {name}",
        )
    if usable:
        return None
    return Problem(
        f"{name}={folder}",
        f"cannot create it or write to it as UID {os.getuid()}",
        f"mount a writable folder there, or set {name}",
    )


def require_folders(values: Mapping[str, Any]) -> None:
    """Every folder the kit writes is usable (created if missing), else every problem at once (report.Problems)."""
    found = [folder_problem(name, values[key]) for name, key in FOLDERS.items()]
    problems = [p for p in found if p is not None]
    if problems:
        raise Problems(problems)


def supervised(environ: Mapping[str, str], create: bool = True) -> tuple[dict[str, Any], list[Problem]]:
    """The values supervisord, its programs and the healthcheck run under, and what is wrong with the settings:
    an invalid setting at its glm5.toml default (settings.resolve_leniently), and a state or log folder that
    cannot be used at its default too, so that even then the exporter answers and the failure is recorded where
    the healthcheck looks. Raises Problems only when a default folder is unusable as well: then nothing could
    record or show a failure."""
    values, problems = settings.resolve_leniently(environ)
    for name, key in FOLDERS.items():
        problem = folder_problem(name, values[key], create)
        if problem is None:
            continue
        problems.append(problem)
        values[key] = settings.declarations()[name].default
        fallback = folder_problem(name, values[key], create)
        if fallback is not None:
            raise Problems([problem, fallback])
    return values, problems


def path(state_dir: str | Path, name: str) -> Path:
    if name not in FILES:
        raise ValueError(f"{name!r} is not a state file: one of {', '.join(FILES)}")
    return Path(state_dir) / name


def next_start(state_dir: str | Path) -> int:
    """Count one more start and return its number (1 for the first)."""
    counter = path(state_dir, STARTS)
    try:
        start = int(counter.read_text().strip() or 0) + 1
    except (OSError, ValueError):
        start = 1
    counter.write_text(str(start))
    return start


def read_json(file: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_launch(state_dir: str | Path, record: dict[str, Any]) -> None:
    path(state_dir, LAUNCH).write_text(json.dumps(record, indent=2) + "\n")


def read_launch(state_dir: str | Path) -> dict[str, Any] | None:
    return read_json(path(state_dir, LAUNCH))


def current(record: dict[str, Any] | None, start: int | None) -> dict[str, Any] | None:
    """The record if it belongs to start number `start`, else None."""
    return record if record is not None and start is not None and record.get("start") == start else None


def read_capture(state_dir: str | Path) -> dict[str, Any] | None:
    return read_json(path(state_dir, CAPTURE))


def write_capture(state_dir: str | Path, facts: dict[str, Any]) -> None:
    """Write only on change: probes repeat every few seconds."""
    file, text = path(state_dir, CAPTURE), json.dumps(facts)
    if not file.exists() or file.read_text() != text:
        write_whole(file, text)  # readers probe at any moment: they see the old facts or the new


def write_whole(file: Path, text: str) -> None:
    """Whole or not at all: a reader never sees half a file."""
    staged = file.with_name(f".{file.name}.{os.getpid()}")
    staged.write_text(text)
    staged.replace(file)


def write_stopped(state_dir: str | Path, start: int, signal_name: str) -> None:
    """Record that start `start` was told to stop (called from a signal handler: small, and whole or not at all)."""
    import datetime

    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    record = {"start": start, "signal": signal_name, "at": at}
    write_whole(path(state_dir, STOPPED), json.dumps(record) + "\n")


def read_stopped(state_dir: str | Path) -> dict[str, Any] | None:
    return read_json(path(state_dir, STOPPED))


def count_hang(state_dir: str | Path, start: int | None, reason: str) -> int:
    """Count start `start` as hung (once), return how many starts in a row have hung."""
    record = read_json(path(state_dir, HANGS)) or {}
    starts = [n for n in record.get("starts", []) if isinstance(n, int)]
    if start not in starts:
        starts.append(start if start is not None else -1)
    write_whole(path(state_dir, HANGS), json.dumps({"starts": starts, "last": reason}) + "\n")
    return len(starts)


def clear_hangs(state_dir: str | Path) -> None:
    path(state_dir, HANGS).unlink(missing_ok=True)


def read_verified(state_dir: str | Path) -> dict[str, Any] | None:
    return read_json(path(state_dir, VERIFIED))


def write_verified(state_dir: str | Path, record: dict[str, Any]) -> None:
    write_whole(path(state_dir, VERIFIED), json.dumps(record) + "\n")


def write_failed(state_dir: str | Path, code: int, reason: str) -> None:
    import datetime

    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    path(state_dir, FAILED).write_text(json.dumps({"code": code, "reason": reason, "at": at}) + "\n")


def read_failed(state_dir: str | Path) -> dict[str, Any] | None:
    return read_json(path(state_dir, FAILED))


def clear_failed(state_dir: str | Path) -> None:
    path(state_dir, FAILED).unlink(missing_ok=True)


def write_doctor(state_dir: str | Path, warnings: list[dict[str, str]]) -> None:
    path(state_dir, DOCTOR).write_text(json.dumps(warnings) + "\n")


def read_doctor(state_dir: str | Path) -> list[dict[str, str]]:
    try:
        found = json.loads(path(state_dir, DOCTOR).read_text())
    except (OSError, ValueError):
        return []
    return found if isinstance(found, list) else []


def write_server_config(state_dir: str | Path, options: dict[str, str]) -> Path:
    """The server's private config file: created 0600 (never readable by others, not even for a moment), YAML
    with JSON-quoted values (YAML reads them as plain strings)."""
    file = path(state_dir, SERVER_CONFIG)
    file.unlink(missing_ok=True)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(f"{key}: {json.dumps(value)}\n" for key, value in options.items()))
    return file


def remove_server_config(state_dir: str | Path) -> None:
    path(state_dir, SERVER_CONFIG).unlink(missing_ok=True)
