"""The GLM-5 Grafana dashboard, built as typed objects with grafana-foundation-sdk (Grafana 11.6 schema).

Generated rather than hand-kept: the SDK checks each panel's options as it builds them, the panels are a short table
here instead of ~1,500 lines of JSON. `ci/render-dashboard` writes the JSON (monitoring/grafana/dashboards/glm5.json,
committed), then ci/render wraps it as the Kubernetes ConfigMap for Grafana's sidecar; tests/test_monitoring.py fails
on a stale or hand-edited JSON and runs every query against a real Prometheus.

Series: sglang:* from each replica's /metrics, glm5_* from the kit's exporter, smg_* from the gateway. Per replica:
every panel splits by `instance` (compose: the host; Kubernetes: the pod).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, stat, timeseries
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import BigValueTextMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, GridPos

from healthcheck.verdict import Phase

UID = "glm5-serve"
JSON_FILE = Path(__file__).resolve().parent / "grafana" / "dashboards" / "glm5.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    kind: str = "timeseries"  # or "stat": the current value, by its legend (an instant query)
    width: int = 8
    description: str = ""


def quantiles(metric: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (
            f"histogram_quantile({q}, sum by (instance, le) (rate({metric}_bucket[{RATE}])))",
            f"p{round(q * 100)} {{{{instance}}}}",
        )
        for q in (0.5, 0.99)
    )


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Start",
        (
            Panel("Phase", "none", (("glm5_start_phase == 1", "{{instance}}: {{phase}}"),), "stat", 6,
                  f"The healthcheck's phase of the current start ({', '.join(Phase)})."),
            Panel(
                "CUDA graphs captured",
                "percentunit",
                (("glm5_start_graphs_captured / on(job, instance, graph) glm5_start_graphs_expected", "{{instance}} {{graph}}"),),
                "timeseries",
                6,
                "Captured over expected, decode and prefill: a start stuck at 37/52 shows here.",
            ),
            Panel("Starts, time to ready", "s", (("glm5_start_ready_seconds", "time to ready {{instance}}"), ("glm5_start_age_seconds", "since start {{instance}}")), "timeseries", 6),
            Panel(
                "Failure code, doctor warnings",
                "none",
                (("glm5_start_failure_code", "failure code {{instance}}"), ("glm5_doctor_warnings", "doctor warnings {{instance}}"), ("glm5_starts_total", "starts {{instance}}")),
                "stat",
                6,
                "0 = nothing failed; else an exit code or a code of README's failure table.",
            ),
            Panel(
                "Verification",
                "none",
                (("glm5_verification_accuracy", "accuracy {{instance}}"), ("glm5_verification_items_wrong", "wrong items {{instance}}"),
                 ("glm5_verification_items_inconclusive", "inconclusive items {{instance}}"),
                 ("glm5_verification_regressed", "regressed {{instance}}")),
                "stat",
                6,
                "The start's own verification set (verify/): wrong items fail the start, inconclusive ones (cut or unanswered) point at transport or budget; regressed ones were right on the last good build.",
            ),
            Panel(
                "Capacity",
                "none",
                (("glm5_capacity_admitted_requests", "admitted {{instance}}"),
                 ("glm5_capacity_attn_dp_size", "attention groups {{instance}}"),
                 ("sglang:max_total_num_tokens", "KV tokens a group {{instance}}")),
                "stat",
                6,
                "What each replica holds at once, as its scheduler sized it at start: the requests the gateway admits to it (what KEDA counts against), its attention-DP groups (1: TP attention) and one group's KV pool.",
            ),
        ),
    ),
    (
        "Serving",
        (
            Panel("Generation throughput", "tok/s", (("max by (instance) (sglang:gen_throughput)", "{{instance}}"),)),
            Panel("Time to first token", "s", quantiles("sglang:time_to_first_token_seconds")),
            Panel("Inter-token latency", "s", quantiles("sglang:inter_token_latency_seconds")),
            Panel(
                "Requests running and queued",
                "none",
                (("max by (instance) (sglang:num_running_reqs)", "running {{instance}}"), ("max by (instance) (sglang:num_queue_reqs)", "queued {{instance}}")),
            ),
            Panel("KV cache use", "percentunit", (("max by (instance) (sglang:token_usage)", "{{instance}}"),)),
            Panel("Prefix cache hit rate", "percentunit", (("max by (instance) (sglang:cache_hit_rate)", "{{instance}}"),)),
            Panel(
                "Decode passes without a CUDA graph",
                "percentunit",
                ((
                    f'sum by (instance) (rate(sglang:cuda_graph_passes_total{{mode="decode_none"}}[{RATE}])) / '
                    f'sum by (instance) (rate(sglang:cuda_graph_passes_total{{mode=~"decode_.*"}}[{RATE}]))',
                    "{{instance}}",
                ),),
                description="Batches above the largest captured size decode without graphs.",
            ),
            Panel("Retractions", "reqps", ((f"sum by (instance) (rate(sglang:num_retracted_requests_total[{RATE}]))", "{{instance}}"),),
                  description="Requests pushed back to the queue because the KV cache ran out."),
            Panel(
                "Tokens",
                "tok/s",
                (
                    (f"sum by (instance) (rate(sglang:prompt_tokens_total[{RATE}]))", "prompt {{instance}}"),
                    (f"sum by (instance) (rate(sglang:generation_tokens_total[{RATE}]))", "generated {{instance}}"),
                ),
            ),
        ),
    ),
    (
        "Gateway",
        (
            Panel("Replica health (gateway's checks)", "none", (("smg_worker_health", "{{worker}}"),)),
            Panel("Replicas in the rotation", "none", (("glm5_rotation_in_rotation", "{{id}}"),)),
            Panel("Requests per replica", "reqps", ((f"sum by (worker) (rate(smg_worker_requests_total[{RATE}]))", "{{worker}}"),)),
            Panel(
                "Gateway request duration",
                "s",
                tuple(
                    (f"histogram_quantile({q}, sum by (le) (rate(smg_router_request_duration_seconds_bucket[{RATE}])))", f"p{round(q * 100)}")
                    for q in (0.5, 0.99)
                ),
            ),
        ),
    ),
)  # fmt: skip


def build() -> dashboard.Dashboard:
    board = (
        dashboard.Dashboard("GLM-5 (glm5-serve)")
        .uid(UID)
        .tags(["glm5-serve", "sglang"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .editable()
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    panel_id, y = 1, 0
    for row_title, panels in ROWS:
        board = board.with_row(dashboard.Row(row_title).id(panel_id).grid_pos(GridPos(h=1, w=24, x=0, y=y)))
        panel_id, y, x = panel_id + 1, y + 1, 0
        for spec in panels:
            if x + spec.width > 24:
                x, y = 0, y + 8
            builder: stat.Panel | timeseries.Panel
            if spec.kind == "stat":
                # Now, not over the time range: a phase that ended an hour ago is not shown as current.
                builder = (
                    stat.Panel()
                    .text_mode(
                        BigValueTextMode.NAME
                        if spec.unit == "none" and len(spec.queries) == 1
                        else BigValueTextMode.VALUE_AND_NAME
                    )
                    .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
                )
            else:
                builder = timeseries.Panel()
            builder = (
                builder.id(panel_id)
                .title(spec.title)
                .description(spec.description)
                .unit(spec.unit)
                .datasource(DATASOURCE)
                .grid_pos(GridPos(h=8, w=spec.width, x=x, y=y))
            )
            for ref, (expr, legend) in zip("ABCDEFGH", spec.queries, strict=False):
                query = prom.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
                builder = builder.with_target(query.instant() if spec.kind == "stat" else query)
            board = board.with_panel(builder)
            panel_id, x = panel_id + 1, x + spec.width
        y += 8
    return board


def json_text() -> str:
    """The dashboard as Grafana reads it (sorted keys: a stable file to compare)."""
    model = json.loads(JSONEncoder(sort_keys=True).encode(build().build()))
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def queries(model: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target in a dashboard JSON model."""
    found = []
    for panel in model.get("panels", []):
        for target in panel.get("targets", []) or []:
            found.append((panel["title"], target["expr"]))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ci/render-dashboard", description="Write the dashboard's JSON file."
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = json_text()
    if JSON_FILE.exists() and JSON_FILE.read_text() == text:
        print(f"ci/render-dashboard: {JSON_FILE.name} is current")
        return 0
    if args.check:
        print(
            f"ci/render-dashboard: error: stale: {JSON_FILE} (run ci/render-dashboard, then commit it)",
            file=sys.stderr,
        )
        return 1
    JSON_FILE.write_text(text)
    print(f"ci/render-dashboard: wrote {JSON_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
