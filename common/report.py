"""One way for every tool of the kit to report (the entrypoint, the healthcheck, the patches, the image checks and
the ci tools): a Problem names the setting, what is wrong and the fix;
a Log prints leveled lines on stderr (debug lines only with GLM5_DEBUG=1); EXIT_CODES is the one table
of exit codes and FAILURES the one table of a start's failure kinds, with their exit and exported codes (the README's
and docs/reference.md's tables are rendered from them by ci/render).

Stdlib only and cheap to import: the healthcheck probe uses it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import NamedTuple

# Exit codes. One meaning per number across the whole kit; each tool uses the subset listed for it.
OK = 0
FAILED = 1
USAGE = 2
INVALID_SETTING = 3
NEVER_READY = 4
SERVER_EXISTS = 5
FATAL = 70
WRONG_ANSWERS = 71
VERIFY_INCONCLUSIVE = 72
HUNG = 73
DECODE_SHORT = 74
PREFILL_SHORT = 75
NO_DECODE_CAPTURE = 76
DEGENERATE_ANSWERS = 77
NO_SERVER_PROGRAM = 127


class Failure(NamedTuple):
    """One kind of failed start: the one table the recorder (entrypoint/lifecycle.py), the exporter, the healthcheck
    and the docs read. `exit_code`: the container's, once the kit gave up on the start (recorded in failed.json);
    `exported`: glm5_start_failure_code while the kind is read from the log, before it is recorded (above 200, so
    it is never mistaken for an exit code; a recorded failure exports its exit code). `restart`: a restart may
    clear it, so the start is restarted and counted (hangs.json), given up past GLM5_START_RETRIES; else the kit
    gives up at once."""

    kind: str
    exit_code: int
    exported: int
    restart: bool
    meaning: str
    fix: str


# A crash of a start before it was verified restarts it; past GLM5_START_RETRIES the kit gives up with FATAL (70).
FAILURES: tuple[Failure, ...] = (
    Failure("oom", FATAL, 201, True, "out of memory, whichever line reported it", "lower GLM5_MEM_FRACTION_STATIC or GLM5_CUDA_GRAPH_MAX_BS_DECODE"),
    Failure("traceback", FATAL, 202, True, "a traceback before the ready line", "the exception in the server log names it"),
    Failure("capture_failed", FATAL, 203, True, "CUDA graph capture failed", "lower GLM5_CUDA_GRAPH_MAX_BS_DECODE, or see the capture error in the server log"),
    Failure("process_exception", FATAL, 204, True, "a server process hit an exception (fatal after the ready line too)", "the exception in the server log names it"),
    Failure("sigquit", FATAL, 205, True, "a server subprocess failed or crashed (SGLang's SIGQUIT)", "the subprocess's error in the server log names it"),
    Failure("nccl_watchdog", FATAL, 206, True, "the NCCL watchdog caught a collective timeout", "NCCL peer-to-peer (README: Troubleshooting; entrypoint/doctor --nccl)"),
    Failure("killed", FATAL, 207, True, "the server's processes were killed", "the kernel log (dmesg) or the container's memory limit"),
    Failure("exited", FATAL, 208, True, "the start's server process exited", "the lines above it in the server log"),
    Failure("hung", HUNG, 209, True, "no log output for GLM5_STALL_SECONDS while starting: a hang (the stall watchdog restarts it)", "the reason names where it hung and the known cause"),
    Failure("decode_short", DECODE_SHORT, 210, False, "fewer decode CUDA graphs captured than expected", "GLM5_CUDA_GRAPH_MAX_BS_DECODE and max running requests in the log, or GLM5_ACCEPT_PARTIAL_CAPTURE=1"),
    Failure("prefill_short", PREFILL_SHORT, 211, False, "fewer prefill CUDA graphs captured than expected", "--chunked-prefill-size and --cuda-graph-max-bs-prefill in the log, or GLM5_ACCEPT_PARTIAL_CAPTURE=1"),
    Failure("no_decode_capture", NO_DECODE_CAPTURE, 212, False, "ready without a decode CUDA graph capture: decode runs without graphs", "a flag in GLM5_EXTRA_ARGS that disables CUDA graphs, or GLM5_ACCEPT_PARTIAL_CAPTURE=1"),
    Failure("wrong_answers", WRONG_ANSWERS, 213, False, "the start's verification failed twice on wrong answers (GLM5_VERIFY=enforce; verified.json names the items)", "README: Verification; GLM5_VERIFY=report serves anyway"),
    Failure("verify_inconclusive", VERIFY_INCONCLUSIVE, 214, False, "the start's verification was inconclusive twice: replies cut at the raised token bound, or HTTP errors and timeouts after the retries", "verified.json has each reply; the server log the errors"),
    Failure("degenerate_answers", DEGENERATE_ANSWERS, 215, False, "the start's verification failed twice with every answer empty, one token repeated or ending in a run of one (after a first token from the prefill): what NaN decode logits give, a fault of the attention backend on this box, not of an item", "GLM5_DSA_BACKEND=tilelang (the same fp8 cache), else GLM5_KV_CACHE_DTYPE=bf16 (tilelang, half the requests a replica holds: docs/reference.md Sizing); GLM5_DSA_BACKEND's doc cites the public reports"),
    Failure("refused", INVALID_SETTING, INVALID_SETTING, False, "preflight refused the start: an invalid setting (3) or a problem with the box, the weights, FlashInfer or the flags (10-43, the first problem's code)", "the message names the setting and the fix"),
)  # fmt: skip
FAILURE = {f.kind: f for f in FAILURES}
GIVE_UP_CODES = sorted({f.exit_code for f in FAILURES if f.kind != "refused"})


def exit_code_row() -> tuple[str, str, str]:
    """The entrypoint's exit codes of a start the kit gave up on, one per failure kind, made from FAILURES."""
    parts = []
    for code in GIVE_UP_CODES:
        kinds = [f for f in FAILURES if f.exit_code == code]
        names = ", ".join(f"`{f.kind}`" for f in kinds)
        again = " more than GLM5_START_RETRIES starts in a row" if kinds[0].restart else ""
        parts.append(f"{code} {names}{again}")
    meaning = f"the kit gave up on the start, the code its failure kind's: {'; '.join(parts)} (docs/reference.md: Failure codes)"
    return f"{GIVE_UP_CODES[0]}-{GIVE_UP_CODES[-1]}", meaning, "entrypoint"


