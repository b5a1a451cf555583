"""The healthcheck's judgement, as pure steps: what a probe observed (verdict.Observation: the log's facts, the
state files, the process, /health) -> counts -> phase -> the Verdict. `judge` is the one call; the steps are
testable alone.

No I/O here: the probe (healthcheck/probe.py) reads the log, the state files, /proc and /health and passes what it
read in. The phases are healthcheck/verdict.py's `Phase`.
"""

from __future__ import annotations

from typing import Any

from healthcheck.logscan import Scan
from healthcheck.verdict import Counts, Observation, Phase, Verdict

DECODE_DONE = ("decode_end", "decode_end_legacy")
DECODE_STARTED = ("decode_begin", "decode_list_legacy", "decode_frame")
PREFILL_STARTED = ("prefill_begin", "prefill_begin_legacy", "prefill_list_legacy", "prefill_frame")


def judge(obs: Observation) -> Verdict:
    """The verdict on the observed start: the log's phase (decide), then the correctness gate over it (gated, not
    for a saved log alone), then a failure the entrypoint recorded over everything (recorded)."""
    out = decide(
        obs.scan,
        obs.expected,
        obs.alive,
        obs.accept_partial,
        obs.http,
        obs.quiet,
        obs.stall_seconds,
        obs.stopped,
        obs.autotune_stall_seconds,
    )
    if not obs.offline:
        out = recorded(gated(out, obs.verify, obs.verified), obs.failed, obs.on_failure)
    return Verdict(
        phase=Phase(out["phase"]),
        reason=out["reason"],
        start=out["start"],
        started_at=out["started_at"],
        ready_at=obs.scan.ready_at,
        captured=Counts(out["decode_captured"], out["prefill_captured"]),
        expected=Counts(*obs.expected),
        ready_line=out["ready_line"],
        http=obs.http,
        server_alive=obs.alive,
        capacity=obs.scan.capacity,
        failure_kind=out["failure_kind"],
        hung=bool(out.get("hung")),
        failed_code=out.get("failed_code"),
        verify=out.get("verify"),
        verification=out.get("verification"),
        doctor_warnings=obs.doctor_warnings,
        log=obs.log,
        log_quiet_seconds=None if obs.quiet is None else round(obs.quiet, 1),
        stall_seconds=out.get("stall_seconds"),
    )


def recorded(
    result: dict[str, Any], failed: dict[str, Any] | None, on_failure: str = "wait"
) -> dict[str, Any]:
    """A failure the entrypoint recorded (failed.json) decides: it gave up, and waits or exits, showing why. Its
    kind stays what the log or the gate showed (a wrong verification stays wrong_answers, exit code 71 or 72);
    "recorded" where they showed nothing."""
    if failed is None:
        return result
    shown = result.get("failure_kind") if result.get("phase") == Phase.FAILED else None
    then = (
        "the container exits with it (GLM5_ON_FAILURE=exit)"
        if on_failure == "exit"
        else "the container waits: fix it, then `docker compose up -d glm5` (it re-reads glm5.env; `restart` does "
        "not) or delete the pod"
    )
    return result | {
        "phase": Phase.FAILED,
        "reason": f"{failed.get('reason')} (exit code {failed.get('code')}; {then})",
        "failed_code": failed.get("code"),
        "failure_kind": shown or "recorded",
        "hung": False,  # a recorded failure waits for a fix: not the hang of an old log a restart would clear
    }


def decode_done(scan: Scan) -> bool:
    return any(e in scan.seen for e in DECODE_DONE)


def capture_open(scan: Scan) -> bool:
    """A capture has begun and not ended: decode (its begin, list or frames without an end), or prefill (the
    piecewise era captured it after decode)."""
    decode_open = bool(scan.seen.intersection(DECODE_STARTED)) and not decode_done(scan)
    prefill_open = bool(scan.seen.intersection(PREFILL_STARTED)) and "prefill_end" not in scan.seen
    return decode_open or prefill_open


