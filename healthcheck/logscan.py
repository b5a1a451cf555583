"""Read SGLang's startup progress from the tail of its log: the only progress signal it gives.

Understands SGLang 0.5.23's lines (breakable prefill and full decode capture, with a TPn rank prefix,
tqdm frames joined by carriage returns) and the older formats (`Capture cuda graph bs [...]`,
`Capture cuda graph end. Time elapsed`, piecewise `Capturing num tokens`). Only the current run
counts: everything after the last `glm5-serve: server start #N` marker written by entrypoint/launch. A tail with no
marker is a foreign log, or the current start's log after its own lines left the window (or a rotation): for
that, the scan also keeps what ends a server whenever it comes (`server_failure`), which is all that counts after
the ready line; the start's own facts are remembered (healthcheck/phase.py merged). Works on bytes with compiled patterns, so a probe costs the same on a 1 GB log as on a small one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from configuration.state import MARKER, MARKER_TEXT

TAIL_BYTES = 4 * 1024 * 1024
NUMS = rb"\[([0-9, ]*)\]"
FRAME_TAIL = rb"[^)\r\n]*\):\s*\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+)"

EVENTS: dict[str, re.Pattern[bytes]] = {
    "load_begin": re.compile(rb"Load weight begin"),
    "load_end": re.compile(rb"Load weight end"),
    "prefill_begin": re.compile(
        rb"Capture target prefill CUDA graph begin\. backend=\w+, num_tokens=" + NUMS
    ),
    "prefill_begin_legacy": re.compile(rb"Capture piecewise CUDA graph begin"),
    "prefill_list_legacy": re.compile(rb"Capture cuda graph num tokens " + NUMS),
    "prefill_frame": re.compile(rb"Captur(?:ing prefill shape|ing num tokens) \(num_tokens=\d+" + FRAME_TAIL),
    "prefill_end": re.compile(rb"Capture (?:target prefill|piecewise) CUDA graph end"),
    # 0.5.23 (model_runner_components/cuda_graph_setup.py) prints the sizes on the end line; mid-2026 releases
    # printed them on the begin line instead (tests/fixtures/logs/real/13-*): both are read.
    "decode_begin": re.compile(
        rb"Capture target (?:decode|verify) CUDA graph begin|Capture cuda graph begin"
    ),
    "decode_begin_list": re.compile(
        rb"Capture target (?:decode|verify) CUDA graph begin\.[^\r\n]*? bs=" + NUMS
    ),
    "decode_list_legacy": re.compile(rb"Capture cuda graph bs " + NUMS),
    "decode_frame": re.compile(rb"Capturing batches \(bs=\d+" + FRAME_TAIL),
    "decode_end": re.compile(rb"Capture target (?:decode|verify) CUDA graph end\.(?: bs=" + NUMS + rb")?"),
    "decode_end_legacy": re.compile(rb"Capture cuda graph end\. Time elapsed"),
    # 0.5.23 srt/managers/scheduler.py (rank 0, once the KV pool is sized): what this replica can hold at once.
    # The last field is available_cpu_mem on the CPU engine (scheduler.py:1274), as the real-server tests run it.
    "capacity": re.compile(
        rb"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
        rb"max_running_requests=(\d+), context_len=(\d+), available_(?:gpu|cpu)_mem=([0-9.]+) GB"
    ),
    # 0.5.23 model_executor/runner/flashinfer_autotune.py: the MoE autotune before capture logs only its start (with
    # its cache, or "(cache reuse DISABLED ...") and its end: silent in between.
    "autotune_begin": re.compile(rb"Running FlashInfer autotune"),
    "autotune_end": re.compile(rb"FlashInfer autotune completed\."),
    "ready": re.compile(rb"The server is fired up and ready to roll!"),
    # 0.5.23 tokenizer_manager.py SignalHandler.sigterm_handler: the server drains (serves what arrives, /health 503).
    "draining": re.compile(rb"SIGTERM received\. [^\r\n]*Draining requests and shutting down"),
    "traceback": re.compile(rb"Traceback \(most recent call last\)"),
    "oom": re.compile(rb"(?:OutOfMemoryError|CUDA out of memory)[^\r\n]*"),
    # A subprocess that died: while launching (entrypoints/engine.py:1978), and while running, 0.5.23's watchdog line
    # (utils/watchdog.py:216-221) and its SIGQUIT handler's (managers/tokenizer_manager.py:4072-4074), seconds to a
    # minute before kill_process_tree (a core dump first: SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS).
    "sigquit": re.compile(
        rb"Received sigquit from a child process|Subprocess \S+ \(pid=\d+\) crashed with exit code -?\d+"
        rb"|SIGQUIT received\. [^\r\n]*It usually means one child failed"
    ),
    "capture_failed": re.compile(rb"Capture cuda graph failed[^\r\n]*"),
    # A server process that died or hung: fatal after the ready line too (a request's traceback is not).
    "process_exception": re.compile(
        rb"(?:Scheduler|DetokenizerManager|TokenizerManager|DataParallelController|MultiTokenizerRouter"
        rb"|MultiDetokenizerRouter) hit an exception"
    ),
    "nccl_watchdog": re.compile(
        rb"Watchdog caught collective operation timeout[^\r\n]*|ProcessGroupNCCL[^\r\n]*failure detected by watchdog[^\r\n]*"
    ),
    "killed": re.compile(rb"kill_process_tree[^\r\n]*"),
    # Which all-reduce runs (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1, configuration/allreduce_choice.py): 0.5.23's
    # FlashInfer PCIe-IPC lines. Enabled: srt/distributed/device_communicators/pcie_ipc_ar.py:241-245. Each
    # fallback leaves the reductions on NCCL and the start goes on, so none is fatal: the communicator's setup
    # raised (srt/distributed/parallel_state.py:501), FlashInfer without the kernels (pcie_ipc_ar.py:227-230), the
    # workspace not built on the first reduction (pcie_ipc_ar.py:287-291).
    "pcie_ipc_enabled": re.compile(rb"FlashInfer PCIe-IPC all-reduce enabled \(world=(\d+)"),
    "pcie_ipc_setup_failed": re.compile(rb"Setup FlashInfer PCIe-IPC allreduce failed with [^\r\n]*"),
    "pcie_ipc_missing": re.compile(
        rb"this FlashInfer build has no pcie_ipc_comm; falling back to NCCL all-reduce\."
    ),
    "pcie_ipc_workspace_failed": re.compile(
        rb"FlashInfer PCIe-IPC workspace \(max_numel=\d+\) failed: [^\r\n]*?; reductions stay on NCCL"
    ),
    # Reductions of another dtype than bf16 stay on NCCL, the bf16 ones do not (pcie_ipc_ar.py:117-123): noted only.
    "pcie_ipc_dtype": re.compile(
        rb"FlashInfer PCIe-IPC all-reduce serves bf16 only; (\S+) reductions stay on NCCL"
    ),
}
CAPACITY = ("max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests",
            "context_len", "available_gpu_mem_gb")  # fmt: skip
# Events that end the server whenever they come; a plain traceback or OOM ends only a start (before ready).
PROCESS_FATAL = ("sigquit", "process_exception", "nccl_watchdog", "killed")
START_FATAL = ("traceback", "oom", "capture_failed")
# A fallback's own line quotes the error it fell back from (a CUDA out of memory, say): never a failure of the start.
ALLREDUCE_FALLBACK = ("pcie_ipc_setup_failed", "pcie_ipc_missing", "pcie_ipc_workspace_failed")
# Every event line contains one of these; bytes.find locates them at memory speed, and the
# patterns then run only on those lines (a tqdm frame or a record between \r and \n counts as a line).
KEYWORDS = (
    b"Load weight",
    b"FlashInfer autotune",
    b"Captur",
    b"fired up",
    b"Traceback",
    b"OutOfMemoryError",
    b"out of memory",
    b"sigquit",
    b"SIGQUIT received",
    b"crashed with exit code",
    b"hit an exception",
    b"atchdog",
    b"kill_process_tree",
    b"max_total_num_tokens=",
    b"Draining requests",
    b"PCIe-IPC",
    b"no pcie_ipc_comm",
)
# SGLang's record stamp at a line's start: local time (utils/common.py configure_logger: datefmt
# "%Y-%m-%d %H:%M:%S", milliseconds with SGLANG_LOG_MS), then an optional rank prefix.
LOG_TIME = re.compile(rb"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d{3})?[\] ]")
EXCEPTION_LINE = re.compile(
    rb"^((?:[A-Za-z_][\w.]*)?(?:Error|Exception|Interrupt): [^\r\n]*"
    rb"|(?:[a-z_]\w*\.)+[A-Z]\w*: [^\r\n]*)",  # or a dotted class: torch._dynamo.exc.Unsupported: ...
    re.M,
)


class Scan:
    """What the current run's log says (a plain class: dataclasses costs a probe 10 ms to import)."""

    def __init__(self, bytes_read: int = 0, **facts: object) -> None:
        self.start: int | None = None
        self.started_at: str | None = None
        self.marker_expected: tuple[int, int] | None = None  # (decode, prefill) the kit's marker announced
        self.seen: set[str] = set()
        self.prefill_list: list[int] | None = None
        self.decode_list: list[int] | None = None
        self.decode_captured_list: list[int] | None = None
        self.prefill_frame: tuple[int, int] | None = None
        self.decode_frame: tuple[int, int] | None = None
        self.failure: str | None = None
        self.failure_event: str | None = None  # the EVENTS name that set `failure`
        # The ready line's own stamp (the server's local time), if it has one.
        self.ready_at: str | None = None
        self.capacity: dict[str, float] | None = None  # the scheduler's sizes line (CAPACITY keys)
        # The first event that ends a server even after the ready line (PROCESS_FATAL): (event, reason).
        self.server_failure: tuple[str, str] | None = None
        # The all-reduce the log says runs: "pcie_ipc" once enabled with no fallback after it, "nccl" after a
        # fallback, None when the log names none (SGLang's default: NCCL); the fallback's line in allreduce_why.
        self.allreduce: str | None = None
        self.allreduce_why: str | None = None
        self.bytes_read = bytes_read
        for key, value in facts.items():
            if not hasattr(self, key):
                raise TypeError(f"unknown scan fact {key}")
            setattr(self, key, value)


