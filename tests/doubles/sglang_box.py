"""The box's own figures for the SGLang 0.5.23 server double (SGLANG_DOUBLE_MODE=box): GLM-5-NVFP4 on 8x RTX PRO 6000.

TEST DOUBLE, not SGLang. Each figure carries its source, or is marked an estimate with its reasoning.

- KV pool in tokens: the double's sizes line prints max_total_num_tokens (SGLANG_DOUBLE_MAX_TOTAL_TOKENS, 412,160 by
  default: about 0.4 M tokens, ../shared/research/turn4-audits/realbox-audit-2026-12-03.md F5: 61 KB per token with
  fp8 MLA and the DSA indexer, sglang/srt/mem_cache/kv_cache_configurator.py, memory_pool.py). A request runs only
  when its prompt and its answer fit in what is left of the pool: the rest wait in the server's own queue, as 0.5.23's
  scheduler does (managers/schedule_policy.py PrefillAdder: a new request is added while rem_total_tokens holds its
  input and max_new_tokens x new_token_ratio; _get_running_request_total_token_offset). Simplification: the double
  reserves the whole answer (ratio 1.0, as SGLang does for ignore_eos), so it never retracts.
- Per-stream decode rate with n requests running: 51 / (1 + (n - 1) x 16 / 511) tokens/s. 51 tok/s at c=1 for GLM-5
  on SGLang TP8 without MTP (https://github.com/local-inference-lab/rtx6kpro/blob/master/models/glm5.md); 3 tok/s a
  stream at c=512 (1,490 tok/s aggregate, GLM-5.1 NVFP4 on SGLang, https://github.com/shivajid/sglang-rtx-pro-6000/
  blob/main/models/GLM5.1/nvfp4/results/benchmark_results_1node.md). Between them the curve is an estimate (one step
  of a decode batch grows linearly with its size); it gives 1,099 tok/s at c=64, against 1,010.6 measured without MTP
  (rtx6kpro models/glm5.md).
- Prefill: 8,000 tokens/s a replica. ESTIMATE: no public GLM-5 prefill figure on this box; a 16k context then takes
  2 s, within the 1-5 s TTFTs the public c=1 runs above report at short contexts.
- Answer length: SGLANG_DOUBLE_ANSWER_TOKENS (default 3,000) tokens, cut at the request's max_tokens. ESTIMATE:
  GLM-5 thinks before it answers; thousands of tokens of reasoning are the order public chat runs show
  (realbox audit F4), so minutes at the loaded rates above.
- Log: a `Prefill batch` line per admitted batch and a `Decode batch` line every 40 decode steps (0.5.23's
  decode_log_interval default, srt/arg_groups/fields/observability.py:136-139), in the formats of srt/managers/
  scheduler_components/metrics_reporter.py:753-762 and :963,1038-1042, at the rates above.

SGLANG_DOUBLE_TIME_SCALE (default 1) is wall seconds per box second: 0.01 runs the box 100 times faster, so a test
sets the kit's bounds by the same factor (GLM5_DRAIN_SECONDS, smg's flags after `--`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

SCALE = float(os.environ.get("SGLANG_DOUBLE_TIME_SCALE", "1"))
ANSWER_TOKENS = int(os.environ.get("SGLANG_DOUBLE_ANSWER_TOKENS", "3000"))
SINGLE_STREAM = 51.0  # tok/s at c=1 (rtx6kpro models/glm5.md, no MTP)
AT_512 = 3.0  # tok/s a stream at c=512 (1,490 aggregate, shivajid results_1node)
PREFILL_RATE = 8000.0  # tok/s, an estimate (module docstring)
LOG_INTERVAL = 40  # decode steps between `Decode batch` lines (decode_log_interval)
CHUNK_WALL = 0.05  # wall seconds between streamed chunks (tokens grouped, as --stream-interval does)


def per_stream_rate(running: int) -> float:
    """Tokens a second each of `running` streams gets."""
    n = max(1, running)
    return SINGLE_STREAM / (1 + (n - 1) * (SINGLE_STREAM / AT_512 - 1) / 511)


def prompt_tokens(text: str) -> int:
    """About 4 characters a token for English (help.openai.com/en/articles/4936856)."""
    return max(1, len(text) // 4)


class Pool:
    """The KV pool in tokens, and the server's queue of requests that do not fit yet."""

    def __init__(self, capacity: int, max_graph_bs: int, log: Callable[[str, int | None], None]) -> None:
        self.capacity, self.max_graph_bs, self.log = capacity, max_graph_bs, log
        self.used = 0
        self.running = 0
        self.waiting = 0
        self.cond = threading.Condition()
        threading.Thread(target=self.decode_log, daemon=True).start()

    def admit(self, tokens: int, prefill: int | None = None) -> None:
        """Wait in the queue until `tokens` fit, then hold them, log the prefill batch and prefill `prefill` tokens
        (None: all of them)."""
        need = min(tokens, self.capacity)
        queued = time.monotonic()
        with self.cond:
            self.waiting += 1
            while self.used + need > self.capacity:
                self.cond.wait()
            self.waiting -= 1
            self.record_wait(time.monotonic() - queued)
            self.used += need
            self.running += 1
            self.log(
                f"Prefill batch, #new-seq: 1, #new-token: {tokens}, #cached-token: 0, "
                f"token usage: {self.used / self.capacity:.2f}, #running-req: {self.running - 1}, "
                f"#queue-req: {self.waiting}, #pending-token: 0, cuda graph: False, "
                f"input throughput (token/s): {PREFILL_RATE:.2f}",
                0,
            )
        time.sleep((tokens if prefill is None else prefill) / PREFILL_RATE * SCALE)

    def record_wait(self, seconds: float) -> None:
        """The longest wall time a request waited in the server's queue for room in the pool, to
        SGLANG_DOUBLE_STATE/kv-wait-seconds (the gateway's admission should keep it under its queue timeout)."""
        self.longest_wait = max(getattr(self, "longest_wait", 0.0), seconds)
        folder = os.environ.get("SGLANG_DOUBLE_STATE")
        if folder:
            with open(os.path.join(folder, "kv-wait-seconds"), "w") as out:
                out.write(f"{self.longest_wait:.3f}")

    def release(self, tokens: int) -> None:
        with self.cond:
            self.used -= min(tokens, self.capacity)
            self.running -= 1
            self.cond.notify_all()

    def decode(self, tokens: int) -> Iterator[int]:
        """Yield the tokens generated in each chunk of wall time, at the rate the running batch allows."""
        done, carry = 0, 0.0
        while done < tokens:
            time.sleep(CHUNK_WALL)
            carry += per_stream_rate(self.running) * CHUNK_WALL / SCALE
            step = min(tokens - done, int(carry))
            carry -= step
            if step:
                done += step
                yield step

    def decode_log(self) -> None:
        """A `Decode batch` line every 40 decode steps of the running batch."""
        while True:
            n = self.running
            if not n:
                time.sleep(max(0.01, SCALE))
                continue
            rate = per_stream_rate(n)
            time.sleep(max(0.01, LOG_INTERVAL / rate * SCALE))
            self.log(
                f"Decode batch, #running-req: {n}, #token: {self.used}, token usage: {self.used / self.capacity:.2f}, "
                f"cuda graph: {n <= self.max_graph_bs}, gen throughput (token/s): {n * rate:.2f}, "
                f"#queue-req: {self.waiting}",
                0,
            )
