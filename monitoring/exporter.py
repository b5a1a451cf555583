"""The kit's own start as Prometheus metrics: phase, graphs captured against expected, starts, time to ready, what
failed (a code, no label), the doctor's warnings, the verification, the capacity; and the kit's readiness over HTTP
for the gateway's rotation. Run by supervisord beside the server (entrypoint/supervisord.conf).

    monitoring/exporter                      serve /metrics and /ready on GLM5_EXPORTER_PORT (glm5.toml: exporter_port)
    monitoring/exporter --port P --host H    elsewhere
    monitoring/exporter --once               print one scrape and exit (what Prometheus would read)

Each scrape is one healthcheck probe without HTTP (healthcheck/probe.py: the same log tail, state files and
decision, no second parser); /health is left to the probes, since it runs a generation, and the server's own
/metrics show serving. prometheus-client renders the text format.
/ready answers 200 only while the start is ready by the healthcheck's rule (verified, not draining), else 503; the
body is the phase, the reason and the capacity as JSON. SGLang's own /health is 200 from the warm-up on and 503 only
once draining, so the gateway's rotation (gateway/rotation.py) asks this instead. A scrape reads at most the probe's 4 MiB log
tail, so it costs the same on a 1 GB log as on a small one (ci/figures.toml: exporter CPU per scrape).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from common.report import INVALID_SETTING, USAGE, Log, Problems
from configuration import state
from healthcheck import probe
from healthcheck.verdict import Phase, Verdict, Verification

LOG = Log("monitoring/exporter")
GRAPHS = ("decode", "prefill")
# Every metric this exporter can expose (tests/test_monitoring.py holds the dashboard and the alerts to these).
NAMES = (
    "glm5_start_phase",
    "glm5_start_graphs_captured",
    "glm5_start_graphs_expected",
    "glm5_starts",  # a counter: exposed as glm5_starts_total
    "glm5_start_timestamp_seconds",
    "glm5_start_age_seconds",
    "glm5_start_ready_seconds",
    "glm5_start_failure_code",
    "glm5_start_hung",
    "glm5_start_progress_age_seconds",
    "glm5_start_stall_seconds",
    "glm5_server_alive",
    "glm5_capacity_max_running_requests",
    "glm5_capacity_max_prefill_tokens",
    "glm5_capacity_chunked_prefill_size",
    "glm5_capacity_available_gpu_memory_bytes",
    "glm5_capacity_attn_dp_size",
    "glm5_capacity_admitted_requests",
    "glm5_allreduce",
    "glm5_verification_passed",
    "glm5_verification_accuracy",
    "glm5_verification_items_wrong",
    "glm5_verification_items_inconclusive",
    "glm5_verification_regressed",
    "glm5_verification_item_wrong",
    "glm5_verification_item_inconclusive",
    "glm5_verification_seconds",
    "glm5_doctor_warnings",
    "glm5_doctor_warning",
    "glm5_exporter_scrape_errors",
)


def gauge(name: str, doc: str, value: float | None, labels: Mapping[str, str] | None = None) -> Metric | None:
    if value is None:
        return None
    family = GaugeMetricFamily(name, doc, labels=list(labels) if labels else None)
    family.add_metric(list(labels.values()) if labels else [], float(value))
    return family


def epoch(iso: str | None) -> float | None:
    """An ISO time (the marker's, with its offset) as Unix seconds."""
    try:
        return datetime.datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def local_epoch(stamp: str | None) -> float | None:
    """SGLang's record stamp, local time of the container (which the server and this process share)."""
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) if stamp else None
    except ValueError:
        return None