def read_tail(path: Path, limit: int = TAIL_BYTES) -> bytes:
    with path.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - limit))
        return fh.read(limit)


def numbers(raw: bytes) -> list[int]:
    return [int(x) for x in raw.split(b",") if x.strip()]


def scan(data: bytes) -> Scan:
    result = Scan(bytes_read=len(data))
    at = data.rfind(MARKER_TEXT.encode())
    if at >= 0:
        marker = MARKER.search(data, at)
        if marker is not None:
            result.start, result.started_at = int(marker.group(1)), marker.group(2).decode()
            if marker.group(3) is not None:
                result.marker_expected = (int(marker.group(3)), int(marker.group(4)))
            data = data[marker.end() :]
    for begin, end in event_lines(data):
        line = data[begin:end]
        found = sorted(
            (m.start(), name, m) for name, p in EVENTS.items() for m in [p.search(line)] if m is not None
        )
        if any(name in ALLREDUCE_FALLBACK for _, name, _m in found):
            found = [f for f in found if f[1] not in START_FATAL]
        for _, name, m in found:
            result.seen.add(name)
            record(result, name, m, data, begin + m.end())
            if name == "ready" and result.ready_at is None:
                stamp = LOG_TIME.match(line)
                result.ready_at = stamp.group(1).decode() if stamp else None
    return result


