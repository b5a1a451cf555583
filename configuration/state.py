"""The state contract between the kit's processes: the files in the state directory (GLM5_STATE_DIR), the start
marker line in the server log, the count of starts that ended before they were verified beside that log (GLM5_LOG_DIR)
and the per-build record on the cache volume. Only this module names them.

Each record names the start it is about (`start`); every reader ignores one of another start (`current`,
`current_failure`). The start numbers count up for as long as the state folder lives (the pod's emptyDir; compose's
tmpfs: one run of the container). The count of unverified ends outlives it where the log folder does (compose's
volume: the container's restarts), stamped with the container it is about (`this_container`). One writer per record:
after preflight, a start's failure is recorded by entrypoint/lifecycle alone (its `record`).

RECORDS below is the table of every record: its writers and readers, its start stamp and its lifetime (docs/internals.md
renders it; tests/test_state_records.py holds the writers to the code).

Stdlib only, cheap to import.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from common.report import Problem, Problems
from configuration import settings
from configuration.start import Start

SERVER_LOG = (
    "server.log"  # in GLM5_LOG_DIR: written by supervisord (the server's output), read by the healthcheck
)
LAUNCH = "launch.json"
CAPTURE = "capture.json"
STOPPED = "stopped.json"
# In GLM5_LOG_DIR, beside the log of the starts it counts (compose: a volume, where the state folder is a tmpfs).
HANGS = "hangs.json"
STARTS = "starts"
SERVER_CONFIG = "server-config.yaml"
FAILED = "failed.json"
DOCTOR = "doctor.json"
VERIFIED = "verified.json"  # the verification of the latest start (verify/gate.py)
WATCHED = "watched.json"  # the lifecycle listener's last tick: something watches the server
FILES = (STARTS, LAUNCH, CAPTURE, STOPPED, SERVER_CONFIG, FAILED, DOCTOR, VERIFIED, WATCHED)  # not HANGS
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # the host's boot (a container reads the host's)
# Liveness fails once the lifecycle listener (TICK_5) has been silent this long while a start runs: nothing then
# restarts, records or stops the server (supervisord restarts the listener itself without a limit).
WATCH_SILENT_SECONDS = 60
BUILD_VERIFICATION = (
    "verification.json"  # on the cache volume, in the folder of one image build (verify/gate.py)
)
PCIE_IPC_CHECK = (
    "pcie-ipc-allreduce.json"  # at the cache volume's root: the doctor's PCIe-IPC all-reduce check
)
MARKER_TEXT = "glm5-serve: server start #"
MARKER = re.compile(
    rb"glm5-serve: server start #(\d+) at (\S+)(?: pid \d+: decode graphs expected (\d+), prefill (\d+))?"
)


def marker_line(start: int, started_at: str, pid: int, decode_expected: int, prefill_expected: int) -> str:
    return (
        f"===== {MARKER_TEXT}{start} at {started_at} pid {pid}: decode graphs expected "
        f"{decode_expected}, prefill {prefill_expected} ====="
    )


class Record(NamedTuple):
    """A state record: who writes it (the modules that call its writers here, held by a test), who reads it."""

    name: str
    writers: tuple[str, ...]  # product modules, by path
    when: str  # when they write it
    readers: str
    stamp: str  # the start it names
    lifetime: str
    what: str


RECORDS: tuple[Record, ...] = (
    Record(STARTS, ("entrypoint/launch.py",), "launch --serve, at each start", "launch --serve; every reader of a failure", "is the count", "the state folder", "how many starts this state folder has seen: the number in the marker"),
    Record(LAUNCH, ("entrypoint/launch.py",), "launch --serve, at each start", "every prober, the exporter, the lifecycle listener, the gate, the bundle, ci tools, people: none of them resolves the configuration again (configuration/start.py RESOLVERS)", "`start`, `pid`", "until the next start", "the start record (configuration/start.py Start, typed): argv (no secret: those are in the server's config file), env, layout, capture lists and counts, prefill chunk, port, timeouts, build and cache folder, the all-reduce chosen, the doctor's warnings"),
    Record(CAPTURE, ("healthcheck/probe.py",), "entrypoint/lifecycle's tick (remember), the one writer, when it changes", "every prober", "`start`", "until the next start's is kept", "what the log said of a start once its capture is done or it is ready, its drain and what ended it merged in later (the log's tail window and its rotation lose the start's own lines)"),
    Record(STOPPED, ("entrypoint/launch.py",), "launch --serve, passing a SIGTERM or SIGINT on to the server", "every prober", "`start`", "until overwritten", "the start was told to stop; a start that reached ready reads draining from then on"),
    Record(FAILED, ("entrypoint/launch.py", "entrypoint/lifecycle.py"), "launch --prepare: preflight's refusal, before the first start; from the start on entrypoint/lifecycle alone (`record`: a judged verdict, a crash past the retries, FATAL)", "every prober, launch --failed-code (entrypoint.sh's exit code), entrypoint/lifecycle, people", "`start` (a refusal: the start it refused, the next number), `kind`, `code`", "removed at the next prepare; one of an earlier start is ignored", "a start the kit gave up on: the container stays up showing it (GLM5_ON_FAILURE=wait) and exits with `code` when stopped"),
    Record(HANGS, ("entrypoint/lifecycle.py",), "entrypoint/lifecycle, when a start hangs or ends before it was verified", "entrypoint/lifecycle (past the bound at a container's start: it gives up at once, starting nothing), people", "`starts`, a list: it spans starts by design; `container`: the host name (Docker: the container's ID; the pod's name) and the host's boot", "in the log folder (GLM5_LOG_DIR: compose's volume, so Docker's restarts of the container keep it; the pod's emptyDir); one of another container or boot is ignored; removed once a start is ready (verified)", "the starts in a row that ended before they were verified, hung or crashed; past GLM5_START_RETRIES the kit gives up with the last one's kind"),
    Record(DOCTOR, ("entrypoint/launch.py",), "launch --prepare", "launch --serve (into launch.json)", "none: the box, checked once per container before its first start", "the container", "the doctor's warnings about this box"),
    Record(VERIFIED, ("verify/gate.py",), "verify/gate, after a start's warm-up; nothing for a start that ended meanwhile", "every prober, the gate, people", "`start`, `build_id`", "until the next start's", "the start's verification: `passed`, `verdict`, `accuracy`, `reasons`, `regressed`, `results` (verify/run.py's summary)"),
    Record(WATCHED, ("entrypoint/lifecycle.py",), "entrypoint/lifecycle, at each tick (TICK_5)", "the healthcheck's liveness (--live)", "none: the container's listener", "the container", "`at`: the lifecycle listener's last tick; silent past WATCH_SILENT_SECONDS while a start runs, liveness fails"),
    Record(SERVER_CONFIG, ("entrypoint/launch.py",), "launch --serve", "the server (`--config`)", "none: it lives only while its start's server runs", "removed when the server exits", "options that must be on no command line (the API key); mode 0600, on a tmpfs in compose and the pod"),
    Record(PCIE_IPC_CHECK, ("entrypoint/doctor.py",), "entrypoint/doctor --ipc (the pcie_ipc_allreduce check)", "the start's all-reduce choice, through configuration/allreduce_choice.py decide", "none: `fingerprint` (the GPUs, the driver, the image build) says which box it is about", "the cache volume, until the next check; stale once the fingerprint differs", "whether FlashInfer's PCIe-IPC all-reduce finished and matched NCCL on these GPUs: `ok`, `at`, `detail`, `error`, `sizes` (per decode size: NCCL's and the kernels' times, `max_error`, `exact`, `wrong_ranks`)"),
    Record(BUILD_VERIFICATION, ("verify/gate.py",), "verify/gate, with verified.json", "verify/gate, at a later build's start", "`start`, `build_id`", "the cache volume, one per image build", "the build's newest verification, to name what a later build answers wrongly (`regressed`)"),
)  # fmt: skip
# The functions here that write each record: tests/test_start_state.py finds their callers in the product code.
WRITERS: dict[str, tuple[str, ...]] = {
    STARTS: ("next_start",),
    LAUNCH: ("write_launch",),
    CAPTURE: ("write_capture",),
    STOPPED: ("write_stopped",),
    FAILED: ("write_failed", "clear_failed"),
    HANGS: ("count_unverified_end", "clear_hangs"),
    DOCTOR: ("write_doctor",),
    VERIFIED: ("write_verified",),
    WATCHED: ("write_watched",),
    SERVER_CONFIG: ("write_server_config", "remove_server_config"),
    PCIE_IPC_CHECK: ("write_pcie_ipc_check",),
    BUILD_VERIFICATION: ("BUILD_VERIFICATION",),  # written with write_whole, a helper of many: by its name
}

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


def write_launch(state_dir: str | Path, record: Start) -> None:
    """The start record, whole or not at all (probes read it at any moment)."""
    write_whole(path(state_dir, LAUNCH), json.dumps(record.as_json(), indent=2) + "\n")


def read_launch(state_dir: str | Path) -> Start | None:
    """The latest start's record; None before the first start, or for a file that is not a whole record."""
    return Start.of(read_json(path(state_dir, LAUNCH)))


