"""The healthcheck's judgement, as pure steps: what a probe observed (verdict.Observation: the log's facts, the
state files, the process, /health) -> counts -> phase -> the Verdict. `judge` is the one call; the steps are
testable alone.

No I/O here: the probe (healthcheck/probe.py) reads the log, the state files, /proc and /health and passes what it
read in. The phases are healthcheck/verdict.py's `Phase`.
"""

from __future__ import annotations

from collections.abc import Callable

from common.report import FAILURE
from configuration.admission import per_replica
from healthcheck.logscan import Scan
from healthcheck.verdict import Counts, Observation, Phase, Run, Stop, Verdict

DECODE_DONE = ("decode_end", "decode_end_legacy")
DECODE_STARTED = ("decode_begin", "decode_list_legacy", "decode_frame")
PREFILL_STARTED = ("prefill_begin", "prefill_begin_legacy", "prefill_list_legacy", "prefill_frame")


def judge(obs: Observation) -> Verdict:
    """The verdict on the observed start: the log's phase (decide), then the correctness gate over it (gated, not
    for a saved log alone), then a failure the kit recorded over everything (recorded)."""
    found = decide(obs)
    return found if obs.run.offline else recorded(gated(found, obs), obs)


def recorded(v: Verdict, obs: Observation) -> Verdict:
    """A failure the kit recorded for this start (failed.json) decides: it gave up, and waits or exits, showing why,
    with the kind the record names."""
    if obs.failed is None:
        return v
    then = (
        "the container exits with it (GLM5_ON_FAILURE=exit)"
        if obs.run.on_failure == "exit"
        else "the container waits: fix it, then `docker compose up -d glm5` (it re-reads glm5.env; --force-recreate "
        "after a fix elsewhere: `restart` keeps the count of crashed and hung starts) or delete the pod"
    )
    return v._replace(
        phase=Phase.FAILED,
        reason=f"{obs.failed.reason} (exit code {obs.failed.code}; {then})",
        failed_code=obs.failed.code,
        failure_kind=obs.failed.kind,
        hung=False,  # a recorded failure waits for a fix: not the hang of an old log a restart would clear
    )


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


def crash(scan: Scan) -> tuple[str, str]:
    """What ended a start's server, as a kind of common.report.FAILURES and its reason: the fatal line of its log,
    else that it exited."""
    if scan.failure is None:
        return "exited", f"the server process of start #{scan.start} exited (see the log above it)"
    # An exception whose cause is out of memory is that, whichever line reported it.
    kind = "oom" if "out of memory" in scan.failure else str(scan.failure_event)
    return kind, explain_failure(scan)


def capacity(scan: Scan, run: Run) -> dict[str, float] | None:
    """The scheduler's sizes line (rank 0's: under DP attention one group's pool, every group alike), the
    attention-DP groups the start runs (launch.json), so that a reader sizes the replica as groups x pool, and what
    the gateway admits to it: per group what the pool holds of [gateway].context_tokens, at most a rank's largest
    decode graph (KEDA's unit)."""
    if scan.capacity is None:
        return None
    found = scan.capacity | {"attn_dp_size": float(run.attn_dp_size)}
    if run.decode_max and run.context_tokens:  # what the gateway admits to it (configuration/admission.py)
        each = per_replica(run.decode_max, scan.capacity["max_total_num_tokens"], run.context_tokens)
        found["admitted_requests"] = float(run.attn_dp_size * each)
    return found