def event_lines(data: bytes) -> list[tuple[int, int]]:
    """(begin, end) of each line holding a keyword, in log order."""
    starts: dict[int, int] = {}
    for keyword in KEYWORDS:
        at = data.find(keyword)
        while at >= 0:
            begin = max(data.rfind(b"\n", 0, at), data.rfind(b"\r", 0, at)) + 1
            if begin not in starts:
                ends = [e for e in (data.find(b"\n", at), data.find(b"\r", at)) if e >= 0]
                starts[begin] = min(ends) if ends else len(data)
            at = data.find(keyword, starts[begin])
    return sorted(starts.items())


def record(result: Scan, name: str, m: re.Match[bytes], data: bytes, end: int) -> None:
    if name == "prefill_begin" or name == "prefill_list_legacy":
        result.prefill_list = numbers(m.group(1))
    elif name == "decode_list_legacy":
        result.decode_list = numbers(m.group(1))
    elif name == "decode_begin_list":
        result.decode_list = numbers(m.group(1))
    elif name == "decode_end" and result.decode_captured_list is None and m.group(1) is not None:
        result.decode_captured_list = numbers(m.group(1))
    elif name == "capacity":
        result.capacity = dict(zip(CAPACITY, (float(x) for x in m.groups()), strict=True))
    elif name == "prefill_frame":
        result.prefill_frame = (int(m.group(1)), int(m.group(2)))
    elif name == "decode_frame":
        result.decode_frame = (int(m.group(1)), int(m.group(2)))
    elif name == "pcie_ipc_enabled":
        result.allreduce = "pcie_ipc" if result.allreduce is None else result.allreduce
    elif name in ALLREDUCE_FALLBACK:
        result.allreduce, result.allreduce_why = "nccl", m.group(0).decode(errors="replace")[:200]
    elif fatal(result, name) and (result.failure is None or result.server_failure is None):
        reason = failure_reason(name, m, data, end)
        if result.failure is None and (name in PROCESS_FATAL or "ready" not in result.seen):
            result.failure, result.failure_event = reason, name
        if result.server_failure is None and name in PROCESS_FATAL:
            result.server_failure = (name, reason)