def between_captures(scan: Scan) -> bool:
    """0.5.23 captures prefill first, then decode: after the prefill end and before the decode begin, still capturing
    (the weights are long loaded)."""
    return "prefill_end" in scan.seen and not scan.seen.intersection(DECODE_STARTED) and not decode_done(scan)


def log_says_ready(scan: Scan) -> bool:
    """The server printed its ready line, nothing fatal and no drain: /health decides whether it serves now."""
    return "ready" in scan.seen and scan.failure is None and "draining" not in scan.seen


def merged(scan: Scan, launch: dict[str, Any] | None, kept: dict[str, Any] | None) -> Scan:
    """The facts to judge. A tail that holds the current start's marker says everything itself. A tail without it
    comes after that start's own lines (they left the window, or the log was rotated): the start's remembered facts
    (capture.json, `kept`) with the tail's events merged in, never replaced by them: the drain line, and what ends a
    server (a traceback or an out-of-memory line there belongs to a request, as after the ready line)."""
    if scan.start is not None or launch is None or not kept or kept.get("start") != launch.get("start"):
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
    return Scan(**facts, bytes_read=scan.bytes_read)


def worth_keeping(scan: Scan) -> dict[str, Any] | None:
    """What to remember of a start (capture.json), so that its facts outlive the log's tail window: those of a start
    whose decode capture is done or that said it is ready (and, merged in later, its drain and what ended it)."""
    if scan.start is None or not (decode_done(scan) or "ready" in scan.seen):
        return None
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(scan).items() if k != "bytes_read"}


def expected_counts(
    scan: Scan, launch: dict[str, Any] | None, configured: tuple[int | None, int | None] | None
) -> tuple[int | None, int | None]:
    """(decode, prefill) graph counts to expect: the current start's launch.json, else the counts its start
    marker announced, else the lists the log printed (older formats), else the configuration (`configured`,
    None when the probe has none)."""
    decode = prefill = None
    if launch is not None and launch.get("start") == scan.start:
        decode, prefill = launch.get("decode_expected"), launch.get("prefill_expected")
    elif scan.marker_expected is not None:
        decode, prefill = scan.marker_expected
    elif scan.decode_list or scan.prefill_list:
        decode = len(scan.decode_list) if scan.decode_list else None
        prefill = len(scan.prefill_list) if scan.prefill_list else None
    if configured is not None:
        decode = decode if decode is not None else configured[0]
        prefill = prefill if prefill is not None else configured[1]
    return decode, prefill


def captured_counts(scan: Scan) -> tuple[int | None, int | None]:
    """(decode, prefill) graphs captured so far, from the end lines, lists or tqdm frames."""
    if scan.decode_captured_list is not None:
        decode: int | None = len(scan.decode_captured_list)
    elif decode_done(scan):
        decode = len(scan.decode_list) if scan.decode_list else (scan.decode_frame or (None, None))[1]
    else:
        decode = scan.decode_frame[0] if scan.decode_frame else (0 if "decode_begin" in scan.seen else None)
    if "prefill_end" in scan.seen:
        prefill = len(scan.prefill_list) if scan.prefill_list else (scan.prefill_frame or (None, None))[1]
    else:
        prefill = scan.prefill_frame[0] if scan.prefill_frame else None
    return decode, prefill


