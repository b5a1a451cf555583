"""Render and run the SGLang server from entrypoint/glm5.toml and the GLM5_* overrides.

    entrypoint/launch --dry-run [--json]   print the server command (or its argv as JSON), touch nothing
    entrypoint/launch --prepare            validate, run preflight
    entrypoint/launch --serve              write the run state and a start marker, run the server
    entrypoint/launch --reference          print the configuration reference (markdown)
    entrypoint/launch --supervisor-env     print the settings supervisord.conf expands (SV_*)
    entrypoint/launch --failed-code        print the exit code of the recorded failure (0: none)

    entrypoint/launch --state-path NAME   print the path of a state file (configuration/state.py)

Exit codes (common/report.py): 0 ok, 2 usage, 3 invalid setting, 10-43 preflight, 127 no server program.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.report import FAILED, INVALID_SETTING, NO_SERVER_PROGRAM, Log, Problems
from configuration import allreduce_choice, compile_jobs, config, settings, state
from configuration.start import Start
from entrypoint import preflight, relay, resolution

LOG = Log("glm5-serve")
KIT_ROOT = str(Path(__file__).resolve().parent.parent)


def resolve_or_exit() -> config.Effective:
    try:
        effective = config.resolve(os.environ)
    except Problems as err:
        LOG.problems(err.problems)
        sys.exit(err.code)  # the first problem's, as printed (41 for GLM5_SKIP_PREFLIGHT; else 3)
    return effective


def folders_or_exit(effective: config.Effective) -> None:
    """The state and log folders exist and are writable (made if missing) before anything writes there."""
    try:
        state.require_folders(effective.values)
    except Problems as err:
        LOG.problems(err.problems)
        sys.exit(INVALID_SETTING)


def dry_run(effective: config.Effective, as_json: bool) -> int:
    argv = effective.argv
    if as_json:
        print(json.dumps(argv))
        return 0
    print(shlex.join(argv))
    values, sources = effective.server_env(os.environ)
    for name, value in values.items():
        if sources[name] == "glm5.toml":
            print(f"# {name}={value} (glm5.toml default)")
        else:
            print(f"# {name}={value} (from the environment; glm5.toml's default: {effective.env[name]})")
    jobs, why = compile_jobs.chosen(os.environ, cores())
    print(
        f"# {compile_jobs.SETTING}={jobs} (run-time compiles; {'from the environment' if why == 'environment' else why})"
    )
    for line in effective.layout.explain(settings.load_config()["gateway"]["context_tokens"]):
        print(f"# {line}")
    choice = allreduce(effective)
    for name, value in choice.env().items():
        print(f"# {name}={value} (GLM5_ALLREDUCE)")
    print(f"# all-reduce: {choice.why}")
    print(
        f"# decode graphs expected {len(effective.decode_sizes)} a rank ({effective.decode_sizes[0]}.."
        f"{effective.decode_sizes[-1]}), prefill shapes {len(effective.prefill_sizes)}"
    )
    return 0


def allreduce(effective: config.Effective) -> allreduce_choice.Choice:
    """The start's all-reduce: GLM5_ALLREDUCE against the doctor's kept check of this box (the cache volume) and the
    box's fingerprint now (one nvidia-smi query; none on a laptop, which the reason says)."""
    values = effective.values
    current, unread = allreduce_choice.current_fingerprint(values["build_id"])
    record = state.read_pcie_ipc_check(values["cache_dir"])
    return allreduce_choice.decide(values["allreduce"], effective.layout.profile, record, current, unread)


def with_allreduce(record: dict[str, Any], choice: allreduce_choice.Choice) -> dict[str, Any]:
    """The launch record with the all-reduce chosen: its switch in the server's environment and why."""
    env = choice.env()
    return record | {
        "env": record["env"] | env,
        "env_from": record["env_from"] | dict.fromkeys(env, "GLM5_ALLREDUCE"),
        "allreduce": {"backend": choice.backend, "why": choice.why},
    }


def cores() -> int:
    """The cores this process may run on (ninja's default is this + 2)."""
    return len(os.sched_getaffinity(0))


def with_compile_jobs(record: dict[str, Any]) -> dict[str, Any]:
    """The launch record with MAX_JOBS in the server's environment (configuration/compile_jobs.py) and, when the kit
    sized it, how (`max_jobs_sized`)."""
    jobs, why = compile_jobs.chosen(os.environ, cores())
    sized = why != "environment"
    return record | {
        "env": record["env"] | {compile_jobs.SETTING: jobs},
        "env_from": record["env_from"] | {compile_jobs.SETTING: "memory" if sized else "environment"},
        "max_jobs_sized": why if sized else None,
    }