def decide(obs: Observation) -> Verdict:
    """The phase from the log, the process and /health. `obs.alive`: the current start's server process lives (None:
    unknown); `obs.http`: what /health answered (None: not asked); `obs.quiet`: seconds since the log last grew,
    past the stall bound before the ready line the start is hung. `obs.stopped`: once ready it is draining whatever
    the log says yet; before, it reads as it was, stopping; its processes killed or gone after the stop are the
    stop's doing, not a failure. While FlashInfer autotunes (silent until it ends) the bound is
    GLM5_AUTOTUNE_STALL_SECONDS when set."""
    scan, run, expected, stopped = obs.scan, obs.run, obs.expected, obs.stopped
    captured = Counts(*captured_counts(scan))
    v = Verdict(
        phase=Phase.STARTING, reason=None, start=scan.start, started_at=scan.started_at, ready_at=scan.ready_at,
        captured=captured, expected=expected, ready_line="ready" in scan.seen, http=obs.http,
        server_alive=obs.alive, capacity=capacity(scan, run), failure_kind=None, hung=False, failed_code=None,
        verify=None, verification=None, doctor_warnings=obs.doctor_warnings, log=str(run.log_path),
        log_quiet_seconds=None if obs.quiet is None else round(obs.quiet, 1),
        allreduce=scan.allreduce or run.allreduce,
        allreduce_why=scan.allreduce_why if scan.allreduce == "nccl" else run.allreduce_why,
    )  # fmt: skip
    if (scan.failure and not (stopped and scan.failure_event == "killed")) or (
        obs.alive is False and not stopped
    ):
        kind, why = crash(scan)
        return v._replace(phase=Phase.FAILED, failure_kind=kind, reason=why)
    short = shortfall(scan, captured, expected, run.accept_partial)
    if short is not None:
        return v._replace(phase=Phase.FAILED, failure_kind=short[0], reason=short[1])
    if "ready" in scan.seen:  # once the server said so: ready or failed, never on its way again
        if not decode_done(scan):
            v = v._replace(
                reason="no decode capture in the log; graph counts unknown (not a start of this kit?)"
            )
        # Stopped: out of every rotation now, finishing what it has (GLM5_DRAIN_SECONDS).
        if "draining" in scan.seen or stopped:
            return v._replace(
                phase=Phase.DRAINING,
                reason=stop_reason(stopped, "finishing the requests in flight; no new ones"),
            )
        if obs.http is None or obs.http == 200:
            return v._replace(phase=Phase.READY)
        return v._replace(phase=Phase.READY, reason=f"/health answered {obs.http}: not serving now")
    v = v._replace(phase=on_the_way(scan))
    if stopped:
        v = v._replace(reason=stop_reason(stopped, "the start ends here"))
    autotuning = v.phase is Phase.AUTOTUNING and run.autotune_stall_seconds is not None
    bound, setting = (
        (run.autotune_stall_seconds, "GLM5_AUTOTUNE_STALL_SECONDS")
        if autotuning
        else (run.stall_seconds, "GLM5_STALL_SECONDS")
    )
    v = v._replace(stall_seconds=bound)
    if obs.quiet is not None and bound is not None and obs.quiet > bound:
        return v._replace(
            phase=Phase.FAILED,
            hung=True,  # the one failure of a start that a restart can clear (the stall watchdog acts on it)
            failure_kind="hung",
            reason=f"no server log output for {obs.quiet:.0f} s while {v.phase} ({setting}={bound:g}): a hang; "
            + HANG_CAUSE.get(v.phase, HANG_CAUSE[Phase.LOADING]),
        )
    return v


def on_the_way(scan: Scan) -> Phase:
    """Where a start not yet ready is, from its log."""
    if "autotune_begin" in scan.seen and "autotune_end" not in scan.seen:
        return Phase.AUTOTUNING
    if capture_open(scan) or between_captures(scan):
        return Phase.CAPTURING
    if decode_done(scan):
        return Phase.WARMING_UP
    if "load_begin" in scan.seen or "load_end" in scan.seen:
        return Phase.LOADING
    return Phase.STARTING


def fewer(captured: int | None, expected: int | None) -> bool:
    """Fewer graphs captured than expected, both known."""
    return captured is not None and expected is not None and captured < expected


def shortfall(scan: Scan, captured: Counts, expected: Counts, accept_partial: bool) -> tuple[str, str] | None:
    """A capture that ended with fewer graphs than the start asks for, or a ready line without one: its kind and
    reason (None: none, or accepted with GLM5_ACCEPT_PARTIAL_CAPTURE)."""
    if accept_partial:
        return None
    done = decode_done(scan)
    if done and fewer(captured.decode, expected.decode):
        return "decode_short", (
            f"decode CUDA graphs: captured {captured.decode} batch sizes, expected {expected.decode}; the performance "
            "configuration did not take effect (check --cuda-graph-max-bs-decode / GLM5_CUDA_GRAPH_MAX_BS_DECODE and "
            "max running requests in the log), or accept it with --accept-partial-capture / GLM5_ACCEPT_PARTIAL_CAPTURE=1"
        )
    if "prefill_end" in scan.seen and fewer(captured.prefill, expected.prefill):
        return "prefill_short", (
            f"prefill CUDA graphs: captured {captured.prefill} token shapes, expected {expected.prefill}; check "
            "--chunked-prefill-size and --cuda-graph-max-bs-prefill in the log, or accept it with "
            "--accept-partial-capture / GLM5_ACCEPT_PARTIAL_CAPTURE=1"
        )
    if "ready" in scan.seen and not done and expected.decode is not None:
        return "no_decode_capture", (
            f"the server became ready without a decode CUDA graph capture in the log (expected {expected.decode} "
            "batch sizes): decode runs without graphs"
        )
    return None


# Where a start hangs, what is known to cause it and the fix (the stall watchdog restarts a hang; when the same start
# hangs again, entrypoint/lifecycle records the failure with this).
HANG_CAUSE: dict[Phase, str] = {
    Phase.AUTOTUNING: "FlashInfer's MoE autotune was seen to spin forever on SM120 (github.com/vllm-project/vllm/"
    "issues/53963); fix: GLM5_EXTRA_ARGS=--disable-flashinfer-autotune (untuned kernels, some throughput lost)",
    Phase.CAPTURING: "full decode capture that never returns was seen on 8x RTX PRO 6000 (github.com/sgl-project/sglang/"
    "pull/29580); fix: GLM5_CUDA_GRAPH_MAX_BS_DECODE=256, or NCCL peer-to-peer (README: Troubleshooting)",
    Phase.LOADING: "NCCL peer-to-peer on PCIe is the known cause (README: Troubleshooting; entrypoint/doctor --nccl)",
}