def fatal(result: Scan, name: str) -> bool:
    """Can this event end the server? A dead or hung server process (PROCESS_FATAL), except the `kill_process_tree`
    with which SGLang ends its own drain (a stop, not a failure); and before the ready line a traceback or an
    out-of-memory line too (after it, those belong to a request)."""
    if name == "killed":
        return "draining" not in result.seen
    return name in PROCESS_FATAL or name in START_FATAL


def exception_after(data: bytes, end: int) -> str:
    """The exception a traceback ends with: on the rest of this line ("... hit an exception: X: msg"), else the
    next exception line, else the last one before (pasted logs put it first), else say it is not there."""
    line_end = min((e for e in (data.find(b"\n", end), data.find(b"\r", end)) if e >= 0), default=len(data))
    rest = data[end:line_end].lstrip(b": ")
    exc = EXCEPTION_LINE.match(rest) or EXCEPTION_LINE.search(data, end)
    if exc is None:
        before = list(EXCEPTION_LINE.finditer(data, 0, end))
        exc = before[-1] if before else None
    return exc.group(1).decode(errors="replace")[:200] if exc else "(exception line not in the log)"


def failure_reason(name: str, m: re.Match[bytes], data: bytes, end: int) -> str:
    if name == "oom":
        return "out of memory: " + m.group(0).decode(errors="replace")[:200]
    if name == "capture_failed":
        return m.group(0).decode(errors="replace")[:200]
    if name == "traceback":
        return "traceback: " + exception_after(data, end)
    if name == "process_exception":
        return f"{m.group(0).decode(errors='replace')}: " + exception_after(data, end)
    if name == "nccl_watchdog":
        return "NCCL watchdog: " + m.group(0).decode(errors="replace")[:200]
    if name == "killed":
        return "the server's processes were killed (" + m.group(0).decode(errors="replace")[:120] + ")"
    return "a server subprocess failed (" + m.group(0).decode(errors="replace")[:160] + ")"