def prepare_start() -> int:
    """The preflight program under supervisord: a start's failure that a restart cannot fix is recorded
    (failed.json, where the healthcheck and the exporter look) whether a setting or the box is at fault."""
    try:
        values, problems = state.supervised(os.environ)
    except Problems as err:  # not even glm5.toml's folders can be used: nothing can record it
        return LOG.problems(err.problems)
    state.clear_failed(values["state_dir"])
    state.remove_server_config(values["state_dir"])  # a killed run's copy of the key goes
    effective = None
    if not problems:
        try:
            effective = config.resolve(os.environ)
        except Problems as err:
            problems = err.problems
    if effective is None:
        refuse(values["state_dir"], problems[0].code, "invalid setting(s): " + "; ".join(map(str, problems)))
        return LOG.problems(problems)
    return prepare(effective)


def refuse(state_dir: str, code: int, reason: str) -> None:
    """Preflight's refusal, the one failure recorded before the server starts (entrypoint/lifecycle records every later
    one): about the start it refused, the next number."""
    state.write_failed(state_dir, state.starts_made(state_dir) + 1, "refused", code, reason)


def prepare(effective: config.Effective) -> int:
    values = effective.values
    warnings: list[dict[str, str]] = []
    problems = preflight.run(
        values,
        os.environ,
        LOG,
        effective.public_argv()[len(config.SERVER_PROGRAM) :],
        warnings=warnings,
        server_environ=server_env(os.environ, effective.server_env(os.environ)[0]),
        expected=resolution.Captures.expected(effective),
    )
    state.write_doctor(values["state_dir"], warnings)
    checks = settings.declarations()["GLM5_SKIP_PREFLIGHT"].choices
    if problems:
        refuse(values["state_dir"], problems[0].code, "preflight: " + "; ".join(str(p) for p in problems))
        return LOG.problems(
            problems,
            f"preflight problem(s); fix them, or skip a check with GLM5_SKIP_PREFLIGHT=<{','.join(checks)}|all> (logged)",
        )
    checked = [c for c in checks if c not in values["skip_preflight"]]
    if not checked:
        LOG.warning(
            "preflight: every check skipped (GLM5_SKIP_PREFLIGHT=all): nothing about this box was verified"
        )
    else:
        LOG.info(f"preflight: ok ({', '.join(checked)})")
    return 0


def serve(effective: config.Effective) -> int:
    state_dir = effective.values["state_dir"]
    start = state.next_start(state_dir)
    argv = list(effective.argv)
    replacement = effective.values["server_program"]
    if replacement:
        argv = replacement + argv[len(config.SERVER_PROGRAM) :]
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    choice = allreduce(effective)
    record = start_record(
        with_allreduce(with_compile_jobs(effective.state(os.environ)), choice)
        | {
            "start": start,
            "pid": os.getpid(),
            "started_at": started_at,
            "doctor_warnings": state.read_doctor(state_dir),
            # what the gateway sizes a request at, so that the exporter reports what it admits to this replica
            "context_tokens": settings.load_config()["gateway"]["context_tokens"],
        }
    )
    state.write_launch(state_dir, record)
    marker = state.marker_line(
        start, started_at, os.getpid(), record.decode_expected, record.prefill_expected
    )
    print(marker, flush=True)
    LOG.info(f"all-reduce: {choice.why}")
    if record.max_jobs_sized:
        LOG.info(
            f"{compile_jobs.SETTING}={record.env[compile_jobs.SETTING]} for run-time compiles: "
            f"{record.max_jobs_sized} (set {compile_jobs.SETTING} to override)"
        )
    if replacement:
        LOG.warning(f"GLM5_SERVER_PROGRAM replaces the server program with: {shlex.join(replacement)}")
    if shutil.which(argv[0]) is None:
        LOG.error(f"server program {argv[0]!r} not found on PATH")
        return NO_SERVER_PROGRAM
    if effective.secret_options:
        state.write_server_config(state_dir, effective.secret_options)
    try:
        stopping = functools.partial(state.write_stopped, state_dir, start)
        return supervise(argv, server_env(os.environ, dict(record.env)), effective.secrets(), stopping)
    finally:
        state.remove_server_config(state_dir)


def start_record(fields: dict[str, Any]) -> Start:
    """The typed start record of these fields; one that does not make a whole record is the kit's own fault."""
    record = Start.of(fields)
    if record is None:
        missing = sorted(f.name for f in dataclasses.fields(Start) if f.name not in fields)
        raise AssertionError(f"the start record is incomplete or mistyped (missing: {missing or 'none'})")
    return record


def server_env(environ: dict[str, str] | os._Environ[str], configured: dict[str, str]) -> dict[str, str]:
    """The server's environment: ours with the configuration's effective values (the operator's already won in
    them), less the kit's own import path (the thin executables put the kit's folder on PYTHONPATH; the
    server must not import from it)."""
    env = dict(environ) | configured
    for name, setting in settings.declarations().items():  # the key reaches the server through --config only
        if setting.kind == "secret":
            env.pop(name, None)
            env.pop(f"{name}_FILE", None)
    kept = [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(KIT_ROOT)
    ]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env