def current_start(record: Start | None, start: int | None) -> Start | None:
    """The start record if it is about start number `start`, else None."""
    return record if record is not None and start is not None and record.start == start else None


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


def write_watched(state_dir: str | Path, at: datetime.datetime) -> None:
    write_whole(path(state_dir, WATCHED), json.dumps({"at": at.isoformat(timespec="seconds")}))


def unwatched(state_dir: str | Path, now: datetime.datetime) -> str | None:
    """Why nothing watches the server, or None: a start has run for WATCH_SILENT_SECONDS and the lifecycle listener
    has not ticked for as long (dead, or FATAL in supervisord)."""
    launch, watched = read_launch(state_dir), read_json(path(state_dir, WATCHED))
    last = (watched or {}).get("at") or (launch.started_at if launch else None)
    if launch is None or not isinstance(last, str):
        return None  # no start yet: preflight and launch run before any listener matters
    try:
        silent = (now - datetime.datetime.fromisoformat(last)).total_seconds()
    except (ValueError, TypeError):
        return None
    if silent <= WATCH_SILENT_SECONDS:
        return None
    return (
        f"the lifecycle listener has not ticked for {silent:.0f} s (more than {WATCH_SILENT_SECONDS}): nothing "
        "restarts, records or stops the server; supervisord's log says why it ended"
    )


