"""TEST DOUBLE of SGLang 0.5.23's /metrics: the names, types, label names and buckets its collectors declare, with
values the double's requests drive. Not SGLang's numbers: what the dashboard and the alerts are tested against is
the shape of the series, which is SGLang's.

Read from sglang 0.5.23, srt/observability/metrics_collector.py:
- scheduler series (SchedulerMetricsCollector, labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank; lines
  364-557, 731-741): gauges num_running_reqs, num_queue_reqs, token_usage, gen_throughput, cache_hit_rate,
  num_retracted_reqs, and the constant max_total_num_tokens (1285-1300); counters num_retracted_requests_total and cuda_graph_passes_total{mode} with modes
  decode_cuda_graph / decode_none / prefill_cuda_graph / prefill_none (1527-1533: *_none is a pass without a graph);
- tokenizer series (TokenizerMetricsCollector, labels model_name, engine_type; 1856-2068): counters
  prompt_tokens_total, generation_tokens_total, num_requests_total {is_streaming}; histograms
  time_to_first_token_seconds {is_streaming}, inter_token_latency_seconds, e2e_request_latency_seconds
  {is_streaming}, with the default buckets of lines 1965-2035.
engine_type is "unified" without disaggregation (disaggregation/utils.py). tests/test_monitoring.py checks every
name here against the installed sglang package.

How the double drives them: running = requests in flight; above SGLANG_DOUBLE_MAX_RUNNING (default 8) the rest
count as queued; decode passes run on a graph while running <= SGLANG_DOUBLE_GRAPH_MAX_BS (default 4), as SGLang
replays a graph only for batch sizes it captured; KV use is running / max running (capped at 1). In mode box the
server sets `counts`: running and queued are then the box pool's (tests/doubles/sglang_box.py), as SGLang's scheduler
counts them.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
    0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")
MAX_RUNNING = int(os.environ.get("SGLANG_DOUBLE_MAX_RUNNING", "8"))
GRAPH_MAX_BS = int(os.environ.get("SGLANG_DOUBLE_GRAPH_MAX_BS", "4"))


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.counts: Callable[[], tuple[int, int]] | None = None  # mode box: (running, queued) from the pool
        self.tokens: list[tuple[float, int]] = []  # (time, tokens) of the last second: gen_throughput
        self.sched = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        self.tok = {"model_name": model_name, "engine_type": "unified"}
        r = self.registry

        def gauge(name: str) -> Gauge:
            return Gauge(f"sglang:{name}", name, SCHEDULER_LABELS, registry=r, multiprocess_mode="mostrecent")

        self.running, self.queued, self.usage = (
            gauge("num_running_reqs"),
            gauge("num_queue_reqs"),
            gauge("token_usage"),
        )
        self.throughput, self.hit_rate = gauge("gen_throughput"), gauge("cache_hit_rate")
        self.retracted_now = gauge("num_retracted_reqs")
        self.retracted = Counter(
            "sglang:num_retracted_requests_total", "retracted", SCHEDULER_LABELS, registry=r
        )
        self.passes = Counter(
            "sglang:cuda_graph_passes_total", "passes", (*SCHEDULER_LABELS, "mode"), registry=r
        )
        streaming = (*TOKENIZER_LABELS, "is_streaming")
        self.prompt_tokens = Counter("sglang:prompt_tokens_total", "prompt tokens", streaming, registry=r)
        self.generation_tokens = Counter(
            "sglang:generation_tokens_total", "generation tokens", streaming, registry=r
        )
        self.requests = Counter("sglang:num_requests_total", "requests", streaming, registry=r)
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "ttft", streaming, buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "itl", TOKENIZER_LABELS, buckets=ITL_BUCKETS, registry=r
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "e2e", streaming, buckets=E2E_BUCKETS, registry=r
        )
        # A constant set once at start (emit_constants, lines 1285-1300): the KV pool the sizes line printed.
        kv_tokens = int(os.environ.get("SGLANG_DOUBLE_MAX_TOTAL_TOKENS", "412160"))
        gauge("max_total_num_tokens").labels(**self.sched).set(kv_tokens)
        self.retracted.labels(**self.sched)  # a child at 0, so a rate of it is 0 rather than no series
        for mode in ("decode_cuda_graph", "decode_none", "prefill_cuda_graph", "prefill_none"):
            self.passes.labels(**self.sched, mode=mode)
        self.publish()

    def publish(self) -> None:
        running, queued = min(self.in_flight, MAX_RUNNING), max(0, self.in_flight - MAX_RUNNING)
        if self.counts:
            running, queued = self.counts()
        self.running.labels(**self.sched).set(running)
        self.queued.labels(**self.sched).set(queued)
        self.usage.labels(**self.sched).set(min(1.0, running / MAX_RUNNING))
        now = time.monotonic()
        self.tokens = [(t, n) for t, n in self.tokens if now - t < 1.0]
        self.throughput.labels(**self.sched).set(sum(n for _, n in self.tokens))
        self.hit_rate.labels(**self.sched).set(0.5 if self.in_flight > 1 else 0.0)
        self.retracted_now.labels(**self.sched).set(0)

    def begin(self) -> float:
        with self.lock:
            self.in_flight += 1
            if self.in_flight > 2 * MAX_RUNNING:  # the KV cache ran out: one request goes back to the queue
                self.retracted.labels(**self.sched).inc()
            self.passes.labels(**self.sched, mode="prefill_cuda_graph").inc()
            self.publish()
        return time.monotonic()

    def token(self, began: float, last: float | None, streaming: bool) -> float:
        """One generated token (a decode pass) at now; returns now."""
        now = time.monotonic()
        with self.lock:
            mode = "decode_cuda_graph" if min(self.in_flight, MAX_RUNNING) <= GRAPH_MAX_BS else "decode_none"
            self.passes.labels(**self.sched, mode=mode).inc()
            self.tokens.append((now, 1))
        if last is None:
            self.ttft.labels(**self.tok, is_streaming=str(streaming).lower()).observe(now - began)
        else:
            self.itl.labels(**self.tok).observe(now - last)
        return now

    def end(self, began: float, prompt_tokens: int, generated: int, streaming: bool) -> None:
        flag = str(streaming).lower()
        with self.lock:
            self.in_flight -= 1
            self.prompt_tokens.labels(**self.tok, is_streaming=flag).inc(prompt_tokens)
            self.generation_tokens.labels(**self.tok, is_streaming=flag).inc(generated)
            self.requests.labels(**self.tok, is_streaming=flag).inc()
            self.e2e.labels(**self.tok, is_streaming=flag).observe(time.monotonic() - began)
            self.publish()

    def text(self) -> bytes:
        with self.lock:
            self.publish()
        return generate_latest(self.registry)
