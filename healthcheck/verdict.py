"""The start's verdict, the one contract between the server log and everything that acts on a start: its phases
(declared here once; the README's table, the exporter's labels, the dashboard and the alert rules are rendered
from or checked against `Phase`), what a probe observes (`Observation`) and what is decided (`Verdict`).

healthcheck/probe.py observes (reads only) and healthcheck/phase.py judges (a pure function of an Observation).
The healthcheck CLI, the exporter, the stall watchdog, the gate and the support bundle take a Verdict; ci/readiness
reads its JSON through the CLI (`healthcheck --json`), the gateway's rotation through the exporter's /ready.
Stdlib types already loaded by every probe (enum, typing): a probe runs as `python3 -S` on every Docker and
Kubernetes check, so no dataclasses here (its import alone costs a probe about 10 ms).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

from common.report import FAILED, FAILURE
from healthcheck.logscan import TAIL_BYTES, Scan


class Phase(StrEnum):
    """Where a start is. The values are the strings of the JSON, the metrics' labels and the exporter's /ready."""

    STARTING = "starting"
    LOADING = "loading"
    AUTOTUNING = "autotuning"
    CAPTURING = "capturing"
    WARMING_UP = "warming_up"
    VERIFYING = "verifying"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"

    @property
    def meaning(self) -> str:
        return MEANING[self][0]

    @property
    def typical(self) -> str:
        """How long it typically lasts on the target box (README: Reading the start)."""
        return MEANING[self][1]


# (what is happening, typical time on 8x RTX PRO 6000): the README's phase table is rendered from this (ci/render).
MEANING: dict[Phase, tuple[str, str]] = {
    Phase.STARTING: ("preflight passed, the server is importing and setting up NCCL", "< 1 min"),
    Phase.LOADING: (
        "~57 GB of weights per GPU",
        "~7 min at 1 GB/s cold; ~1 min only with all 410 GB in the host's page cache (docs/reference.md: Sizing)",
    ),
    Phase.AUTOTUNING: (
        "FlashInfer tunes its MoE kernels before capture, silent until it ends (`GLM5_AUTOTUNE_STALL_SECONDS`)",
        "minutes (an estimate)",
    ),
    Phase.CAPTURING: ("58 prefill graphs, then 52 decode batch sizes (512 down to 1), with counts", "~4 min"),
    Phase.WARMING_UP: ("capture done; `/health` answers 503 until the warm-up request returns", "< 1 min"),
    Phase.VERIFYING: (
        "the server is up; it answers the verification set before it counts as ready (below)",
        "~30 s; a reply asked again or a second run, minutes (estimates)",
    ),
    Phase.READY: (
        "the ready line after a capture with the expected counts, the start verified; healthy while `/health` "
        "answers 200",
        "",
    ),
    Phase.DRAINING: (
        "stopped (SIGTERM, recorded by the kit or logged by SGLang): finishing the requests in flight, taking no new "
        "ones; out of every rotation",
        "up to `GLM5_DRAIN_SECONDS`",
    ),
    Phase.FAILED: (
        "a traceback, out of memory, an exited server, fewer graphs than configured, a hang, or wrong answers, with "
        "the reason",
        "",
    ),
}
ON_THE_WAY = (
    Phase.STARTING,
    Phase.LOADING,
    Phase.AUTOTUNING,
    Phase.CAPTURING,
    Phase.WARMING_UP,
)  # a start not over yet


class Counts(NamedTuple):
    """CUDA graphs, decode batch sizes and prefill token shapes (None: not known)."""

    decode: int | None
    prefill: int | None


class Run(NamedTuple):
    """The run's settings, as one probe judges with them: the current start's launch.json (else glm5.toml and the
    environment), with the CLI's flags over them (healthcheck/probe.py)."""

    state_dir: Path
    log_path: Path
    port: int
    timeout: float  # GLM5_HEALTH_TIMEOUT: /health's bound
    stall_seconds: float  # GLM5_STALL_SECONDS
    autotune_stall_seconds: float | None  # GLM5_AUTOTUNE_STALL_SECONDS: the stall bound while autotuning
    accept_partial: bool  # GLM5_ACCEPT_PARTIAL_CAPTURE
    verify: str  # GLM5_VERIFY: enforce, report or off
    on_failure: str  # GLM5_ON_FAILURE: what the container does with a recorded failure
    url: str | None = None  # /health's server; None: not asked (the log alone)
    offline: bool = False  # a saved log alone (`--log`): no state file is read
    expect_decode: int | None = None  # the CLI's --expect-decode over the start's own count
    tail_bytes: int = TAIL_BYTES
    # GLM5_PROFILE=throughput: attention-DP groups, each with the pool rank 0's line names
    attn_dp_size: int = 1
    # The start's all-reduce (launch.json "allreduce": GLM5_ALLREDUCE and the doctor's check), and why.
    allreduce: str = "nccl"
    allreduce_why: str | None = None
    decode_max: int | None = None  # the largest decode batch a rank captures (launch.json's list)
    context_tokens: int | None = (
        None  # [gateway].context_tokens, what the gateway sizes a request at (launch.json)
    )
    # `--log FILE`: the counts a saved log is judged by where it names none (healthcheck/saved_log.py)
    fallback: Counts | None = None