def decide(
    scan: Scan,
    expected: tuple[int | None, int | None],
    alive: bool | None,
    accept_partial: bool,
    http: int | str | None,
    quiet: float | None = None,
    stall_seconds: float | None = None,
    stopped: dict[str, Any] | None = None,
    autotune_stall_seconds: float | None = None,
) -> dict[str, Any]:
    """The phase. `alive`: the current start's server process lives (None: unknown). `http`: what /health
    answered (None: not asked). `quiet`: seconds since the log last grew (None: unknown); past
    `stall_seconds` before the ready line, the start is hung. `stopped`: the current start's stop record
    (stopped.json): once ready it is draining whatever the log says yet; before, it reads as it was, stopping; its
    processes killed or gone after the stop are the stop's doing, not a failure. While FlashInfer autotunes (silent
    until it ends) the bound is `autotune_stall_seconds` when given."""
    decode_captured, prefill_captured = captured_counts(scan)
    out: dict[str, Any] = {
        "phase": Phase.STARTING,
        "reason": None,
        "decode_captured": decode_captured,
        "decode_expected": expected[0],
        "prefill_captured": prefill_captured,
        "prefill_expected": expected[1],
        "start": scan.start,
        "started_at": scan.started_at,
        "ready_line": "ready" in scan.seen,
        "http": http,
        "server_alive": alive,
        "capacity": scan.capacity,  # what the replica holds at once, from the scheduler's line (None before it)
        "failure_kind": None,  # what failed, as a key of common.report.FAILURE_KINDS (metrics carry its code)
    }
    if scan.failure and not (stopped and scan.failure_event == "killed"):
        # An exception whose cause is out of memory is that, whichever line reported it.
        kind = "oom" if "out of memory" in scan.failure else scan.failure_event
        return out | {"phase": Phase.FAILED, "reason": explain_failure(scan), "failure_kind": kind}
    if alive is False and not stopped:
        return out | {
            "phase": Phase.FAILED,
            "failure_kind": "exited",
            "reason": f"the server process of start #{scan.start} exited (see the log above it)",
        }
    done = decode_done(scan)
    if done and expected[0] is not None and decode_captured is not None and decode_captured < expected[0]:
        if not accept_partial:
            return out | {
                "phase": Phase.FAILED,
                "failure_kind": "decode_short",
                "reason": (
                    f"decode CUDA graphs: captured {decode_captured} batch sizes, expected {expected[0]}; the performance "
                    "configuration did not take effect (check --cuda-graph-max-bs-decode / GLM5_CUDA_GRAPH_MAX_BS_DECODE and "
                    "max running requests in the log), or accept it with --accept-partial-capture / GLM5_ACCEPT_PARTIAL_CAPTURE=1"
                ),
            }
    prefill_done = "prefill_end" in scan.seen
    if (
        prefill_done
        and expected[1] is not None
        and prefill_captured is not None
        and prefill_captured < expected[1]
        and not accept_partial
    ):
        return out | {
            "phase": Phase.FAILED,
            "failure_kind": "prefill_short",
            "reason": (
                f"prefill CUDA graphs: captured {prefill_captured} token shapes, expected {expected[1]}; check "
                "--chunked-prefill-size and --cuda-graph-max-bs-prefill in the log, or accept it with "
                "--accept-partial-capture / GLM5_ACCEPT_PARTIAL_CAPTURE=1"
            ),
        }
    if "ready" in scan.seen:  # once the server said so: ready or failed, never on its way again
        if not done:
            if expected[0] is not None and not accept_partial:
                return out | {
                    "phase": Phase.FAILED,
                    "failure_kind": "no_decode_capture",
                    "reason": f"the server became ready without a decode CUDA graph capture in the log (expected "
                    f"{expected[0]} batch sizes): decode runs without graphs",
                }
            out["reason"] = "no decode capture in the log; graph counts unknown (not a start of this kit?)"
        # Stopped: out of every rotation now, finishing what it has (GLM5_DRAIN_SECONDS).
        if "draining" in scan.seen or stopped:
            return out | {
                "phase": Phase.DRAINING,
                "reason": stop_reason(stopped, "finishing the requests in flight; no new ones"),
            }
        if http is None or http == 200:
            return out | {"phase": Phase.READY}
        return out | {"phase": Phase.READY, "reason": f"/health answered {http}: not serving now"}
    if capture_open(scan) or between_captures(scan):
        out["phase"] = Phase.CAPTURING
    elif done:
        out["phase"] = Phase.WARMING_UP
    elif "load_begin" in scan.seen or "load_end" in scan.seen:
        out["phase"] = Phase.LOADING
    if "autotune_begin" in scan.seen and "autotune_end" not in scan.seen:
        out["phase"] = Phase.AUTOTUNING
    if stopped:
        out["reason"] = stop_reason(stopped, "the start ends here")
    autotuning = out["phase"] is Phase.AUTOTUNING and autotune_stall_seconds is not None
    bound, setting = (
        (autotune_stall_seconds, "GLM5_AUTOTUNE_STALL_SECONDS")
        if autotuning
        else (stall_seconds, "GLM5_STALL_SECONDS")
    )
    out["stall_seconds"] = bound
    if quiet is not None and bound is not None and quiet > bound:
        return (
            out
            | {
                "phase": Phase.FAILED,
                "hung": True,  # the one failure of a start that a restart can clear (the stall watchdog acts on it)
                "failure_kind": "hung",
                "reason": f"no server log output for {quiet:.0f} s while {out['phase']} ({setting}={bound:g}): a hang; "
                + HANG_CAUSE.get(out["phase"], HANG_CAUSE[Phase.LOADING]),
            }
        )
    return out


