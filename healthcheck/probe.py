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

This module is the I/O edge: `observe` reads the log tail, the state files, /proc and /health and writes nothing;
healthcheck/phase.py `judge` decides (pure); `verdict(settings(environ))` is the one call of the exporter, the
stall watchdog, the gate and the support bundle. `remember` is the one writer of capture.json (the watchdog's tick).
It runs on every probe, so it imports little: no glm5.toml while the current start's launch.json exists.
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
from typing import Any, NamedTuple

from common.report import INVALID_SETTING, Log, Problems
from configuration import state
from healthcheck import logscan, phase
from healthcheck.verdict import Counts, Observation, Phase, Verdict


def settings_of_this_run(environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    """state_dir, log_dir, port, health timeout and accept_partial_capture: from the current start's
    launch.json (validated by launch at start), else from glm5.toml and the environment."""
    state_dir = environ.get("GLM5_STATE_DIR", "").strip()
    launch = state.read_launch(state_dir) if state_dir.startswith("/") else None
    keys = ("log_dir", "port", "health_timeout_seconds", "accept_partial_capture", "stall_seconds", "verify")
    later = {"on_failure": "wait", "autotune_stall_seconds": None}  # what a launch.json of an older kit lacks
    if launch is not None and all(k in launch for k in keys):
        return (
            {"state_dir": state_dir}
            | {k: launch.get(k, v) for k, v in later.items()}
            | {k: launch[k] for k in keys}
        )
    # Before the first start (or offline): glm5.toml and the environment, an invalid setting at its default as
    # supervisord runs it, so that a failure recorded under an invalid setting is found where it was written.
    values, problems = state.supervised(environ, create=False)
    for problem in problems:  # named, not fatal: preflight records it as the start's failure (failed.json)
        Log("healthcheck").warning(f"{problem}; judged with glm5.toml's value meanwhile")
    return {k: values[k] for k in ("state_dir", "on_failure", "autotune_stall_seconds", *keys)}


def configured_counts(environ: dict[str, str] | os._Environ[str]) -> tuple[int | None, int | None]:
    """Expected counts from the configuration and this environment (when there is no launch.json)."""
    from configuration import config

    try:
        effective = config.resolve(environ)
    except Problems:
        return None, None
    return len(effective.decode_sizes), len(effective.prefill_sizes)


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


def parse_args(argv: list[str] | None, run: dict[str, Any]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="healthcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, help=f"server log (default {run['log_dir']}/server.log)")
    parser.add_argument(
        "--state",
        type=Path,
        default=state.path(run["state_dir"], state.LAUNCH),
        help="launch.json of the run",
    )
    parser.add_argument("--url", default=f"http://127.0.0.1:{run['port']}", help="server base URL")
    parser.add_argument(
        "--timeout", type=float, default=float(run["health_timeout_seconds"]), help="HTTP timeout (>= 3 s)"
    )
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
        default=float(run["stall_seconds"]),
        help="no log output for this long while starting, loading or capturing: failed (a hang)",
    )
    parser.add_argument(
        "--verify",
        choices=("enforce", "report", "off"),
        default=run["verify"],
        help="the correctness gate (GLM5_VERIFY): ready only once the start's verification passed",
    )
    parser.add_argument("--json", action="store_true", help="print the state as JSON")
    parser.add_argument("--status", action="store_true", help="print one line for people")
    parser.add_argument(
        "--expect-decode", type=int, help="expected decode graph count (default: the configuration)"
    )
    parser.add_argument(
        "--accept-partial-capture",
        dest="accept_partial",
        action="store_true",
        default=bool(run["accept_partial_capture"]),
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


class Probe(NamedTuple):
    """What one probe reads and how: the run's settings (its launch.json) and the CLI's flags over them."""

    log_path: Path
    state_dir: Path
    offline: bool  # a saved log alone (--log): no state file is read
    url: str | None  # /health's server; None: no HTTP (the log alone)
    timeout: float
    stall_seconds: float
    verify: str
    accept_partial: bool
    on_failure: str = "wait"
    autotune_stall_seconds: float | None = None
    expect_decode: int | None = None
    tail_bytes: int = logscan.TAIL_BYTES


def settings(environ: Mapping[str, str]) -> Probe:
    """The log-only probe with the current run's settings (read anew: each start has its launch.json), as the
    exporter runs it on a scrape, the stall watchdog on a tick, the gate and the support bundle."""
    run = settings_of_this_run(dict(environ))
    return Probe(
        log_path=Path(run["log_dir"]) / state.SERVER_LOG,
        state_dir=Path(run["state_dir"]),
        offline=False,
        url=None,
        timeout=float(run["health_timeout_seconds"]),
        stall_seconds=float(run["stall_seconds"]),
        verify=run["verify"],
        accept_partial=bool(run["accept_partial_capture"]),
        on_failure=run["on_failure"],
        autotune_stall_seconds=run["autotune_stall_seconds"],
    )


def from_args(args: argparse.Namespace, run: dict[str, Any]) -> Probe:
    return Probe(
        log_path=args.log or Path(run["log_dir"]) / state.SERVER_LOG,
        state_dir=args.state.parent,
        offline=args.log is not None,
        url=None if args.no_http else args.url,
        timeout=args.timeout,
        stall_seconds=args.stall_seconds,
        verify=args.verify,
        accept_partial=args.accept_partial,
        on_failure=run["on_failure"],
        autotune_stall_seconds=run["autotune_stall_seconds"],
        expect_decode=args.expect_decode,
        tail_bytes=args.tail_bytes,
    )


def observe(p: Probe) -> Observation:
    """Read everything the judgement needs, in order; write nothing (capture.json has one writer: remember)."""
    try:
        data = logscan.read_tail(p.log_path, p.tail_bytes)
    except FileNotFoundError:
        data = b""
    scan = logscan.scan(data)
    launch = None if p.offline else state.read_launch(p.state_dir)
    if not p.offline:
        scan = phase.merged(scan, launch, state.read_capture(p.state_dir))
    current = state.current(launch, scan.start)
    need_config = current is None and not (scan.decode_list and scan.prefill_list)
    expected = phase.expected_counts(scan, current, configured_counts(os.environ) if need_config else None)
    if p.expect_decode is not None:
        expected = (p.expect_decode, expected[1])
    http = None
    if p.url is not None and phase.log_says_ready(scan):
        http = http_status(p.url, "/health", p.timeout)
    warnings = (current or {}).get("doctor_warnings") or []
    return Observation(
        scan=scan,
        expected=Counts(*expected),
        alive=pid_alive(int(current["pid"])) if current and current.get("pid") else None,
        http=http,
        quiet=None if p.offline or not data else log_quiet_seconds(p.log_path),
        stall_seconds=p.stall_seconds,
        accept_partial=p.accept_partial,
        verify=p.verify,
        offline=p.offline,
        stopped=None if p.offline else state.current(state.read_stopped(p.state_dir), scan.start),
        verified=None if p.offline else state.read_verified(p.state_dir),
        failed=None if p.offline else state.read_failed(p.state_dir),
        doctor_warnings=tuple(f"{w['name']}: {w['detail']}" for w in warnings),
        log=str(p.log_path),
        on_failure=p.on_failure,
        autotune_stall_seconds=p.autotune_stall_seconds,
    )


def verdict(p: Probe) -> Verdict:
    return phase.judge(observe(p))


def remember(state_dir: str) -> bool:
    """Keep what the log says of the current start in capture.json, merged with what was kept: the one writer
    (entrypoint/lifecycle, each TICK_5). True when it wrote; nothing before a start has written its launch.json."""
    launch = state.read_launch(state_dir)
    if launch is None or not isinstance(launch.get("log_dir"), str):
        return False
    try:
        data = logscan.read_tail(Path(launch["log_dir"]) / state.SERVER_LOG)
    except FileNotFoundError:
        return False
    kept = state.read_capture(state_dir)
    keep = phase.worth_keeping(phase.merged(logscan.scan(data), launch, kept))
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


def main(argv: list[str] | None = None) -> int:
    try:
        run = settings_of_this_run(os.environ)
    except Problems as err:
        Log("healthcheck").problems(err.problems, "invalid setting(s)")
        return INVALID_SETTING
    args = parse_args(argv, run)
    found = verdict(from_args(args, run))
    result = found.as_json()
    if args.json:
        print(json.dumps(result))
    if args.status or not args.json:
        now = datetime.datetime.now(datetime.UTC)
        print(phase.status_line(result, seconds_since(result["started_at"], now)))
    if args.started:
        # Kubernetes' startup probe: done once ready, and also once failed, so that liveness judges a hang
        # (restart) and a recorded failure (wait) instead of the startup budget restarting either blindly.
        return 0 if found.phase is Phase.FAILED or found.serving else 1
    if args.live:
        # Alive: not failed (a hang while starting is failed), and once ready /health answers; Kubernetes
        # counts liveness_failures of these in a row before it restarts the container.
        # Only what a restart can clear fails it: a hung start, or a ready server whose /health fails (a stuck
        # scheduler). Any other failure (a recorded one, a short capture) would only reload the weights for nothing.
        return 1 if found.hung or found.http not in (None, 200) else 0
    # Ready to serve: the log says ready and /health answers 200 (a 503 after the ready line: draining, or
    # latched unhealthy by a /health that timed out; the phase stays ready, this probe fails).
    return 0 if found.serving else 1


if __name__ == "__main__":
    sys.exit(main())