EXIT_CODES: tuple[tuple[str, str, str], ...] = (
    ("0", "success", "every tool"),
    ("1", "what the tool checks failed: not ready (healthcheck), a check (ci/smoke), a run (ci/bench), "
     "a score below the bar (ci/eval), "
     "a patch that does not apply or verify (patches/*), a stale file (ci/render --check)", "every tool"),
    ("2", "bad command line (unknown option, wrong argument), sweep file, or kernel selection (kernels/build: --modules, GLM5_KERNELS, MAX_JOBS)", "every tool but ci/test, which hands its arguments to pytest (a usage error there is pytest's 4)"),
    ("3", "a GLM5_* setting is invalid, unknown or removed; nothing was started (kernels/build: the CUDA toolkit or the memory is unfit; the healthcheck warns and judges with glm5.toml's value instead)", "entrypoint, launch, doctor, download, kernels/build, gateway/launch, ci/smoke, ci/bench, ci/eval"),
    ("4", "the server never became ready (failed start or timeout)", "ci/smoke"),
    ("5", "the compose service already has a container that the tool did not start: nothing was touched (use --url)", "ci/smoke, ci/bench --sweep"),
    ("10-43", "preflight found a problem with the box, the weights, FlashInfer or the flags (first problem's code; 41: GLM5_SKIP_PREFLIGHT names an unknown check)", "entrypoint, launch --prepare, launch --dry-run (41)"),
    ("30-36", "the weights are missing or incomplete, or lack what a setting needs (preflight's model check)", "download, launch --prepare"),
    exit_code_row(),
    ("127", "a program the tool needs is not installed: the server program (launch --serve); python3 3.11 or newer, or its venv module (the host-side tools)", "launch --serve, ci/render, ci/bench, ci/smoke, ci/eval, ci/setup-test-env, ci/test, doctor"),
)  # fmt: skip


def debug_enabled() -> bool:
    """GLM5_DEBUG (declared in entrypoint/glm5.toml), read here because every tool logs through this module,
    the image build's too, before entrypoint/ is in the image."""
    return os.environ.get("GLM5_DEBUG", "").strip().lower() in ("1", "true", "yes")


class Problem(Exception):
    """Something wrong with a setting or with the box: where, what, how to fix it, and its exit code."""

    def __init__(self, setting: str, message: str, fix: str = "", code: int = INVALID_SETTING) -> None:
        super().__init__(message)
        self.setting, self.message, self.fix, self.code = setting, message, fix, code

    def __str__(self) -> str:
        text = f"{self.setting}: {self.message}"
        return f"{text}; fix: {self.fix}" if self.fix else text

    def __repr__(self) -> str:
        return f"Problem({self.code}, {self!s})"


class Problems(Exception):
    """Several problems, collected before anything expensive starts."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @property
    def code(self) -> int:
        return self.problems[0].code if self.problems else OK


class Log:
    """Leveled lines on stderr, prefixed with the tool's name: `glm5-serve: warning: ...`."""

    def __init__(self, prog: str, debug: bool | None = None) -> None:
        self.prog = prog
        self.debug_on = debug_enabled() if debug is None else debug

    def _write(self, level: str, message: str) -> None:
        prefix = f"{self.prog}: " + (f"{level}: " if level else "")
        print(prefix + message, file=sys.stderr, flush=True)

    def debug(self, message: str) -> None:
        if self.debug_on:
            self._write("debug", message)

    def info(self, message: str) -> None:
        self._write("", message)

    def warning(self, message: str) -> None:
        self._write("warning", message)

    def error(self, message: str) -> None:
        self._write("error", message)

    def problems(
        self, problems: Iterable[Problem], what: str = "invalid setting(s); nothing was started"
    ) -> int:
        """Print each problem as an error line, then a count; return the first one's exit code."""
        found = list(problems)
        for problem in found:
            self.error(f"[{problem.code}] {problem}")
        if found:
            self.error(f"{len(found)} {what}")
        return found[0].code if found else OK