# Where a start hangs, what is known to cause it and the fix (the stall watchdog restarts a hang; when the same start
# hangs again, entrypoint/lifecycle records the failure with this).
HANG_CAUSE: dict[Phase, str] = {
    Phase.AUTOTUNING: "FlashInfer's MoE autotune was seen to spin forever on SM120 (github.com/vllm-project/vllm/"
    "issues/53963); fix: GLM5_EXTRA_ARGS=--disable-flashinfer-autotune (untuned kernels, some throughput lost)",
    Phase.CAPTURING: "full decode capture that never returns was seen on 8x RTX PRO 6000 (github.com/sgl-project/sglang/"
    "pull/29580); fix: GLM5_CUDA_GRAPH_MAX_BS_DECODE=256, or NCCL peer-to-peer (README: Troubleshooting)",
    Phase.LOADING: "NCCL peer-to-peer on PCIe is the known cause (README: Troubleshooting; entrypoint/doctor --nccl)",
}


def stop_reason(stopped: dict[str, Any] | None, what: str) -> str:
    """Why a start is stopping: its stop record's signal and time, else the server's own drain line."""
    if not stopped:
        return f"SIGTERM: {what}"
    return f"stopped ({stopped.get('signal', 'SIGTERM')} at {stopped.get('at', '?')}): {what}"


def verification_of(verified: dict[str, Any] | None, start: int | None) -> dict[str, Any] | None:
    """What the start's own verification found (verified.json, verify/gate.py), without the per-item rows; None
    before it is done or when the file is an earlier start's."""
    if verified is None or start is None or verified.get("start") != start:
        return None
    keys = (
        "passed",
        "accuracy",
        "right",
        "items",
        "reasons",
        "regressed",
        "compared_with",
        "seconds",
        "build_id",
    )
    missed = [r for r in verified.get("results", []) if not r.get("right")]
    # An item with no conclusion (no reply, or cut twice) is not a wrong answer: named apart, as the verdict does.
    unsure = [r["id"] for r in missed if r.get("outcome") == "inconclusive"]
    wrong = [r["id"] for r in missed if r.get("outcome") != "inconclusive"]
    return {k: verified.get(k) for k in keys} | {"wrong": wrong, "inconclusive": unsure}


