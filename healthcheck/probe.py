"""Is the GLM-5 server ready? Healthy only once CUDA graph capture is complete with the expected
counts and /health answers 200; otherwise says which phase the start is in.

    healthcheck/healthcheck                   readiness (Docker HEALTHCHECK, k8s readiness)
    healthcheck/healthcheck --live            liveness: not hung, and once ready /health answers (a slow start passes)
    healthcheck/healthcheck --started         the start is over: ready, or failed (no probe of the kit uses it)
    healthcheck/healthcheck --status          one line for people
    healthcheck/healthcheck --json            the state as one JSON object
    healthcheck/healthcheck --log FILE --no-http --json    judge a saved log alone

Phases: healthcheck/verdict.py's Phase. Exit 0 when ready (verified) and /health 200 (with --live:
unless the start is hung or a ready server's /health fails; with --started: once ready or failed), 1 otherwise,
2 bad usage, 3 an invalid GLM5_* setting.

This module is the I/O edge: `observe` reads the log tail, the state folder (once: state.snapshot), /proc and
/health, turns the JSON records into typed values and writes nothing; healthcheck/phase.py `judge` decides (pure);
`verdict(run_of(environ))` is the one call of the exporter, the lifecycle listener, the gate and the support bundle.
`remember` is the one writer of capture.json (the lifecycle tick, with the tail it judged).
It runs on every probe, so it imports little; it never resolves the configuration: a start's facts are its record's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.report import INVALID_SETTING, Log, Problems
from configuration import state
from configuration.start import Start
from healthcheck import logscan, phase
from healthcheck.verdict import Counts, Observation, Phase, Recorded, Run, Stop, Verdict, Verification


def run_of(environ: Mapping[str, str]) -> Run:
    """The run's settings: the latest start's record (launch.json, configuration/start.py), else glm5.toml and the
    environment (before the first start, or offline), an invalid setting at its default as supervisord runs it, so
    that a failure recorded under an invalid setting is found where it was written."""
    state_dir = environ.get("GLM5_STATE_DIR", "").strip()
    launch = state.read_launch(state_dir) if state_dir.startswith("/") else None
    if launch is not None:
        return run_of_start(launch, Path(state_dir))
    values, problems = state.supervised(environ, create=False)
    # Named, not fatal: preflight records it as the start's failure (failed.json).
    for problem in problems:
        Log("healthcheck").warning(f"{problem}; judged with glm5.toml's value meanwhile")
    autotune = values["autotune_stall_seconds"]
    return Run(
        state_dir=Path(values["state_dir"]),
        log_path=Path(values["log_dir"]) / state.SERVER_LOG,
        port=int(values["port"]),
        timeout=float(values["health_timeout_seconds"]),
        stall_seconds=float(values["stall_seconds"]),
        autotune_stall_seconds=None if autotune is None else float(autotune),
        accept_partial=bool(values["accept_partial_capture"]),
        verify=str(values["verify"]),
        on_failure=str(values["on_failure"]),
    )


def run_of_start(launch: Start, state_dir: Path) -> Run:
    """The run's settings as the start's record holds them (the configuration is not resolved again)."""
    autotune = launch.autotune_stall_seconds
    return Run(
        state_dir=state_dir,
        log_path=Path(launch.log_dir) / state.SERVER_LOG,
        port=launch.port,
        timeout=float(launch.health_timeout_seconds),
        stall_seconds=float(launch.stall_seconds),
        autotune_stall_seconds=None if autotune is None else float(autotune),
        accept_partial=launch.accept_partial_capture,
        verify=launch.verify,
        on_failure=launch.on_failure,
        attn_dp_size=launch.attn_dp_size,
        allreduce=str(launch.allreduce.get("backend") or "nccl"),
        allreduce_why=launch.allreduce.get("why"),
        decode_max=max(launch.decode_batch_sizes, default=None),
        context_tokens=launch.context_tokens,
    )


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def http_status(url: str, path: str = "/health", timeout: float = 10) -> int | str:
    """The status an endpoint answers, or why there was no answer."""
    import urllib.error  # only here: importing urllib costs more than the rest of a probe
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (OSError, ValueError) as err:
        return f"no answer ({getattr(err, 'reason', err)})"


def seconds_since(started_at: str | None, now: datetime.datetime) -> int | None:
    if not started_at:
        return None
    try:
        return int((now - datetime.datetime.fromisoformat(started_at)).total_seconds())
    except ValueError:
        return None


def parse_args(argv: list[str] | None, run: Run) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="healthcheck", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--log", type=Path, help=f"server log (default {run.log_path})")
    parser.add_argument(
        "--state", type=Path, default=state.path(run.state_dir, state.LAUNCH), help="launch.json of the run"
    )
    parser.add_argument("--url", default=f"http://127.0.0.1:{run.port}", help="server base URL")
    parser.add_argument("--timeout", type=float, default=run.timeout, help="HTTP timeout (>= 3 s)")
    parser.add_argument("--no-http", action="store_true", help="judge from the log only")
    parser.add_argument(
        "--live", action="store_true", help="liveness: alive, not hung, and once ready /health answering"
    )
    parser.add_argument(
        "--started",
        action="store_true",
        help="startup: the start is over, ready or failed (liveness and readiness take over from there)",
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=run.stall_seconds,
        help="no log output for this long while starting, loading or capturing: failed (a hang)",
    )
    parser.add_argument(
        "--verify",
        choices=("enforce", "report", "off"),
        default=run.verify,
        help="the correctness gate (GLM5_VERIFY): ready only once the start's verification passed",
    )
    parser.add_argument("--json", action="store_true", help="print the state as JSON")
    parser.add_argument("--status", action="store_true", help="print one line for people")
    parser.add_argument(
        "--expect-decode",
        type=int,
        help="expected decode graph count (default: the start record's, or the log's)",
    )
    parser.add_argument(
        "--accept-partial-capture",
        dest="accept_partial",
        action="store_true",
        default=run.accept_partial,
        help="accept fewer decode graphs than expected",
    )
    parser.add_argument(
        "--tail-bytes", type=int, default=logscan.TAIL_BYTES, help="how much of the log end to read"
    )
    args = parser.parse_args(argv)
    if args.timeout < 3:
        parser.error(
            f"--timeout {args.timeout}: /health sleeps 1 s and then generates a token; use 3 s or more"
        )
    return args


def with_flags(run: Run, args: argparse.Namespace) -> Run:
    """The run's settings with the CLI's flags over them."""
    return run._replace(
        log_path=args.log or run.log_path,
        state_dir=args.state.parent,
        offline=args.log is not None,
        url=None if args.no_http else args.url,
        timeout=args.timeout,
        stall_seconds=args.stall_seconds,
        verify=args.verify,
        accept_partial=args.accept_partial,
        expect_decode=args.expect_decode,
        tail_bytes=args.tail_bytes,
    )


def merged(scan: logscan.Scan, launch: Start | None, kept: Mapping[str, Any] | None) -> logscan.Scan:
    """The facts to judge. A tail that holds the current start's marker says everything itself. A tail without it
    comes after that start's own lines (they left the window, or the log was rotated): the start's remembered facts
    (capture.json, `kept`) with the tail's events merged in, never replaced by them: the drain line, and what ends a
    server (a traceback or an out-of-memory line there belongs to a request, as after the ready line)."""
    if scan.start is not None or launch is None or not kept or kept.get("start") != launch.start:
        return scan
    facts = dict(kept)
    facts["seen"] = set(facts["seen"]) | (scan.seen & {"draining"})
    if facts.get("server_failure") is not None:
        facts["server_failure"] = tuple(facts["server_failure"])
    late = scan.server_failure
    if late is not None and late[0] == "killed" and "draining" in facts["seen"]:
        late = None  # SGLang's drain ends with kill_process_tree: a stop
    if facts.get("failure") is None and late is not None:
        facts["failure_event"], facts["failure"] = late
        facts["server_failure"] = facts.get("server_failure") or late
        facts["seen"].add(late[0])
    return logscan.Scan(**facts, bytes_read=scan.bytes_read)


def worth_keeping(scan: logscan.Scan) -> dict[str, Any] | None:
    """What to remember of a start (capture.json), so that its facts outlive the log's tail window: those of a start
    whose decode capture is done or that said it is ready (and, merged in later, its drain and what ended it)."""
    if scan.start is None or not (phase.decode_done(scan) or "ready" in scan.seen):
        return None
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(scan).items() if k != "bytes_read"}


def expected_counts(scan: logscan.Scan, launch: Start | None) -> Counts:
    """Graph counts to expect: the start's record (`launch`, the latest start's: the current one where the tail names
    its start, and also where the tail has no marker left, rotated or pushed out by hours of output: it is the latest
    start's tail), else the counts the tail's start marker announced, else the lists the log printed (older formats),
    else unknown (no start of this kit's)."""
    if launch is not None and scan.start in (launch.start, None):
        return Counts(launch.decode_expected, launch.prefill_expected)
    if scan.marker_expected is not None:
        return Counts(*scan.marker_expected)
    return Counts(
        len(scan.decode_list) if scan.decode_list else None,
        len(scan.prefill_list) if scan.prefill_list else None,
    )


def stop_of(record: Mapping[str, Any] | None, start: int | None) -> Stop | None:
    found = state.current(dict(record) if record is not None else None, start)
    return None if found is None else Stop(str(found.get("signal", "SIGTERM")), str(found.get("at", "?")))


def verification_of(record: Mapping[str, Any] | None, start: int | None) -> Verification | None:
    """The start's own verification (verified.json), without its per-item rows; None before it is done or when the
    file is an earlier start's."""
    if record is None or start is None or record.get("start") != start:
        return None
    missed = [r for r in record.get("results", []) if not r.get("right")]
    # An item with no conclusion (no reply, or cut twice) is not a wrong answer: named apart.
    unsure = tuple(r["id"] for r in missed if r.get("outcome") == "inconclusive")
    passed = bool(record.get("passed"))
    return Verification(
        passed=passed,
        verdict=str(record.get("verdict") or ("passed" if passed else "wrong")),
        accuracy=record.get("accuracy"),
        right=record.get("right"),
        items=record.get("items"),
        reasons=tuple(record.get("reasons") or ()),
        regressed=tuple(record.get("regressed") or ()),
        compared_with=record.get("compared_with"),
        seconds=record.get("seconds"),
        build_id=record.get("build_id"),
        wrong=tuple(r["id"] for r in missed if r.get("outcome") != "inconclusive"),
        inconclusive=unsure,
    )


def recorded_of(record: Mapping[str, Any] | None) -> Recorded | None:
    """The current start's recorded failure (the snapshot keeps only that one)."""
    if record is None:
        return None
    code = record.get("code")
    return Recorded(
        kind=str(record.get("kind") or "refused"),
        code=code if isinstance(code, int) and 0 <= code < 256 else 1,
        reason=str(record.get("reason")),
    )


def observe(run: Run, data: bytes | None = None) -> Observation:
    """Read everything the judgement needs, the state folder once; write nothing (capture.json has one writer:
    remember). `data`: the log tail when the caller read it already."""
    if data is None:
        try:
            data = logscan.read_tail(run.log_path, run.tail_bytes)
        except FileNotFoundError:
            data = b""
    scan = logscan.scan(data)
    files = None if run.offline else state.snapshot(run.state_dir)
    launch = files.launch if files else None
    if files is not None:
        scan = merged(scan, launch, files.capture)
    current = state.current_start(launch, scan.start)
    expected = expected_counts(scan, launch)
    if run.fallback is not None:
        expected = Counts(
            run.fallback.decode if expected.decode is None else expected.decode,
            run.fallback.prefill if expected.prefill is None else expected.prefill,
        )
    if run.expect_decode is not None:
        expected = expected._replace(decode=run.expect_decode)
    http = None
    if run.url is not None and phase.log_says_ready(scan):
        http = http_status(run.url, "/health", run.timeout)
    warnings = current.doctor_warnings if current else ()
    return Observation(
        run=run,
        scan=scan,
        expected=expected,
        alive=pid_alive(current.pid) if current else None,
        http=http,
        quiet=None if run.offline or not data else log_quiet_seconds(run.log_path),
        stopped=stop_of(files.stopped, scan.start) if files else None,
        verification=verification_of(files.verified, scan.start) if files else None,
        failed=recorded_of(files.failed) if files else None,
        doctor_warnings=tuple(f"{w['name']}: {w['detail']}" for w in warnings),
    )


def verdict(run: Run, data: bytes | None = None) -> Verdict:
    return phase.judge(observe(run, data))


def remember(state_dir: str | Path, data: bytes) -> bool:
    """Keep what the log tail `data` says of the current start in capture.json, merged with what was kept: the one
    writer (entrypoint/lifecycle, each TICK_5, with the tail it judges). True when it wrote; nothing before a start has
    written its launch.json."""
    launch = state.read_launch(state_dir)
    if launch is None:
        return False
    kept = state.read_capture(state_dir)
    keep = worth_keeping(merged(logscan.scan(data), launch, kept))
    if keep is None or keep == kept:
        return False
    state.write_capture(state_dir, keep)
    return True


def log_quiet_seconds(log: Path) -> float | None:
    """Seconds since the server log was last written (its progress lines, tqdm frames included)."""
    try:
        return max(0.0, time.time() - log.stat().st_mtime)
    except OSError:
        return None


def main(argv: list[str] | None = None, fallback: Counts | None = None) -> int:
    """The probe's command line. `fallback`: the counts a saved log (`--log FILE`) is judged by where it names none
    (healthcheck/saved_log.py, which the executable runs for --log: a running start's probes never resolve the
    configuration, nor import it)."""
    try:
        run = run_of(os.environ)
    except Problems as err:
        Log("healthcheck").problems(err.problems, "invalid setting(s)")
        return INVALID_SETTING
    args = parse_args(argv, run)
    run = with_flags(run, args)
    if run.offline:
        run = run._replace(fallback=fallback)
    found = verdict(run)
    if args.json:
        print(json.dumps(found.as_json()))
    if args.status or not args.json:
        now = datetime.datetime.now(datetime.UTC)
        print(phase.status_line(found, seconds_since(found.started_at, now)))
    if args.started:
        # Kubernetes' startup probe: done once ready, and also once failed, so that liveness judges a hang
        # (restart) and a recorded failure (wait) instead of the startup budget restarting either blindly.
        return 0 if found.phase is Phase.FAILED or found.serving else 1
    if args.live:
        # Alive: not failed (a hang while starting is failed), and once ready /health answers; Kubernetes
        # counts liveness_failures of these in a row before it restarts the container.
        # Only what a restart can clear fails it: a hung start, or a ready server whose /health fails (a stuck
        # scheduler), or a server nothing watches (the lifecycle listener silent: no restart, record or stop would
        # follow anything). Any other failure (a recorded one, a short capture) would only reload the weights.
        silent = None if run.offline else state.unwatched(run.state_dir, datetime.datetime.now(datetime.UTC))
        if silent:
            Log("healthcheck").error(f"not live: {silent}")
        return 1 if found.hung or found.http not in (None, 200) or silent else 0
    # Ready to serve: the log says ready and /health answers 200 (a 503 after the ready line: draining, or
    # latched unhealthy by a /health that timed out; the phase stays ready, this probe fails).
    return 0 if found.serving else 1


if __name__ == "__main__":
    sys.exit(main())
