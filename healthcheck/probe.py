"""Is the GLM-5 server ready? Healthy only once CUDA graph capture is complete with the expected
counts and /health answers 200; otherwise says which phase the start is in.

    healthcheck/healthcheck                   readiness (Docker HEALTHCHECK, k8s readiness)
    healthcheck/healthcheck --live            liveness: not hung, and once ready /health answers (a slow start passes)
    healthcheck/healthcheck --started         the start is over: ready, or failed (no probe of the kit uses it)
    healthcheck/healthcheck --status          one line for people
    healthcheck/healthcheck --json            the state as one JSON object
    healthcheck/healthcheck --log FILE --no-http --json    judge a saved log alone

Phases: starting, loading, capturing, warming_up, verifying, ready, draining, failed. Exit 0 when ready (verified)
and /health 200 (with --live:
unless the start is hung or a ready server's /health fails; with --started: once ready or failed), 1 otherwise,
2 bad usage, 3 an invalid GLM5_* setting.

This module is the I/O edge (log tail, state files, /proc, /health); the decision is healthcheck/phase.py.
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
from typing import Any

from common.report import INVALID_SETTING, Log, Problems
from configuration import state
from healthcheck import logscan, phase


def settings_of_this_run(environ: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    """state_dir, log_dir, port, health timeout and accept_partial_capture: from the current start's
    launch.json (validated by launch at start), else from glm5.toml and the environment."""
    state_dir = environ.get("GLM5_STATE_DIR", "").strip()
    launch = state.read_launch(state_dir) if state_dir.startswith("/") else None
    keys = ("log_dir", "port", "health_timeout_seconds", "accept_partial_capture", "stall_seconds", "verify")
    if launch is not None and all(k in launch for k in keys):
        return {"state_dir": state_dir} | {k: launch[k] for k in keys}
    # Before the first start (or offline): glm5.toml and the environment, an invalid setting at its default as
    # supervisord runs it, so that a failure recorded under an invalid setting is found where it was written.
    values, problems = state.supervised(environ, create=False)
    for problem in problems:  # named, not fatal: preflight records it as the start's failure (failed.json)
        Log("healthcheck").warning(f"{problem}; judged with glm5.toml's value meanwhile")
    return {k: values[k] for k in ("state_dir", *keys)}


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
    args.log_path = args.log or Path(run["log_dir"]) / state.SERVER_LOG
    return args


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """Read what the decision needs, in order, and decide. Reads only: capture.json has one writer (remember)."""
    try:
        data = logscan.read_tail(args.log_path, args.tail_bytes)
    except FileNotFoundError:
        data = b""
    scan = logscan.scan(data)
    offline = args.log is not None
    launch = None if offline else state.read_json(args.state)
    stopped = None
    if not offline:
        state_dir = args.state.parent
        scan = phase.merged(scan, launch, state.read_capture(state_dir))
        stopped = state.current(state.read_stopped(state_dir), scan.start)
    current = state.current(launch, scan.start)
    need_config = current is None and not (scan.decode_list and scan.prefill_list)
    expected = phase.expected_counts(scan, current, configured_counts(os.environ) if need_config else None)
    if args.expect_decode is not None:
        expected = (args.expect_decode, expected[1])
    alive = pid_alive(int(current["pid"])) if current and current.get("pid") else None
    http = None
    if phase.log_says_ready(scan) and not args.no_http:
        http = http_status(args.url, "/health", args.timeout)
    quiet = None if offline or not data else log_quiet_seconds(args.log_path)
    result = phase.decide(
        scan, expected, alive, args.accept_partial, http, quiet, args.stall_seconds, stopped
    )
    if not offline:  # a saved log alone has no verification to read
        result = phase.gated(result, args.verify, state.read_verified(args.state.parent))
    recorded = None if offline else state.read_failed(args.state.parent)
    if recorded is not None:  # the entrypoint gave up and waits, showing why
        result |= {
            "phase": "failed",
            "reason": f"{recorded.get('reason')} (exit code {recorded.get('code')}; the container waits: fix it, then restart it)",
            "failed_code": recorded.get("code"),
            "failure_kind": "recorded",
            "hung": False,  # a recorded failure waits for a fix: not the hang of an old log a restart would clear
        }
    if current is not None and current.get("doctor_warnings"):
        result["doctor_warnings"] = [f"{w['name']}: {w['detail']}" for w in current["doctor_warnings"]]
    result["log"] = str(args.log_path)
    result["log_quiet_seconds"] = None if quiet is None else round(quiet, 1)
    result["ready_at"] = scan.ready_at
    return result


def from_the_log(environ: Mapping[str, str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The probe without HTTP, with the settings of the current run (read anew: each start has its launch.json), as
    the exporter runs it on a scrape, the stall watchdog on a tick and the support bundle once: its args and result."""
    args = parse_args(["--no-http"], settings_of_this_run(dict(environ)))
    return args, probe(args)


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
    result = probe(args)
    if args.json:
        print(json.dumps(result))
    if args.status or not args.json:
        now = datetime.datetime.now(datetime.UTC)
        print(phase.status_line(result, seconds_since(result["started_at"], now)))
    if args.started:
        # Kubernetes' startup probe: done once ready, and also once failed, so that liveness judges a hang
        # (restart) and a recorded failure (wait) instead of the startup budget restarting either blindly.
        return (
            0
            if result["phase"] == "failed" or (result["phase"] == "ready" and result["http"] in (None, 200))
            else 1
        )
    if args.live:
        # Alive: not failed (a hang while starting is failed), and once ready /health answers; Kubernetes
        # counts liveness_failures of these in a row before it restarts the container.
        # Only what a restart can clear fails it: a hung start, or a ready server whose /health fails (a stuck
        # scheduler). Any other failure (a recorded one, a short capture) would only reload the weights for nothing.
        return 1 if result.get("hung") or result["http"] not in (None, 200) else 0
    # Ready to serve: the log says ready and /health answers 200 (a 503 after the ready line: draining, or
    # latched unhealthy by a /health that timed out; the phase stays ready, this probe fails).
    return 0 if result["phase"] == "ready" and result["http"] in (None, 200) else 1


if __name__ == "__main__":
    sys.exit(main())