def supervise(
    argv: list[str], env: dict[str, str], secrets: list[str], stopping: Callable[[str], None] | None = None
) -> int:
    """Run the server as a child rather than exec it: its output passes through the masking relay (a thread
    here), SIGTERM/SIGINT go to it alone (it drains) after `stopping` recorded the stop (stopped.json: the probes
    read draining at once, whatever the log says yet), and when it exits what it left behind in this process
    group is killed (TP workers holding GPU memory would make the restart run out of memory)."""
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # lead our own group (supervisord already does this), so only the server's is reaped
    # Handlers first: a stop that arrives while the server is being spawned is held, then passed on.
    pending: list[int] = []
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        if stopping is not None:
            try:
                stopping(signal.Signals(signum).name)
            except OSError as err:  # the stop itself must go on
                LOG.warning(f"could not record the stop in the state folder: {err}")
        if children:
            children[0].send_signal(signum)
        else:
            pending.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    read_end, write_end = os.pipe()
    child = subprocess.Popen(argv, env=env, stdout=write_end, stderr=write_end)
    children.append(child)
    os.close(write_end)
    for signum in pending:
        child.send_signal(signum)
    copier = threading.Thread(target=relay.relay, args=(read_end, sys.stdout.fileno(), secrets), daemon=True)
    copier.start()
    code = child.wait()
    leftovers = [pid for pid in processes(pgid=os.getpgrp()) if pid != os.getpid()]
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    copier.join(timeout=10)  # the pipe ends once every holder of its write end is gone
    if leftovers:
        LOG.warning(
            f"server exited ({code}); killed {len(leftovers)} process(es) it left behind: {leftovers}"
        )
    return code if code >= 0 else 128 - code


def stop_now(signum: int, _frame: object) -> None:
    for pid in processes(ppid=os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(128 + signum)


def processes(ppid: int | None = None, pgid: int | None = None) -> list[int]:
    """Live (not zombie) processes with this parent or in this process group, from /proc/PID/stat."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
            if (
                fields[0] != "Z"
                and (ppid is None or int(fields[1]) == ppid)
                and (pgid is None or int(fields[2]) == pgid)
            ):
                found.append(int(stat.parent.name))
    return found


# What supervisord.conf expands, exported by entrypoint.sh as SV_<KEY> (not GLM5_*: those stay as the operator
# set them, so preflight still sees an invalid one).
SUPERVISOR_KEYS = (
    "exporter_port",
    "on_failure",
    "log_dir",
    "state_dir",
    "start_retries",
    "drain_seconds",
    "log_max_bytes",
    "log_backups",
)


def supervisor_env() -> int:
    """SV_KEY=VALUE lines for entrypoint.sh, expanded by supervisord.conf as %(ENV_SV_...)s: an invalid setting
    at its default (preflight records and reports it), so supervisord and the exporter run whatever is set."""
    values = supervised_or_exit(create=True)
    for key in SUPERVISOR_KEYS:
        print(f"SV_{key.upper()}={values[key]}")
    return 0


def supervised_or_exit(create: bool) -> dict[str, Any]:
    try:
        return state.supervised(os.environ, create)[0]
    except Problems as err:
        LOG.problems(
            err.problems, "unusable folder(s): neither the one set nor glm5.toml's; nothing was started"
        )
        sys.exit(INVALID_SETTING)


def failed_code() -> int:
    """Print the exit code of the failure recorded for the latest start (or the refused next one), 0 when none: the
    container's exit code."""
    state_dir = supervised_or_exit(create=False)["state_dir"]
    failed = state.current_failure(state.read_failed(state_dir), state.starts_made(state_dir)) or {}
    code = failed.get("code", 0)
    print(code if isinstance(code, int) and 0 <= code < 256 else FAILED)
    return 0


def reference() -> int:
    print(config.reference(settings.load_config()), end="")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="entrypoint/launch", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--dry-run", action="store_true", help="print the server command and exit")
    mode.add_argument("--prepare", action="store_true", help="validate, preflight")
    mode.add_argument("--serve", action="store_true", help="run the server (run by supervisord)")
    mode.add_argument("--reference", action="store_true", help="print the configuration reference")
    mode.add_argument(
        "--supervisor-env", action="store_true", help="print the settings supervisord.conf reads"
    )
    mode.add_argument("--state-path", choices=state.FILES, help="print the path of a state file")
    mode.add_argument(
        "--failed-code", action="store_true", help="print the exit code of the recorded failure (0: none)"
    )
    parser.add_argument("--json", action="store_true", help="with --dry-run: the argv as a JSON array")
    args = parser.parse_args()
    if args.json and not args.dry_run:
        parser.error("--json goes with --dry-run")
    if args.reference:
        return reference()
    if args.supervisor_env:
        return supervisor_env()
    if args.failed_code:
        return failed_code()
    if args.state_path:  # where the kit's processes look, an invalid setting at its default
        print(state.path(supervised_or_exit(create=False)["state_dir"], args.state_path))
        return 0
    if args.prepare:
        # A stop during preflight ends it at once, with what it is running (nvidia-smi, the parser).
        signal.signal(signal.SIGTERM, stop_now)
        return prepare_start()
    effective = resolve_or_exit()
    if args.dry_run:
        return dry_run(effective, args.json)
    folders_or_exit(effective)  # the server's state and log
    return serve(effective)


if __name__ == "__main__":
    sys.exit(main())
