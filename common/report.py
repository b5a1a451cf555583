"""One way for every tool of the kit to report (the entrypoint, the healthcheck, the patches, the image checks and
the ci tools): a Problem names the setting, what is wrong and the fix;
a Log prints leveled lines on stderr (debug lines only with GLM5_DEBUG=1); EXIT_CODES is the one table
of exit codes (the README's table is rendered from it by ci/render).

Stdlib only and cheap to import: the healthcheck probe uses it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

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
NO_SERVER_PROGRAM = 127

EXIT_CODES: tuple[tuple[str, str, str], ...] = (
    ("0", "success", "every tool"),
    ("1", "what the tool checks failed: not ready (healthcheck), a check (ci/smoke), a run (ci/bench), "
     "a score below the bar (ci/eval), "
     "a patch that does not apply or verify (patches/*), a stale file (ci/render --check)", "every tool"),
    ("2", "bad command line (unknown option, wrong argument), sweep file, or kernel selection (kernels/build: --modules, GLM5_KERNELS, MAX_JOBS)", "every tool but ci/test, which hands its arguments to pytest (a usage error there is pytest's 4)"),
    ("3", "a GLM5_* setting is invalid, unknown or removed; nothing was started (kernels/build: the CUDA toolkit or the memory is unfit; the healthcheck warns and judges with glm5.toml's value instead)", "entrypoint, launch, doctor, download, kernels/build, gateway/launch, ci/smoke, ci/bench, ci/eval"),
    ("4", "the server never became ready (failed start or timeout)", "ci/smoke"),
    ("5", "the compose service already has a container that the tool did not start: nothing was touched (use --url)", "ci/smoke, ci/bench --sweep"),
    ("10-42", "preflight found a problem with the box, the weights, FlashInfer or the flags (first problem's code; 41: GLM5_SKIP_PREFLIGHT names an unknown check)", "entrypoint, launch --prepare, launch --dry-run (41)"),
    ("30-36", "the weights are missing or incomplete, or lack what a setting needs (preflight's model check)", "download, launch --prepare"),
    ("70", "the server kept failing to start (supervisord FATAL)", "entrypoint"),
    ("71-72", "the start's verification failed in two whole runs (GLM5_VERIFY=enforce; verified.json names the items): 71 wrong answers, 72 inconclusive (replies cut at the raised token bound, or HTTP errors and timeouts after the retries)", "entrypoint"),
    ("73", "the start hung more than GLM5_START_RETRIES times in a row: the kit stopped restarting it (the reason names where and the fix)", "entrypoint"),
    ("127", "a program the tool needs is not installed: the server program (launch --serve); python3 3.11 or newer, or its venv module (the host-side tools)", "launch --serve, ci/render, ci/bench, ci/smoke, ci/eval, ci/setup-test-env, ci/test, doctor"),
)  # fmt: skip


# What failed, as a number a metric can carry without a label (monitoring/exporter.py's glm5_start_failure_code):
# a failure the entrypoint recorded (failed.json) carries its exit code above; one the healthcheck reads from the
# log carries its code here. Above 200, so no exit code is ever mistaken for one of these.
FAILURE_KINDS: tuple[tuple[int, str, str], ...] = (
    (201, "oom", "out of memory, whichever line reported it (lower GLM5_MEM_FRACTION_STATIC or GLM5_CUDA_GRAPH_MAX_BS_DECODE)"),
    (202, "traceback", "a traceback before the ready line"),
    (203, "capture_failed", "CUDA graph capture failed"),
    (204, "process_exception", "a server process hit an exception (fatal after the ready line too)"),
    (205, "sigquit", "a server subprocess failed (SGLang's sigquit)"),
    (206, "nccl_watchdog", "the NCCL watchdog caught a collective timeout"),
    (207, "killed", "the server's processes were killed"),
    (208, "exited", "the start's server process exited"),
    (209, "hung", "no log output for GLM5_STALL_SECONDS while starting: a hang (the stall watchdog restarts it, GLM5_START_RETRIES times at most; then exit code 73)"),
    (210, "decode_short", "fewer decode CUDA graphs captured than expected"),
    (211, "prefill_short", "fewer prefill CUDA graphs captured than expected"),
    (212, "no_decode_capture", "ready without a decode CUDA graph capture: decode runs without graphs"),
    (213, "wrong_answers", "the start's verification failed: the server answers wrongly (GLM5_VERIFY; verified.json names the items); once verify/gate records it (enforce), the exit code 71 or 72 instead"),
)  # fmt: skip
FAILURE_CODE = {kind: code for code, kind, _ in FAILURE_KINDS}


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