def metrics(v: Verdict, stall_seconds: float, now: float) -> Iterator[Metric]:
    """The families for one verdict (healthcheck/verdict.py)."""
    phase = GaugeMetricFamily(
        "glm5_start_phase",
        "The current start's phase: 1 for the one it is in (healthcheck phases)",
        labels=["phase"],
    )
    for name in Phase:
        phase.add_metric([name], 1.0 if v.phase is name else 0.0)
    yield phase
    for kind, doc, counts in (
        ("captured", "CUDA graphs captured so far", v.captured),
        ("expected", "CUDA graphs the configuration asks for", v.expected),
    ):
        family = GaugeMetricFamily(
            f"glm5_start_graphs_{kind}", f"{doc}, by graph (decode, prefill)", labels=["graph"]
        )
        for graph, value in zip(GRAPHS, counts, strict=True):
            if value is not None:
                family.add_metric([graph], float(value))
        yield family
    if v.start is not None:
        starts = CounterMetricFamily(
            "glm5_starts", "Server starts this container has made (the log marker's number)"
        )
        starts.add_metric([], float(v.start))
        yield starts
    started = epoch(v.started_at)
    ready = local_epoch(v.ready_at)
    over = v.phase in (Phase.READY, Phase.FAILED) and not v.hung
    families = (
        gauge("glm5_start_timestamp_seconds", "When the current start began (Unix seconds)", started),
        gauge(
            "glm5_start_age_seconds",
            "Seconds since the current start began",
            None if started is None else now - started,
        ),
        gauge(
            "glm5_start_ready_seconds",
            "Seconds from the start to the server's ready line",
            None if started is None or ready is None else max(0.0, ready - started),
        ),
        gauge(
            "glm5_start_failure_code",
            "0, or what failed: a recorded failure's exit code, else the kind's exported code (docs/reference.md: "
            "Failure codes)",
            v.failure_code,
        ),
        gauge(
            "glm5_start_hung",
            "1 when the start is hung (no log output for the stall bound)",
            1.0 if v.hung else 0.0,
        ),
        gauge(
            "glm5_start_progress_age_seconds",
            "Seconds since the server log last grew, while the start is not over",
            None if over else v.log_quiet_seconds,
        ),
        gauge(
            "glm5_start_stall_seconds",
            "The stall bound in effect: no log output for this long while starting is a hang (GLM5_STALL_SECONDS; "
            "GLM5_AUTOTUNE_STALL_SECONDS while autotuning)",
            stall_seconds,
        ),
        gauge(
            "glm5_server_alive",
            "1 while the current start's server process lives",
            None if v.server_alive is None else float(v.server_alive),
        ),
    )
    yield from (f for f in families if f is not None)
    yield from capacity(v.capacity)
    yield from verification(v.verification)
    if v.allreduce is not None:
        chosen = GaugeMetricFamily(
            "glm5_allreduce", "1 for the all-reduce the start runs: pcie_ipc or nccl (GLM5_ALLREDUCE and the doctor's "
            "check; SGLang's own fallback lines in the log win)", labels=["backend"],
        )  # fmt: skip
        chosen.add_metric([v.allreduce], 1.0)
        yield chosen
    count = GaugeMetricFamily(
        "glm5_doctor_warnings", "Warnings the doctor gave about this box at the last start"
    )
    count.add_metric([], float(len(v.doctor_warnings)))
    yield count
    each = GaugeMetricFamily(
        "glm5_doctor_warning", "1 for each doctor check that warned (entrypoint/doctor)", labels=["check"]
    )
    for check in sorted({w.split(":", 1)[0] for w in v.doctor_warnings}):
        each.add_metric([check], 1.0)
    yield each


def capacity(room: Mapping[str, float] | None) -> Iterator[Metric]:
    """What the replica holds at once, from the scheduler's sizes line: what SGLang's /metrics lacks (it exports
    sglang:max_total_num_tokens and sglang:context_len, not these), for sizing the gateway's admission."""
    if room is None:
        return
    families = (
        gauge("glm5_capacity_max_running_requests", "Requests the server runs at once (its scheduler's bound)",
              room["max_running_requests"]),
        gauge("glm5_capacity_max_prefill_tokens", "Tokens one prefill batch takes at most", room["max_prefill_tokens"]),
        gauge("glm5_capacity_chunked_prefill_size", "Prefill chunk, tokens (-1: not chunked)", room["chunked_prefill_size"]),
        gauge("glm5_capacity_available_gpu_memory_bytes", "GPU memory left after the KV pool and graphs (rank 0)",
              room["available_gpu_mem_gb"] * 2**30),
        gauge("glm5_capacity_attn_dp_size", "Attention-DP groups (GLM5_PROFILE=throughput), each holding the KV pool "
              "and running the requests above: the replica holds this many times them (1: TP attention)",
              room.get("attn_dp_size", 1.0)),
        gauge("glm5_capacity_admitted_requests", "Requests the gateway admits to this replica at once: per attention "
              "group what its KV pool holds of [gateway].context_tokens, at most a rank's largest decode graph",
              room.get("admitted_requests")),
    )  # fmt: skip
    yield from (f for f in families if f is not None)