def gated(result: dict[str, Any], mode: str, verified: dict[str, Any] | None) -> dict[str, Any]:
    """The correctness gate over a decided phase (GLM5_VERIFY): a start the log and /health call ready counts as
    ready only once its own verification passed; until then it is verifying. With enforce a wrong one is failed
    (wrong_answers, not hung: greedy answers repeat, so a restart cannot clear them and liveness leaves it); with
    report it is ready and says so; off: the phase as decided."""
    found = verification_of(verified, result["start"])
    out = result | {"verify": mode, "verification": found}
    if (
        mode == "off"
        or result["phase"] != Phase.READY
        or result["http"] not in (None, 200)
        or result["start"] is None
    ):
        return out  # (no start marker: a log not of this kit's starts, nothing verified it)
    if found is None:
        return out | {
            "phase": Phase.VERIFYING,
            "reason": "the server is up; answering the verification set (verify/) before it counts as ready",
        }
    if found["passed"]:
        return out
    wrong = "; ".join(found["reasons"] or ["no reason recorded"])
    if mode == "report":
        return out | {"reason": f"verification FAILED, serving anyway (GLM5_VERIFY=report): {wrong}"}
    return out | {
        "phase": Phase.FAILED,
        "failure_kind": "wrong_answers",
        "hung": False,
        "reason": f"verification failed, the server answers wrongly: {wrong} (verified.json lists every item; "
        "README: Verification; GLM5_VERIFY=report serves anyway)",
    }


def explain_failure(scan: Scan) -> str:
    reason = scan.failure or ""
    if "decode_begin" in scan.seen and not decode_done(scan):
        where = (
            f"during decode graph capture ({scan.decode_frame[0]}/{scan.decode_frame[1]})"
            if scan.decode_frame
            else "during decode graph capture"
        )
    elif scan.seen.intersection(("prefill_begin", "prefill_frame", "prefill_begin_legacy")) and (
        "prefill_end" not in scan.seen
    ):
        where = "during prefill graph capture"
    elif "load_begin" in scan.seen and "load_end" not in scan.seen:
        where = "while loading weights"
    elif "ready" in scan.seen:
        where = "while serving"
    else:
        where = "during start"
    hint = (
        "; lower GLM5_MEM_FRACTION_STATIC or GLM5_CUDA_GRAPH_MAX_BS_DECODE"
        if "out of memory" in reason
        else ""
    )
    return f"{reason} ({where}){hint}"


def status_line(result: dict[str, Any], seconds_since_start: int | None) -> str:
    """One line for people."""
    phase = result["phase"]
    since = (
        f", {seconds_since_start // 60}m{seconds_since_start % 60:02d}s since start #{result['start']}"
        if seconds_since_start is not None
        else ""
    )
    if phase == Phase.CAPTURING:
        if result["decode_captured"] is not None:
            what = f"capturing decode graphs {result['decode_captured']}/{result['decode_expected'] or '?'}"
        elif (
            result["prefill_captured"] is not None
            and result["prefill_captured"] == result["prefill_expected"]
        ):
            what = f"capturing: prefill graphs {result['prefill_captured']}/{result['prefill_expected']} done, decode graphs next"
        else:
            what = f"capturing prefill graphs {result['prefill_captured'] or 0}/{result['prefill_expected'] or '?'}"
    elif phase == Phase.FAILED:
        what = f"failed: {result['reason']}"
    elif phase == Phase.WARMING_UP:
        what = f"warming up (graphs done: decode {result['decode_captured']}/{result['decode_expected']})"
        what += f", {result['reason']}" if result["reason"] else ""
    elif phase == Phase.READY:
        what = f"ready (decode {result['decode_captured']}/{result['decode_expected']}, prefill {result['prefill_captured']}/{result['prefill_expected']})"
        if (found := result.get("verification")) is not None and found["passed"]:
            what += f", verified {found['right']}/{found['items']}"
        if (room := result.get("capacity")) is not None:
            what += f", {room['max_total_num_tokens']:.0f} KV tokens, {room['max_running_requests']:.0f} running requests at most"
        what += f", {result['reason']}" if result["reason"] else ""
    elif phase == Phase.VERIFYING:
        what = f"verifying (graphs done: decode {result['decode_captured']}/{result['decode_expected']}; the "
        what += "verification set runs before it counts as ready)"
    elif phase == Phase.DRAINING:
        what = "draining: stopped, finishing the requests in flight (readiness fails, so no new ones come)"
    elif phase == Phase.LOADING:
        what = "loading weights"
    else:
        what = "starting (no progress in the log yet)"
    return what + since