def write_stopped(state_dir: str | Path, start: int, signal_name: str) -> None:
    """Record that start `start` was told to stop (called from a signal handler: small, and whole or not at all)."""
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    record = {"start": start, "signal": signal_name, "at": at}
    write_whole(path(state_dir, STOPPED), json.dumps(record) + "\n")


def read_stopped(state_dir: str | Path) -> dict[str, Any] | None:
    return read_json(path(state_dir, STOPPED))


def this_container() -> str:
    """What the count of unverified ends is about: this container (its host name: Docker's default is the container's
    ID, the pod's is its name) since the host's boot. A restart of the container keeps both; a new container (compose
    recreating it) or a reboot does not."""
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    return f"{os.uname().nodename} {boot}".strip()


def read_unverified(log_dir: str | Path) -> dict[str, Any] | None:
    """The count of starts in a row that ended before they were verified (hangs.json), if it is this container's."""
    record = read_json(Path(log_dir) / HANGS)
    return record if record is not None and record.get("container") == this_container() else None


def count_unverified_end(
    log_dir: str | Path, start: int | None, kind: str, reason: str, started_at: str | None = None
) -> int:
    """Count start `start` (begun at `started_at`) as one that ended before it was verified, once, hung or crashed;
    return how many starts in a row have. A start number counts again after a container's restart (a new state folder
    numbers from 1): a start is the one last counted only with the same `started_at`."""
    record = read_unverified(log_dir) or {}
    starts = [n for n in record.get("starts", []) if isinstance(n, int)]
    number = start if start is not None else -1
    if not starts or starts[-1] != number or record.get("started_at") != started_at:
        starts.append(number)
    row = {"container": this_container(), "starts": starts, "started_at": started_at}
    write_whole(Path(log_dir) / HANGS, json.dumps(row | {"kind": kind, "last": reason}) + "\n")
    return len(starts)


