#!/usr/bin/env python3
"""TEST DOUBLE of the SGLang 0.5.23 server: not SGLang, no model, no GPU.

It accepts the server's command line, prints startup output in SGLang 0.5.23's formats (weight
load, breakable prefill capture, decode capture with tqdm frames joined by carriage returns, the
ready line), then serves the HTTP contract the kit relies on: /health 503 until warm-up then 200,
/v1/models, /model_info, /v1/chat/completions (plain, streamed, tool calls, reasoning),
/v1/completions, /generate (streamed), /metrics (sglang_metrics_double.py: SGLang's series, driven by the
requests). Answers come from a small fixed table.

Behaviour is chosen with SGLANG_DOUBLE_MODE (comma list): ok, crash-loading, oom-capture,
short-capture, never-ready, slow-drain (a request that never finishes), slow-stream (50 ms per streamed
chunk), empty-text, wrong-answer, wrong-model, no-tools, no-reasoning, crash-once, long-prefill (after
ready the scheduler runs forward steps of SGLANG_DOUBLE_STEP seconds, default 3: a long chunked prefill),
stuck (SGLANG_DOUBLE_STUCK_AFTER seconds after ready the scheduler's step never ends: a hung NCCL
collective), hang-loading (the log stops
during weight loading, the process lives), box (the box's figures, tests/doubles/sglang_box.py: a KV pool in tokens
that holds each running request's prompt and answer, the rest queued in the server; a per-stream decode rate falling
with concurrency; chat answers with SGLANG_DOUBLE_ANSWER_TOKENS of thinking; `Prefill batch` and `Decode batch` log
lines; all under SGLANG_DOUBLE_TIME_SCALE), crash-verifying (on the first start only, once ready, the
scheduler dies at the SGLANG_DOUBLE_CRASH_AFTER_REQUESTS-th chat completion request, default 3: the verification's
first real traffic; the server then ends as 0.5.23 does, see `scheduler_crash`), crash-verifying-always (the same on
every start), nan-logits (every chat answer's first token right, as sampled from the prefill's logits, then one token repeated to its bound, no reasoning, no tool call: what NaN decode logits give, as reported on this box class with one DSA backend, entrypoint/glm5.toml GLM5_DSA_BACKEND). SGLANG_DOUBLE_RELOAD_SECONDS (default 0): every start after the first reloads the weights for this long
between its `Load weight begin` and `Load weight end` lines (the box's reload of 410 GB, scaled down), with a shard
progress line a second as SGLang's loader prints them, so that the log never goes quiet.

It answers questions by reading them, as a model would and without the kit's generator: a capital from its own
table, arithmetic by computing it, a code planted in a long context by finding it, JSON sums and products, a time
after a journey, a tool call's arguments from the request. The wrong modes answer wrongly the way SM120 NVFP4 bugs
do: garbage-past-length (garbled text for prompts longer than SGLANG_DOUBLE_GARBAGE_AFTER characters, default
40000: a fault only long contexts reach), wrong-in-batches (an arithmetic answer off by one while more than 4
requests are in flight: one batch size's graph wrong, batch 1 right), mangled-tool-call (arguments that are not
JSON). worded-otherwise answers rightly in other words (see `otherwise`), and honours max_tokens (a word a token):
a reply longer than its bound is cut there with finish_reason `length`, as SGLang cuts it.

Capacity as the scheduler enforces it: at most SGLANG_DOUBLE_MAX_RUNNING_REQUESTS (default 1024, the number its
sizes line prints) run at once, each for SGLANG_DOUBLE_SERVE_SECONDS (default 0), the rest wait as in SGLang's
queue; the most requests held at once goes to SGLANG_DOUBLE_STATE/peak-requests. While draining it serves what
arrives, as 0.5.23 does (only /health turns 503).

/health and /ready as 0.5.23 (entrypoints/http_server.py health_generate and ready, managers/
tokenizer_manager.py is_healthy/is_ready): both 503 while starting or draining; /health sends a one-token
request and polls every 1 s for any output from the scheduler (which comes when its current forward step
ends), 200 and status Up when one came, else after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) it logs "Health check
failed..." and latches status UnHealthy: /ready then answers 503 until a later /health succeeds, and a
SIGTERM force-exits with no drain (tokenizer_manager.py sigterm_watchdog).
SGLANG_DOUBLE_TICK scales the pauses (seconds per step, default 0.01); SGLANG_DOUBLE_DRAIN_POLL stands for
the 5 s sleeps of 0.5.23's drain loop (default 0.5).

Stopping, as SGLang 0.5.23 does it (read from its source):
- A child process stands in for the TP schedulers: same process group, no SIGTERM handler
  (managers/scheduler.py installs none) and PR_SET_PDEATHSIG=SIGKILL (utils/common.py
  kill_itself_when_parent_died), so it dies at once on a group SIGTERM and when the main process dies.
- Main process, while loading and capturing: no SIGTERM handler (the default action ends it at once).
- Once HTTP is up and before the first request: SIGTERM stops the HTTP server (entrypoints/http_server.py wires
  SIGTERM to server.stop until auto_create_handle_loop replaces it).
- From the first request on (the warm-up request is the first): managers/tokenizer_manager.py's drain.
  `SignalHandler.sigterm_handler` logs "SIGTERM received. ... Draining requests and shutting down...";
  /health answers 503; `sigterm_watchdog` notices within 5 s, logs "Gracefully exiting... Remaining number of
  requests N. ..." every 5 s until none remain (requests that still arrive are served), then sends
  ShutdownReq to the schedulers and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import sglang_box
from sglang_metrics_double import Metrics
from sglang_rules import decode_batch_sizes as decode_sizes
from sglang_rules import prefill_token_sizes as prefill_sizes

MODES = set(filter(None, os.environ.get("SGLANG_DOUBLE_MODE", "ok").split(",")))
TICK = float(os.environ.get("SGLANG_DOUBLE_TICK", "0.01"))
ANSWERS = {
    "capital of france": "Paris",
    "2+2": "4",
    "2 + 2": "4",
    "count to 60": " ".join(map(str, range(1, 61))),
}
DRAIN_POLL = float(os.environ.get("SGLANG_DOUBLE_DRAIN_POLL", "0.5"))
STATE: dict[str, Any] = {
    "ready": False, "requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "draining": False,
    "status": "Starting",  # ServerStatus: Starting, Up, UnHealthy
    "last_receive": 0.0,  # tokenizer_manager.last_receive_tstamp: the scheduler's last output
}  # fmt: skip
HEALTH_CHECK_TIMEOUT = int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
STEP = float(os.environ.get("SGLANG_DOUBLE_STEP", "3")) if "long-prefill" in MODES else TICK
IN_FLIGHT: set[str] = set()  # rid_to_state
METRICS: list[
    Metrics
] = []  # made at the first request or scrape, once the model name is known (tests/doubles/sglang_metrics_double.py)
SCHEDULERS: list[subprocess.Popen[bytes]] = []
BOX: list[sglang_box.Pool] = []  # mode box: the KV pool, made once the captured decode batches are known


def stamp(rank: int | None = None) -> str:
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"[{now} TP{rank}]" if rank is not None else f"[{now}]"


def log(line: str, rank: int | None = None) -> None:
    sys.stdout.write(f"{stamp(rank)} {line}\n")
    sys.stdout.flush()


def tqdm_frames(label: str, key: str, values: list[int], avail: float, fail_at: int | None = None) -> None:
    """tqdm frames on one line joined by \\r, in capture order (largest first), as TP0 prints them."""
    total = len(values)
    sys.stdout.write(f"  0%|          | 0/{total} [00:00<?, ?it/s]")
    for n, value in enumerate(reversed(values)):
        if fail_at is not None and n == fail_at:
            sys.stdout.write("\n")
            sys.stdout.flush()
            return
        pct = int(100 * n / total)
        bar = ("#" * (pct // 10)).ljust(10)
        sys.stdout.write(
            f"\r{label} ({key}={value} avail_mem={avail:.2f} GB): {pct:3d}%|{bar}| {n}/{total} [00:{n:02d}<00:10, 4.20it/s]"
        )
        sys.stdout.flush()
        time.sleep(TICK)
    sys.stdout.write(
        f"\r{label} ({key}={values[0]} avail_mem={avail:.2f} GB): 100%|##########| {total}/{total} [00:12<00:00, 4.20it/s]\n"
    )
    sys.stdout.flush()


def traceback_exit(kind: str) -> None:
    sys.stdout.write("Traceback (most recent call last):\n")
    sys.stdout.write(
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 3312, in run_scheduler_process\n'
    )
    if kind == "oom":
        sys.stdout.write(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity of 94.97 GiB "
            "of which 612.00 MiB is free.\n"
        )
    else:
        sys.stdout.write("RuntimeError: TllmGenFmhaRunner: Unsupported architecture\n")
    log("Received sigquit from a child process. It usually means the child failed.")
    sys.stdout.flush()
    sys.exit(1)


def startup(args: argparse.Namespace) -> None:
    # entrypoints/engine.py: logger.info(f"server_args={_server_args_for_logging(server_args)}"), the resolved
    # fields as a dict with only watermark secrets redacted: api_key is printed as it is.
    shown = {k: getattr(args, k) for k in ("model_path", "served_model_name", "tp_size", "port", "api_key")}
    log(f"server_args={shown}")
    for rank in range(args.tp_size):
        log("Load weight begin. avail mem=94.62 GB", rank)
    time.sleep(TICK * 5)
    if RELOAD_SECONDS > 0 and not first_start(LOADED_ONCE):
        reload_weights(RELOAD_SECONDS)
    if "crash-loading" in MODES or ("crash-once" in MODES and first_start()):
        traceback_exit("runtime")
    if "hang-loading" in MODES:  # a hung collective while loading: alive, silent
        time.sleep(3600)
    for rank in range(args.tp_size):
        log(
            "Load weight end. elapsed=36.12 s, type=GlmMoeDsaForCausalLM, quant=modelopt_fp4, avail mem=37.51 GB, mem usage=57.11 GB.",
            rank,
        )
    # Under --attn-dp-size D, 0.5.23 divides the chunk by D and re-clamps the prefill shapes to it
    # (srt/arg_groups/parallel_hook.py:327-360), and each rank's decode batches are multiples of its attention-TP size
    # (utils/common.py get_cuda_graph_batch_size_alignment; runner/base_cuda_graph_runner.py get_batch_sizes_to_capture).
    groups = args.attn_dp_size or 1
    chunk = (args.chunked_prefill_size or 8192) // groups
    prefill = prefill_sizes(min(8192, chunk))
    for rank in range(args.tp_size):
        log(
            f"Capture target prefill CUDA graph begin. backend=breakable, num_tokens={prefill}, avail mem=19.80 GB",
            rank,
        )
    tqdm_frames("Capturing prefill shape", "num_tokens", prefill, 19.8)
    for rank in range(args.tp_size):
        log(
            "Capture target prefill CUDA graph end. elapsed=21.40 s, mem usage=0.92 GB, avail mem=18.88 GB.",
            rank,
        )
    max_bs = args.cuda_graph_max_bs_decode or 512
    decode = decode_sizes(256 if "short-capture" in MODES else max_bs)
    if groups > 1:
        align = args.tp_size // groups
        decode = sorted({-(-bs // align) * align for bs in decode})
    for rank in range(args.tp_size):
        log(
            "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=18.88 GB",
            rank,
        )
    tqdm_frames("Capturing batches", "bs", decode, 18.88, fail_at=20 if "oom-capture" in MODES else None)
    if "oom-capture" in MODES:
        traceback_exit("oom")
    for rank in range(args.tp_size):
        log(
            f"Capture target decode CUDA graph end. bs={decode}, elapsed=187.30 s, mem usage=3.10 GB, avail mem=15.78 GB.",
            rank,
        )
    log(
        # srt/managers/scheduler.py:1269, 0.5.23's order and fields (max_prefill_tokens: --max-prefill-tokens' default)
        f"max_total_num_tokens={CAPACITY_TOKENS}, chunked_prefill_size={chunk}, max_prefill_tokens=16384, "
        f"max_running_requests={CAPACITY_REQUESTS}, context_len=202752, available_gpu_mem=15.61 GB",
        0,
    )


def first_start(name: str = "sglang-double-started-once") -> bool:
    """Whether this is the server program's first start under SGLANG_DOUBLE_STATE as NAME counts them: a marker file
    of that name, written at the first call (each use has its own name, so that one never answers for another)."""
    marker = Path(os.environ.get("SGLANG_DOUBLE_STATE", "/tmp")) / name
    if marker.exists():
        return False
    marker.write_text("1")
    return True


RELOAD_SECONDS = float(os.environ.get("SGLANG_DOUBLE_RELOAD_SECONDS", "0"))
LOADED_ONCE = "sglang-double-loaded-once"  # first_start's marker for SGLANG_DOUBLE_RELOAD_SECONDS
CRASHED_ONCE = "sglang-double-crashed-verifying"  # first_start's marker for crash-verifying
CRASH_AFTER = int(os.environ.get("SGLANG_DOUBLE_CRASH_AFTER_REQUESTS", "3"))
# crash-verifying: the chat request the scheduler dies on (None: never), the chat requests so far, and whether it died
CRASH: dict[str, Any] = {"at": None, "chats": 0, "crashed": False}
CRASH_LOCK = threading.Lock()
# 0.5.23's dump_requests_before_crash (managers/tokenizer_manager.py:3395-3397, 3481-3484) sleeps 5 s before its
# diagnostics: SGLANG_PYSPY_DUMP_BEFORE_CRASH and SGLANG_CUDA_COREDUMP_BEFORE_CRASH default true (srt/environ.py:401-402).
CRASH_DIAGNOSTICS_SLEEP = 5.0


def reload_weights(seconds: float) -> None:
    """A start after the first reads the weights again: SECONDS of tqdm frames of 0.5.23's safetensors loader
    (model_loader/weight_utils.py:1164-1170, utils/common.py:1414 BAR_FORMAT), one shard a second, joined by \\r as
    TP0 writes them, so the log grows all along (the kit's stall watchdog reads a quiet log as a hang)."""
    total = max(1, round(seconds))
    began = time.monotonic()
    for n in range(total + 1):
        elapsed = int(time.monotonic() - began)
        left = max(0, total - n)
        sys.stdout.write(
            ("\r" if n else "")
            + f"Loading safetensors checkpoint shards: {int(100 * n / total):3d}% Completed | "
            f"{n}/{total} [{elapsed // 60:02d}:{elapsed % 60:02d}<{left // 60:02d}:{left % 60:02d},  1.00it/s]"
        )
        sys.stdout.flush()
        if n < total:
            time.sleep(seconds / total)
    sys.stdout.write("\n")
    sys.stdout.flush()


def arm_crash() -> None:
    """crash-verifying: this start's scheduler dies at the CRASH_AFTER-th chat request (the first start only, its
    own marker so that crash-once's never answers for it); crash-verifying-always: on every start."""
    if "crash-verifying-always" in MODES or ("crash-verifying" in MODES and first_start(CRASHED_ONCE)):
        CRASH["at"] = CRASH_AFTER


def chat_received() -> bool:
    """Count a chat completion request of a ready server; True for the one the armed scheduler dies on."""
    if CRASH["at"] is None or not STATE["ready"]:
        return False
    with CRASH_LOCK:
        CRASH["chats"] += 1
        return CRASH["chats"] == CRASH["at"]


def scheduler_crash() -> None:
    """The scheduler dies (a SIGKILL: an OOM kill, a fault in a kernel) and the server ends as SGLang 0.5.23 ends it,
    its lines in order:
    - utils/watchdog.py:216-221, SubprocessWatchdog._check_processes (engine.py:1310-1316 names it scheduler_i):
      f"Subprocess {name} (pid={proc.pid}) crashed with exit code {proc.exitcode}. Triggering SIGQUIT for cleanup...",
      then os.kill(os.getpid(), signal.SIGQUIT);
    - managers/tokenizer_manager.py:4072-4081, SignalHandler.running_phase_sigquit_handler, which the loop's
      add_signal_handler calls with no arguments (tokenizer_manager.py:2457-2459):
      f"SIGQUIT received. {signum=}, {frame=}. It usually means one child failed.";
    - dump_requests_before_crash (tokenizer_manager.py:3481-3506): "Sleeping 5 seconds before crash diagnostics to let
      GPU activity settle.", then, no scheduler left alive (the double's one), "No live scheduler processes found;
      skipping py-spy and CUDA coredump.";
    - utils/common.py:2523-2526 and 2549-2552, kill_process_tree(os.getpid()): f"kill_process_tree called:
      parent_pid={parent_pid}, include_parent={include_parent}, pid={os.getpid()}", then itself.kill(): the server
      ends by SIGKILL.
    Meanwhile no request gets an answer (none comes from a dead scheduler) and /health gets no output. (The real
    watchdog polls every 1 s, watchdog.py:181: its line may come up to 1 s after the death; here at once.)"""
    CRASH["crashed"] = True
    child = SCHEDULERS[0]
    child.kill()
    child.wait()
    log(
        f"Subprocess scheduler_0 (pid={child.pid}) crashed with exit code {child.returncode}. "
        "Triggering SIGQUIT for cleanup..."
    )
    log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
    log("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
    time.sleep(CRASH_DIAGNOSTICS_SLEEP)
    log("No live scheduler processes found; skipping py-spy and CUDA coredump.")
    log(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent=True, pid={os.getpid()}")
    os.kill(os.getpid(), signal.SIGKILL)


def unanswered() -> None:
    """A request while the scheduler is dead: it waits for an output that never comes, until the server dies."""
    while True:
        time.sleep(3600)


CAPITALS = {"france": "Paris", "japan": "Tokyo", "italy": "Rome", "egypt": "Cairo", "canada": "Ottawa"}
CAPACITY_TOKENS = int(os.environ.get("SGLANG_DOUBLE_MAX_TOTAL_TOKENS", "412160"))
CAPACITY_REQUESTS = int(os.environ.get("SGLANG_DOUBLE_MAX_RUNNING_REQUESTS", "1024"))
RUNNING = threading.BoundedSemaphore(CAPACITY_REQUESTS)
SERVE_SECONDS = float(os.environ.get("SGLANG_DOUBLE_SERVE_SECONDS", "0"))  # each request's time on the "GPU"
PEAK = {"now": 0, "peak": 0}
PEAK_LOCK = threading.Lock()


def running(step: int) -> None:
    """Count the requests this replica holds now (running or waiting in its queue); the most ever at once goes to
    SGLANG_DOUBLE_STATE/peak-requests: the gateway's admission keeps it within the capacity the double printed."""
    with PEAK_LOCK:
        PEAK["now"] += step
        if PEAK["now"] > PEAK["peak"]:
            PEAK["peak"] = PEAK["now"]
            folder = os.environ.get("SGLANG_DOUBLE_STATE")
            if folder:
                Path(folder, "peak-requests").write_text(str(PEAK["peak"]))


GARBAGE_AFTER = int(os.environ.get("SGLANG_DOUBLE_GARBAGE_AFTER", "40000"))
BATCH_WRONG_ABOVE = 4  # wrong-in-batches: more requests in flight than this


def read_and_answer(prompt: str) -> str | None:
    """An answer worked out from the question itself, or None for a question it cannot read."""
    if m := re.search(r"Compute \((\d+) \+ (\d+)\) \* (\d+) - (\d+)\.", prompt):
        a, b, c, d = map(int, m.groups())
        value = (a + b) * c - d
        if "wrong-in-batches" in MODES:
            time.sleep(0.3)  # requests sent together overlap here, as a batch would
            if len(IN_FLIGHT) > BATCH_WRONG_ABOVE:
                value += 1
        return str(value)
    if m := re.search(r"What is the secret code for (\w+)\?", prompt):
        found = re.search(rf"The secret code for {m.group(1)} is (\w+)\.", prompt)
        return found.group(1) if found else "I do not know."
    if m := re.search(r"Parcel (\w+) weighs (\d+) kg and goes to (\w+)\.", prompt):
        return json.dumps({"parcel": m.group(1), "kg": int(m.group(2)), "city": m.group(3)})
    if m := re.search(r"leaves at (\d+):(\d+) pm and travels (\d+) hours (\d+) minutes", prompt):
        h, mi, sh, sm = map(int, m.groups())
        total = h * 60 + mi + sh * 60 + sm
        return f"It arrives at {total // 60}:{total % 60:02d} pm."
    if m := re.search(r"capital of (\w+)\?", prompt):
        return CAPITALS.get(m.group(1).lower())
    return None


def answer(prompt: str) -> str:
    if "empty-text" in MODES:
        return ""
    if "wrong-answer" in MODES:
        return "Lyon"
    if "garbage-past-length" in MODES and len(prompt) > GARBAGE_AFTER:
        return "zq!! ##\u00a4 0x0 0x0 0x0"
    low = prompt.lower()
    read = read_and_answer(prompt)
    if read is not None and re.search(r"(inside|within) \\boxed\{\}", prompt):
        # an evaluator's prompt (sgl-eval's math.yaml: "put the answer (and only answer) inside \boxed{}")
        return f"The answer is \\boxed{{{read}}}."
    if read is not None:
        return read
    return next((a for q, a in ANSWERS.items() if q in low), "I do not know.")


# worded-otherwise: the right answer in the wordings of a right GLM-5 that a strict judge took for wrong answers, as
# SGLang 0.5.23's glm45 reasoning parser and glm47 tool-call parser turn them into a reply (an estimate: the wordings
# of the audit's table, ../shared/research/turn4-audits/realbox-audit-2026-12-03.md F2, not measured from GLM-5).
# The thinking runs THINKING_WORDS words: past the reasoning item's 2,048-token bound, under 4 times it.
THINKING_WORDS = 3000
COUNTRIES = {"Lisbon": "Portugal", "Madrid": "Spain", "Vienna": "Austria", "Prague": "Czechia", "Dublin": "Ireland",
             "Warsaw": "Poland"}  # fmt: skip


def otherwise(prompt: str, text: str, structured: bool) -> str:
    """TEXT, the right answer, worded as a model might: working shown before a number, a sentence around a word, JSON
    after a one-line preface in a code fence (keys reordered and indented under a JSON schema: the grammar allows no
    preface), a time of day as 17:15."""
    if m := re.search(r"Compute \((\d+) \+ (\d+)\) \* (\d+) - (\d+)\.", prompt):
        a, b, c, d = map(int, m.groups())
        return f"({a} + {b}) * {c} - {d} = {a + b} * {c} - {d} = {(a + b) * c} - {d} = {text}"
    if m := re.search(r"capital of (\w+)\?", prompt):
        return f"The capital of {m.group(1)} is {text}."
    if m := re.search(r"What is the secret code for (\w+)\?", prompt):
        return f"The secret code for {m.group(1)} is **{text}**."
    if text.startswith("{"):
        value = json.loads(text)
        if structured:
            return json.dumps(dict(reversed(value.items())), indent=2)
        return f"Here is the JSON object:\n```json\n{json.dumps(value, indent=2)}\n```"
    if m := re.search(r"It arrives at (\d+):(\d+) pm\.", text):
        return f"The train arrives at {int(m.group(1)) % 12 + 12}:{m.group(2)}."
    return text


def cut(text: str, max_tokens: int | None) -> tuple[str, bool]:
    """TEXT cut at MAX_TOKENS words (a word a token), and whether it was."""
    words = text.split(" ")
    if max_tokens is None or len(words) <= max_tokens:
        return text, False
    return " ".join(words[:max_tokens]), True


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    args: argparse.Namespace

    def log_message(self, fmt: str, *a: Any) -> None:
        log(
            f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path}" {a[1] if len(a) > 1 else ""}'
        )

    def send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_status(self, code: int) -> None:  # fastapi Response(status_code=...): an empty body
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def authorized(self) -> bool:
        key = self.args.api_key
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self.send_json(401, {"error": "Unauthorized"})
            return False
        return True

    def model_name(self) -> str:
        return "not-glm" if "wrong-model" in MODES else (self.args.served_model_name or self.args.model_path)

    def metrics(self) -> Metrics:
        if not METRICS:
            METRICS.append(Metrics(self.model_name()))
            if BOX:  # the gauges read the box's pool: what runs in it, what waits for room
                METRICS[0].counts = lambda: (BOX[0].running, BOX[0].waiting)
        return METRICS[0]

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path in ("/health", "/health_generate"):
            self.send_status(health_generate())
        elif path == "/ready":
            self.send_status(200 if STATE["status"] == "Up" and not STATE["draining"] else 503)
        elif path == "/metrics":
            self.send_metrics()
        elif not self.authorized():
            return
        elif path == "/v1/models":
            self.send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.model_name(),
                            "object": "model",
                            "owned_by": "sglang",
                            "max_model_len": 202752,
                        }
                    ],
                },
            )
        elif path in ("/server_info", "/get_server_info"):
            # 0.5.23 (srt/entrypoints/http_server.py server_info, srt/utils/common.py build_server_info): the
            # resolved server args, the launch command, then the version; the keys masked as the image's patched
            # SGLang masks them (patches/0002-...: "<redacted>" when set, null when unset).
            self.send_json(
                200,
                {
                    "model_path": self.args.model_path,
                    "tp_size": self.args.tp_size,
                    "served_model_name": self.model_name(),
                    "api_key": "<redacted>" if self.args.api_key else None,
                    "launch_command": " ".join(sys.argv),
                    "version": "sglang-server-double",
                },
            )
        elif path in ("/model_info", "/get_model_info"):
            self.send_json(200, {"model_path": self.args.model_path, "is_generation": True})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if not self.authorized():
            return
        chat = self.path.split("?")[0] == "/v1/chat/completions"
        if CRASH["crashed"]:
            unanswered()
        if chat and chat_received():
            scheduler_crash()
        rid = uuid.uuid4().hex
        IN_FLIGHT.add(rid)
        running(+1)
        before = (STATE["prompt_tokens"], STATE["generation_tokens"])
        self.began, self.last_token, self.streaming = self.metrics().begin(), None, False
        held = 0
        try:
            with RUNNING:  # SGLang's scheduler runs max_running_requests at once; the rest wait in its queue
                if BOX:  # and only what its KV pool holds (the rest wait in the same queue)
                    held, prompt = self.box_tokens()
                    BOX[0].admit(held, prompt or None)
                time.sleep(SERVE_SECONDS)
                if CRASH["crashed"]:  # the batch it ran in died with the scheduler
                    unanswered()
                self.post()
        finally:
            if held:
                BOX[0].release(held)
            running(-1)
            IN_FLIGHT.discard(rid)
            if self.last_token is None:  # not streamed: the whole answer is the first token
                self.last_token = self.metrics().token(self.began, None, False)
            prompt, generated = STATE["prompt_tokens"] - before[0], STATE["generation_tokens"] - before[1]
            self.metrics().end(self.began, prompt, generated, self.streaming)

    def read_body(self) -> dict[str, Any]:
        if not hasattr(self, "body"):
            self.body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        return dict(self.body)

    def answer_tokens(self) -> int:
        """Mode box: the thinking a chat answer streams, cut at the request's max_tokens."""
        body = self.read_body()
        if self.path.split("?")[0] != "/v1/chat/completions":
            return 0
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or sglang_box.ANSWER_TOKENS
        return max(0, min(int(cap), sglang_box.ANSWER_TOKENS))

    def generate_prompt_tokens(self) -> int:
        """/generate's prompt: its token ids (bench_serving's random-ids sends them), else its text's length."""
        body = self.read_body()
        ids = body.get("input_ids")
        return len(ids) if isinstance(ids, list) else sglang_box.prompt_tokens(str(body.get("text") or ""))

    def box_tokens(self) -> tuple[int, int]:
        """Mode box: the KV tokens a request holds while it runs (its prompt and its answer), and its prompt's."""
        body = self.read_body()
        if self.path.split("?")[0] == "/generate":
            prompt = self.generate_prompt_tokens()
            return prompt + int((body.get("sampling_params") or {}).get("max_new_tokens", 16)), prompt
        prompt = json.dumps(body.get("messages") or body.get("prompt") or body.get("text") or "")
        return sglang_box.prompt_tokens(prompt) + self.answer_tokens(), 0

    def post(self) -> None:
        body = self.read_body()
        STATE["requests"] += 1
        path = self.path.split("?")[0]
        if path == "/v1/chat/completions":
            self.chat(body)
        elif path == "/v1/completions":
            text = answer(str(body.get("prompt", "")))
            self.count(str(body.get("prompt", "")), text)
            if body.get("stream"):
                self.stream(
                    [
                        {
                            "choices": [
                                {"index": 0, "text": " " + text if text else "", "finish_reason": None}
                            ]
                        },
                        {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
                    ],
                    "cmpl",
                )
            else:
                self.send_json(
                    200,
                    {
                        "id": "cmpl-" + uuid.uuid4().hex,
                        "object": "text_completion",
                        "model": self.model_name(),
                        "choices": [
                            {"index": 0, "text": (" " + text) if text else "", "finish_reason": "stop"}
                        ],
                        "usage": self.usage(str(body.get("prompt", "")), text),
                    },
                )
        elif path == "/generate":
            self.generate(body)
        else:
            self.send_json(404, {"detail": "Not Found"})

    def usage(self, prompt: str, text: str) -> dict[str, int]:
        # About 4 characters a token for English text, the common rule of thumb for BPE tokenizers
        # (help.openai.com/en/articles/4936856): a long prompt reports a length of the order a tokenizer would.
        p, c = max(1, len(prompt) // 4), len(text.split())
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def count(self, prompt: str, text: str) -> None:
        STATE["prompt_tokens"] += max(1, len(prompt.split()))
        STATE["generation_tokens"] += len(text.split())

    def chat(self, body: dict[str, Any]) -> None:
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        text = answer(prompt)
        self.count(prompt, text)
        thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        reasoning = (
            f"The user asks a short factual question; the answer is {text}." if thinking and text else None
        )
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "stop"
        worded = "worded-otherwise" in MODES
        if worded:
            structured = (body.get("response_format") or {}).get("type") == "json_schema"
            message["content"], was_cut = cut(otherwise(prompt, text, structured), body.get("max_tokens"))
            finish = "length" if was_cut else "stop"
            if reasoning:
                reasoning = " ".join(
                    ["Adding the journey to the departure time, step by step."] * (THINKING_WORDS // 9)
                )
                reasoning, was_cut = cut(reasoning, body.get("max_tokens"))
                if was_cut:  # glm45 on thinking with no </think>: all reasoning_content, content empty
                    message["content"], finish = "", "length"
        tools = body.get("tools") or []
        if tools and "no-tools" not in MODES:
            fn = tools[0]["function"]
            params = fn.get("parameters", {})
            arguments = {k: "Paris" for k in params.get("required", params.get("properties", {}))}
            if m := re.search(r"weather in (\w+) right now, in (celsius|fahrenheit)", prompt):
                city = m.group(1)
                arguments = {"location": f"{city}, {COUNTRIES.get(city, 'Europe')}" if worded else city,
                             "unit": m.group(2)}  # fmt: skip
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_" + uuid.uuid4().hex[:8],
                        "index": 0,
                        "type": "function",
                        "function": {
                            "name": fn["name"],
                            "arguments": json.dumps(arguments)[:-1] + ","
                            if "mangled-tool-call" in MODES
                            else json.dumps(arguments),
                        },
                    }
                ],
            }
            finish = "tool_calls"
        elif reasoning and "no-reasoning" in MODES:
            message["content"] = f"<think>{reasoning}</think>{text}"
        elif reasoning:
            message["reasoning_content"] = reasoning
        if "nan-logits" in MODES:  # the first token from the prefill, then every step's argmax: index 0
            bound = min(int(body.get("max_tokens") or 16), 64)
            message, finish = {"role": "assistant", "content": text[:4] + "!" * (bound - 1)}, "length"
        thinking_tokens = self.answer_tokens() if BOX else 0
        if thinking_tokens and not body.get("stream"):  # the whole answer is decoded before it is sent
            message["reasoning_content"] = " ".join(
                "think" for step in BOX[0].decode(thinking_tokens) for _ in range(step)
            )
            STATE["generation_tokens"] += thinking_tokens
        if body.get("stream"):
            chunks = [
                {
                    "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                    ]
                }
            ]
            if thinking_tokens:
                self.stream_thinking(thinking_tokens)
            if message.get("reasoning_content"):
                chunks.append(
                    {
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"reasoning_content": message["reasoning_content"]},
                                "finish_reason": None,
                            }
                        ]
                    }
                )
            for word in (message.get("content") or "").split(" "):
                if word:
                    chunks.append(
                        {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
                    )
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            self.stream(chunks, "chatcmpl")
            return
        self.send_json(
            200,
            {
                "id": "chatcmpl-" + uuid.uuid4().hex,
                "object": "chat.completion",
                "model": self.model_name(),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": self.usage(prompt, text),
            },
        )

    def generate(self, body: dict[str, Any]) -> None:
        params = body.get("sampling_params") or {}
        n = int(params.get("max_new_tokens", 16))
        text = " tok" * n
        meta = {
            "prompt_tokens": self.generate_prompt_tokens() if BOX else len(str(body.get("text", "")).split()),
            "completion_tokens": n,
            "finish_reason": {"type": "length", "length": n},
        }
        if BOX and body.get("stream"):
            self.stream_box_generate(n, meta)
            return
        STATE["generation_tokens"] += n
        if body.get("stream"):
            self.stream(
                [
                    {"text": text[: 4 * (i + 1)], "meta_info": meta | {"completion_tokens": i + 1}}
                    for i in range(n)
                ],
                "gen",
            )
        else:
            self.send_json(200, {"text": text, "meta_info": meta})

    def stream_box_generate(self, tokens: int, meta: dict[str, Any]) -> None:
        """Mode box: /generate's tokens as the decode makes them, each chunk the text so far, as SGLang streams it."""
        self.start_stream()
        done = 0
        for step in BOX[0].decode(tokens):
            done += step
            chunk = {"text": " tok" * done, "meta_info": meta | {"completion_tokens": done}}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            self.streaming = True
            self.last_token = self.metrics().token(self.began, self.last_token, True)
            STATE["generation_tokens"] += step
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def stream_thinking(self, tokens: int) -> None:
        """Mode box: the thinking streamed as the decode makes it, before stream() sends the answer."""
        self.start_stream()
        for step in BOX[0].decode(tokens):
            delta = {"reasoning_content": " think" * step}
            chunk = {"object": "chat.completion.chunk", "model": self.model_name(),
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            self.streaming = True
            self.last_token = self.metrics().token(self.began, self.last_token, True)
            STATE["generation_tokens"] += step

    def start_stream(self) -> None:
        if getattr(self, "stream_started", False):
            return
        self.stream_started = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def stream(self, chunks: list[dict[str, Any]], kind: str) -> None:
        self.start_stream()
        ident = f"{kind}-{uuid.uuid4().hex}"
        for chunk in chunks:
            if kind != "gen":
                chunk = {
                    "id": ident,
                    "object": "chat.completion.chunk" if kind == "chatcmpl" else "text_completion",
                    "model": self.model_name(),
                } | chunk
            if SCHEDULERS and SCHEDULERS[0].poll() is not None:
                # The schedulers generate the tokens: without them a request is cut, as in SGLang (its
                # subprocess watchdog then takes the server down).
                log("Received sigquit from a child process. It usually means the child failed.")
                self.close_connection = True
                return
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            self.streaming = True
            self.last_token = self.metrics().token(self.began, self.last_token, True)
            time.sleep(0.05 if "slow-stream" in MODES else TICK / 10)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def send_metrics(self) -> None:
        data = self.metrics().text()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def merge_config(argv: list[str]) -> list[str]:
    """`--config FILE.yaml` as 0.5.23 reads it (utils/server_args_config_parser.py): one file, YAML suffix, a mapping
    whose keys are flag names; its options go before the command line's, which win."""
    if "--config" not in argv:
        return argv
    import yaml

    at = argv.index("--config")
    path = Path(argv[at + 1])
    if path.suffix.lower() not in (".yaml", ".yml") or not path.exists():
        raise SystemExit(f"ValueError: Config file must be YAML format and exist: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    extra = [arg for key, value in data.items() for arg in (f"--{key.replace('_', '-')}", str(value))]
    return extra + argv[:at] + argv[at + 2 :]


def parse_args(argv: list[str]) -> argparse.Namespace:
    argv = merge_config(argv)
    parser = argparse.ArgumentParser(prog="sglang-server-double")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--cuda-graph-max-bs-decode", type=int)
    parser.add_argument("--chunked-prefill-size", type=int)
    parser.add_argument("--attn-dp-size", type=int)
    parser.add_argument("--api-key")
    return parser.parse_known_args(argv)[0]


def scheduler_child() -> None:
    """The TP scheduler stand-in: no SIGTERM handler; killed when the main process dies."""
    import ctypes

    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    while True:
        time.sleep(1)


def health_generate() -> int:
    if STATE["draining"] or STATE["status"] == "Starting":
        return 503
    tic = time.time()
    while time.time() < tic + HEALTH_CHECK_TIMEOUT:
        time.sleep(1)
        if STATE["last_receive"] > tic:
            STATE["status"] = "Up"
            return 200
    log(
        f"Health check failed. Server couldn't get a response from detokenizer for last {HEALTH_CHECK_TIMEOUT} "
        f"seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. last_heartbeat time: "
        f"{time.strftime('%H:%M:%S', time.localtime(STATE['last_receive']))}"
    )
    STATE["status"] = "UnHealthy"
    return 503


def scheduler_steps() -> None:
    """The schedulers' forward steps as the HTTP side sees them: an output at the end of each step (a
    request, or /health's one token, is answered when the step it joined ends). `stuck`: none ever ends."""
    stuck_at = time.time() + float(os.environ.get("SGLANG_DOUBLE_STUCK_AFTER", "0"))
    while True:
        if "stuck" in MODES and time.time() >= stuck_at:
            time.sleep(3600)
        time.sleep(STEP)
        if CRASH["crashed"]:  # a dead scheduler sends no output
            unanswered()
        STATE["last_receive"] = time.time()


class Server(ThreadingHTTPServer):
    """uvicorn's listen backlog (its --backlog, 2048 by default: www.uvicorn.org/settings), not socketserver's 5: 32 sent
    together on a loaded machine otherwise overflow it and get connection resets SGLang never gives."""

    request_queue_size = 2048


def main() -> None:
    if sys.argv[1:2] == ["--scheduler-child"]:
        scheduler_child()
    args = parse_args(sys.argv[1:])
    child = subprocess.Popen([sys.executable, __file__, "--scheduler-child"])
    SCHEDULERS.append(child)
    arm_crash()
    startup(args)  # loading and capture: SIGTERM's default action ends the process here
    if "box" in MODES:
        BOX.append(sglang_box.Pool(CAPACITY_TOKENS, args.cuda_graph_max_bs_decode or 512, log))
    Handler.args = args
    server = Server((args.host, args.port), Handler)

    def stop_http(_sig: int, _frame: Any) -> None:  # http_server.py: SIGTERM -> server.stop
        child.terminate()
        threading.Thread(target=server.shutdown, daemon=True).start()

    def drain(_sig: int, _frame: Any) -> None:  # SignalHandler.sigterm_handler
        log(f"SIGTERM received. signum={_sig} frame=None. Draining requests and shutting down...")
        if STATE["status"] == "UnHealthy":  # sigterm_watchdog: no drain after a failed health check
            log("Signal SIGTERM received while health check failed. Force exiting.")
            child.kill()
            os._exit(1)
        STATE["draining"] = True

    def watchdog() -> None:  # TokenizerManager.sigterm_watchdog
        while not STATE["draining"]:
            time.sleep(DRAIN_POLL)
        while True:
            remaining = sorted(IN_FLIGHT)
            log(
                f"Gracefully exiting... Remaining number of requests {len(remaining)}. "
                f"Remaining requests remaining_rids={remaining}."
            )
            if not remaining:
                break
            time.sleep(DRAIN_POLL)
        child.terminate()  # ShutdownReq to the schedulers
        child.wait(timeout=10)
        server.shutdown()

    handler = {"now": stop_http}

    def first_request() -> None:  # auto_create_handle_loop, run by the warm-up request
        handler["now"] = drain  # (a thread cannot call signal.signal: the main thread's handler dispatches)
        threading.Thread(target=watchdog, daemon=True).start()

    signal.signal(signal.SIGTERM, lambda sig, frame: handler["now"](sig, frame))
    log(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    if "never-ready" not in MODES:
        threading.Thread(target=warm_up, args=(first_request,), daemon=True).start()
    server.serve_forever()
    child.terminate()
    child.wait(timeout=10)


def warm_up(first_request: Any) -> None:
    time.sleep(TICK * 20)
    first_request()
    if "slow-drain" in MODES:
        IN_FLIGHT.add("double-stuck")  # a request that never finishes: the drain never ends by itself
    log('127.0.0.1:40000 - "POST /generate HTTP/1.1" 200')
    STATE["ready"] = True
    STATE["status"] = "Up"
    threading.Thread(target=scheduler_steps, daemon=True).start()
    log("The server is fired up and ready to roll!")


if __name__ == "__main__":
    main()