def stop_reason(stopped: Stop | None, what: str) -> str:
    """Why a start is stopping: its stop record's signal and time, else the server's own drain line."""
    if stopped is None:
        return f"SIGTERM: {what}"
    return f"stopped ({stopped.signal} at {stopped.at}): {what}"


def gated(v: Verdict, obs: Observation) -> Verdict:
    """The correctness gate over a decided phase (GLM5_VERIFY): a start the log and /health call ready counts as
    ready only once its own verification passed; until then it is verifying. With enforce one that failed is failed
    (wrong_answers or verify_inconclusive, not hung: greedy answers repeat, so a restart cannot clear them and
    liveness leaves it); with report it is ready and says so; off: the phase as decided."""
    mode, found = obs.run.verify, obs.verification
    v = v._replace(verify=mode, verification=found)
    if mode == "off" or v.phase is not Phase.READY or v.http not in (None, 200) or v.start is None:
        return v  # (no start marker: a log not of this kit's starts, nothing verified it)
    if found is None:
        return v._replace(
            phase=Phase.VERIFYING,
            reason="the server is up; answering the verification set (verify/) before it counts as ready",
        )
    if found.passed:
        return v
    reasons = "; ".join(found.reasons or ["no reason recorded"])
    if mode == "report":
        return v._replace(reason=f"verification FAILED, serving anyway (GLM5_VERIFY=report): {reasons}")
    if found.verdict == "degenerate":
        return v._replace(
            phase=Phase.FAILED,
            failure_kind="degenerate_answers",
            reason=f"verification failed, every answer empty, one token repeated or ending in a run of one, as NaN "
            f"decode logits leave them (twice): {reasons}; next try: {FAILURE['degenerate_answers'].fix}",
        )
    if found.verdict == "inconclusive":
        return v._replace(
            phase=Phase.FAILED,
            failure_kind="verify_inconclusive",
            reason=f"verification inconclusive twice: {reasons} (replies cut at the raised token bound, or HTTP "
            "errors and timeouts after the retries: verified.json has each; the server is not known to answer rightly)",
        )
    return v._replace(
        phase=Phase.FAILED,
        failure_kind="wrong_answers",
        reason=f"verification failed, the server answers wrongly: {reasons} (twice; verified.json lists every "
        "item; README: Verification; GLM5_VERIFY=report serves anyway)",
    )


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


def status_line(v: Verdict, seconds_since_start: int | None) -> str:
    """One line for people: what the phase is doing, with its counts (STATUS holds one for every phase)."""
    since = (
        f", {seconds_since_start // 60}m{seconds_since_start % 60:02d}s since start #{v.start}"
        if seconds_since_start is not None
        else ""
    )
    return STATUS[v.phase](v) + since


def capturing(v: Verdict) -> str:
    if v.captured.decode is not None:
        return f"capturing decode graphs {v.captured.decode}/{v.expected.decode or '?'}"
    if v.captured.prefill is not None and v.captured.prefill == v.expected.prefill:
        return f"capturing: prefill graphs {v.captured.prefill}/{v.expected.prefill} done, decode graphs next"
    return f"capturing prefill graphs {v.captured.prefill or 0}/{v.expected.prefill or '?'}"


def ready(v: Verdict) -> str:
    what = f"ready (decode {v.captured.decode}/{v.expected.decode}, prefill {v.captured.prefill}/{v.expected.prefill})"
    if v.verification is not None and v.verification.passed:
        what += f", verified {v.verification.right}/{v.verification.items}"
    if v.capacity is not None:
        groups = v.capacity.get("attn_dp_size", 1)
        each = f" a group x {groups:.0f} attention-DP groups" if groups > 1 else ""
        what += (
            f", {v.capacity['max_total_num_tokens']:.0f} KV tokens{each}, "
            f"{v.capacity['max_running_requests']:.0f} running requests at most{' a group' if groups > 1 else ''}"
        )
    return what + (f", {v.reason}" if v.reason else "")


def with_reason(text: str) -> Callable[[Verdict], str]:
    return lambda v: text + (f" ({v.reason})" if v.reason else "")


STATUS: dict[Phase, Callable[[Verdict], str]] = {
    Phase.STARTING: with_reason("starting (no progress in the log yet)"),
    Phase.LOADING: with_reason("loading weights"),
    Phase.AUTOTUNING: lambda v: "autotuning FlashInfer's MoE kernels (silent until it ends; "
    f"stall bound {v.stall_seconds or 0:g} s)" + (f" ({v.reason})" if v.reason else ""),
    Phase.CAPTURING: capturing,
    Phase.WARMING_UP: lambda v: f"warming up (graphs done: decode {v.captured.decode}/{v.expected.decode})"
    + (f", {v.reason}" if v.reason else ""),
    Phase.VERIFYING: lambda v: f"verifying (graphs done: decode {v.captured.decode}/{v.expected.decode}; the "
    "verification set runs before it counts as ready)",
    Phase.READY: ready,
    Phase.DRAINING: lambda _v: "draining: stopped, finishing the requests in flight (readiness fails, so no new "
    "ones come)",
    Phase.FAILED: lambda v: f"failed: {v.reason}",
}