def clear_hangs(log_dir: str | Path) -> None:
    (Path(log_dir) / HANGS).unlink(missing_ok=True)


def read_verified(state_dir: str | Path) -> dict[str, Any] | None:
    return read_json(path(state_dir, VERIFIED))


def write_verified(state_dir: str | Path, record: dict[str, Any]) -> None:
    write_whole(path(state_dir, VERIFIED), json.dumps(record) + "\n")


def write_failed(state_dir: str | Path, start: int, kind: str, code: int, reason: str) -> None:
    """Record that the kit gave up on start `start` (whole or not at all). Callers: launch --prepare for preflight's
    refusal, then entrypoint/lifecycle's `record` alone (tests/test_start_state.py holds that)."""
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    record = {"start": start, "kind": kind, "code": code, "reason": reason, "at": at}
    write_whole(path(state_dir, FAILED), json.dumps(record) + "\n")


def read_failed(state_dir: str | Path) -> dict[str, Any] | None:
    return read_json(path(state_dir, FAILED))


def clear_failed(state_dir: str | Path) -> None:
    path(state_dir, FAILED).unlink(missing_ok=True)


def starts_made(state_dir: str | Path) -> int:
    """How many starts this state folder has seen (0: none yet)."""
    try:
        return int(path(state_dir, STARTS).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def current_failure(failed: dict[str, Any] | None, starts: int) -> dict[str, Any] | None:
    """The failure record if it is about the latest start (`starts`) or about the next one, which preflight refused
    before it began; None for a record of an earlier start, or one without a start (an older kit's)."""
    if failed is None or not isinstance(failed.get("start"), int):
        return None
    return failed if failed["start"] >= starts else None


class Snapshot(NamedTuple):
    """The state folder as one judgement reads it, each file once: the current start's records only."""

    starts: int
    launch: Start | None
    capture: dict[str, Any] | None
    stopped: dict[str, Any] | None  # any start's: the judgement matches it to the log's start
    verified: dict[str, Any] | None  # any start's: the judgement matches it to the log's start
    failed: dict[str, Any] | None  # the latest start's or the refused next one's (current_failure)


def snapshot(state_dir: str | Path) -> Snapshot:
    starts = starts_made(state_dir)
    return Snapshot(
        starts=starts,
        launch=read_launch(state_dir),
        capture=read_capture(state_dir),
        stopped=read_stopped(state_dir),
        verified=read_verified(state_dir),
        failed=current_failure(read_failed(state_dir), starts),
    )


def write_doctor(state_dir: str | Path, warnings: list[dict[str, str]]) -> None:
    path(state_dir, DOCTOR).write_text(json.dumps(warnings) + "\n")


def read_doctor(state_dir: str | Path) -> list[dict[str, str]]:
    try:
        found = json.loads(path(state_dir, DOCTOR).read_text())
    except (OSError, ValueError):
        return []
    return [w for w in found if isinstance(w, dict)] if isinstance(found, list) else []


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


def write_pcie_ipc_check(cache_dir: str | Path, record: dict[str, Any]) -> Path:
    """Keep the doctor's PCIe-IPC all-reduce check on the cache volume (whole or not at all); its folder created."""
    file = Path(cache_dir) / PCIE_IPC_CHECK
    file.parent.mkdir(parents=True, exist_ok=True)
    write_whole(file, json.dumps(record, indent=2) + "\n")
    return file


def read_pcie_ipc_check(cache_dir: str | Path) -> dict[str, Any] | None:
    """The kept check, or None when there is none (or it cannot be read: the check runs again)."""
    return read_json(Path(cache_dir) / PCIE_IPC_CHECK)