class Stop(NamedTuple):
    """The current start's stop record (stopped.json)."""

    signal: str
    at: str


class Verification(NamedTuple):
    """What the start's own verification found (verified.json, verify/gate.py), without the per-item rows."""

    passed: bool
    verdict: str  # passed, degenerate, wrong or inconclusive (verify/run.py outcome)
    accuracy: float | None
    right: int | None
    items: int | None
    reasons: tuple[str, ...]
    regressed: tuple[str, ...]
    compared_with: str | None
    seconds: float | None
    build_id: str | None
    wrong: tuple[str, ...]  # the items answered wrongly
    inconclusive: tuple[str, ...]  # the items with no conclusion (no reply, or cut twice): named apart


class Recorded(NamedTuple):
    """A failure the kit recorded for the current start (failed.json): it gave up on it."""

    kind: str  # a kind of common.report.FAILURES
    code: int  # the container's exit code
    reason: str


class Observation(NamedTuple):
    """Everything the judgement reads, as read by one probe (healthcheck/probe.py observe)."""

    run: Run
    scan: Scan  # the log's facts, merged with what was kept of the current start
    expected: Counts  # graphs the current start asks for
    alive: bool | None  # its server process lives (None: unknown)
    http: int | str | None  # what /health answered (None: not asked)
    quiet: float | None  # seconds since the log last grew (None: unknown)
    stopped: Stop | None = None  # the current start was told to stop
    verification: Verification | None = None  # the current start's own (None: not done, or another start's)
    failed: Recorded | None = None  # a failure the kit recorded for the current start
    doctor_warnings: tuple[str, ...] = ()


class Verdict(NamedTuple):
    """What is decided of a start. `as_json()` is the healthcheck's `--json` object (its keys are a contract)."""

    phase: Phase
    reason: str | None
    start: int | None
    started_at: str | None
    ready_at: str | None
    captured: Counts
    expected: Counts
    ready_line: bool
    http: int | str | None
    server_alive: bool | None
    capacity: dict[str, float] | None
    failure_kind: str | None  # a kind of common.report.FAILURES
    hung: bool
    failed_code: int | None  # the exit code of a recorded failure
    verify: str | None
    verification: Verification | None
    doctor_warnings: tuple[str, ...]
    log: str
    log_quiet_seconds: float | None
    stall_seconds: float | None = None  # the stall bound that applies in this phase (None: none applies)
    # The all-reduce that runs: the log's word once SGLang said it (enabled, or a fallback to NCCL), else the start's
    # choice (launch.json, GLM5_ALLREDUCE); and why.
    allreduce: str | None = None
    allreduce_why: str | None = None

    @property
    def failure_code(self) -> int:
        """0 while nothing failed; the exit code of a recorded failure; else the exported code of what failed."""
        if self.phase is not Phase.FAILED:
            return 0
        if self.failed_code is not None:
            return self.failed_code
        found = FAILURE.get(str(self.failure_kind))
        return found.exported if found is not None else FAILED

    @property
    def serving(self) -> bool:
        """Ready by the healthcheck's rule (verified, not draining) and /health 200 where it was asked."""
        return self.phase is Phase.READY and self.http in (None, 200)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": str(self.phase),
            "reason": self.reason,
            "decode_captured": self.captured.decode,
            "decode_expected": self.expected.decode,
            "prefill_captured": self.captured.prefill,
            "prefill_expected": self.expected.prefill,
            "start": self.start,
            "started_at": self.started_at,
            "ready_line": self.ready_line,
            "http": self.http,
            "server_alive": self.server_alive,
            "capacity": self.capacity,
            "failure_kind": self.failure_kind,
            "hung": self.hung,
            "failed_code": self.failed_code,
            "verify": self.verify,
            "verification": None if self.verification is None else verification_json(self.verification),
            "log": self.log,
            "log_quiet_seconds": self.log_quiet_seconds,
            "ready_at": self.ready_at,
            "allreduce": self.allreduce,
            "allreduce_why": self.allreduce_why,
        }
        if self.doctor_warnings:
            out["doctor_warnings"] = list(self.doctor_warnings)
        return out


def verification_json(found: Verification) -> dict[str, Any]:
    """The verification as `--json` and the exporter's /ready carry it (lists where the type has tuples)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in found._asdict().items()}