def verification(found: Verification | None) -> Iterator[Metric]:
    """The current start's verification (verify/gate), once it is done: nothing before."""
    if found is None:
        return
    families = (
        gauge(
            "glm5_verification_passed",
            "1 when the start's verification passed, 0 when it failed",
            float(found.passed),
        ),
        gauge(
            "glm5_verification_accuracy", "Share of the verification items answered rightly", found.accuracy
        ),
        gauge("glm5_verification_items_wrong", "Verification items answered wrongly", len(found.wrong)),
        gauge(
            "glm5_verification_items_inconclusive",
            "Verification items with no conclusion: cut at the raised bound or unanswered (transport, not the model)",
            len(found.inconclusive),
        ),
        gauge(
            "glm5_verification_regressed",
            "Items right on the previous verified build and wrong now (0 when there is none to compare with)",
            len(found.regressed),
        ),
        gauge("glm5_verification_seconds", "How long the verification set took", found.seconds),
    )
    yield from (f for f in families if f is not None)
    per_item = (
        ("wrong", "1 for each verification item answered wrongly (verified.json)", found.wrong),
        (
            "inconclusive",
            "1 for each verification item with no conclusion (verified.json has what was received)",
            found.inconclusive,
        ),
    )
    for outcome, doc, ids in per_item:
        each = GaugeMetricFamily(f"glm5_verification_item_{outcome}", doc, labels=["item"])
        for item in ids:
            each.add_metric([item], 1.0)
        yield each


# What a probe may raise on a state or log it cannot read: the scrape and /ready say so.
PROBE_ERRORS = (OSError, ValueError, KeyError, TypeError, Problems)


class StartCollector(Collector):
    """Probes on every scrape; a probe that raises is counted and logged, never a failed scrape."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.errors = 0

    def collect(self) -> Iterator[Metric]:
        try:
            settings = probe.run_of(self.environ)
            found = probe.verdict(settings)
            # The bound in effect: GLM5_AUTOTUNE_STALL_SECONDS while autotuning, else GLM5_STALL_SECONDS.
            bound = found.stall_seconds if found.stall_seconds is not None else settings.stall_seconds
            yield from metrics(found, bound, time.time())
        except PROBE_ERRORS as err:
            self.errors += 1
            LOG.error(f"probe failed: {err}")
        errors = CounterMetricFamily(
            "glm5_exporter_scrape_errors", "Scrapes whose probe failed (see the exporter's log)"
        )
        errors.add_metric([], float(self.errors))
        yield errors


READY_KEYS = ("phase", "reason", "start", "failure_kind", "verification", "capacity")


def readiness(environ: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    """The kit's readiness without HTTP to the server (a probe's log tail, its state files): 200 when ready."""
    try:
        found = probe.verdict(probe.run_of(environ))
    except PROBE_ERRORS as err:
        return 503, {"phase": "unknown", "reason": f"probe failed: {err}"}
    result = found.as_json()  # the edge: JSON for the gateway's rotation
    return (200 if found.phase is Phase.READY else 503), {k: result.get(k) for k in READY_KEYS}


def app(environ: Mapping[str, str], reg: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    """/ready, and /metrics (prometheus-client's own app) for every other path."""
    metrics_app = make_wsgi_app(reg)

    def serve(request: dict[str, Any], respond: Callable[..., Any]) -> Iterable[bytes]:
        if request.get("PATH_INFO") != "/ready":
            return metrics_app(request, respond)
        code, body = readiness(environ)
        respond(
            f"{code} {'OK' if code == 200 else 'Service Unavailable'}", [("Content-Type", "application/json")]
        )
        return [json.dumps(body).encode()]

    return serve


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every second: no access log."""


def registry(environ: Mapping[str, str]) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(StartCollector(environ))
    return reg


def main(argv: list[str] | None = None) -> int:
    try:
        # An invalid setting at its default, as supervisord runs it: the exporter answers, and says why, under
        # any configuration; only state and log folders that cannot be used even at their defaults stop it.
        values, _problems = state.supervised(os.environ)
    except Problems as err:
        LOG.problems(err.problems, "unusable folder(s)")
        return INVALID_SETTING
    parser = argparse.ArgumentParser(prog="monitoring/exporter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=values["host"], help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=values["exporter_port"], help="port of /metrics (GLM5_EXPORTER_PORT)"
    )
    parser.add_argument("--once", action="store_true", help="print one scrape and exit")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port}: use 1-65535")
    reg = registry(os.environ)
    if args.once:
        sys.stdout.write(generate_latest(reg).decode())
        return 0
    try:
        server = make_server(args.host, args.port, app(os.environ, reg), ThreadingWSGIServer, QuietHandler)
    except OSError as err:
        LOG.error(f"cannot listen on {args.host}:{args.port}: {err}; fix: free the port or pass --port")
        return USAGE
    LOG.info(f"serving the start's metrics on http://{args.host}:{args.port}/metrics, readiness on /ready")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
