"""Keep every file that repeats a deployment value in step with the one source, entrypoint/glm5.toml.

    ci/render            rewrite the marked values in place, and write the generated files
    ci/render --check    change nothing; exit 1 naming every stale file (part of ci/test)

Needs the system python3 alone. Each file is kept once, written by hand. A value that comes from glm5.toml carries
a marker comment giving its form: `KEY: VALUE  # ci/render: FORM` on the line itself, or, where the format has no
trailing comments (the Dockerfile), `# ci/render: FORM` on its own line above it. FORM names values of `values()`
in braces (`{port}`, `{drain_seconds}s`); the end of the line must read as FORM, and ci/render rewrites that end
with the values filled in. An unknown name, or a line that no longer reads as its FORM, fails the render. Values no
operator changes (the image's folders, its user) are written plainly; tests/test_render.py checks them against
glm5.toml. README.md and docs/ keep hand-written prose around blocks that ci/render owns between `<!-- ci/render: NAME -->`
and `<!-- ci/render: end NAME -->`. The generated files (the env examples, the PrometheusRule and the dashboard's
ConfigMap) are written whole from their source. The dashboard's JSON needs grafana-foundation-sdk: its own step,
ci/render-dashboard, writes it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from common.report import EXIT_CODES, FAILED, FAILURES, OK, Log, Problems
from configuration import admission, config, layout, settings, state
from configuration.batch_sizes import effective_decode_max_bs
from entrypoint import preflight
from healthcheck.verdict import Phase
from kernels import modules as kernel_modules
from verify import items as verify_items
from verify import run as verify_run

ROOT = Path(__file__).resolve().parent.parent
SOURCE = "entrypoint/glm5.toml"
# The files with values marked `# ci/render: FORM`, relative to the root.
MARKED = (
    "Dockerfile",
    "docker-compose.yml",
    "k8s/data/kustomization.yaml",
    "k8s/data/namespace.yaml",
    "k8s/data/pvc-weights.yaml",
    "k8s/base/kustomization.yaml",
    "k8s/base/statefulset.yaml",
    "k8s/base/job-weights.yaml",
    "k8s/base/service.yaml",
    "k8s/base/networkpolicy.yaml",
    "k8s/components/image/kustomization.yaml",
    "k8s/overlays/gateway/kustomization.yaml",
    "k8s/data-one-node/kustomization.yaml",
    "k8s/overlays/gateway/gateway.yaml",
    "k8s/overlays/gateway/replicas.yaml",
    "k8s/overlays/monitoring/kustomization.yaml",
    "k8s/overlays/gateway-monitoring/kustomization.yaml",
    "k8s/overlays/gateway-autoscaling/kustomization.yaml",
    "k8s/overlays/gateway-autoscaling/autoscaled.yaml",
    "k8s/overlays/gateway-autoscaling/scaledobject.yaml",
    "k8s/components/monitoring/podmonitor.yaml",
    "monitoring/prometheus/prometheus.yml",
    "monitoring/prometheus/alerts.yml",
    "image/requirements.in",
    "ci/requirements-nodeps.txt",
    "ci/requirements-test.txt",
    "ci/requirements-sglang-cpu.txt",
    "ci/setup-test-env",
    "pyproject.toml",  # the version: [deployment].image's tag
)
ALERTS = "monitoring/prometheus/alerts.yml"
DASHBOARD = (
    "monitoring/grafana/dashboards/glm5.json"  # written by ci/render-dashboard (monitoring/dashboard.py)
)
PROMETHEUS_RULE = "k8s/components/monitoring/prometheusrule.yaml"  # the alerts, wrapped
DASHBOARD_CONFIGMAP = "k8s/components/monitoring/dashboard.yaml"  # the dashboard, for Grafana's sidecar
ENV_EXAMPLE = "glm5.env.example"  # from the settings' declarations
HOST_ENV_EXAMPLE = ".env.example"  # the host-side settings, likewise
GENERATED = (PROMETHEUS_RULE, DASHBOARD_CONFIGMAP, ENV_EXAMPLE, HOST_ENV_EXAMPLE)
README = "README.md"
REFERENCE = "docs/reference.md"
INTERNALS = "docs/internals.md"
# The generated blocks (between `<!-- ci/render: NAME -->` markers), by the document that holds them.
BLOCKS = {
    README: ("phases", "exit-codes", "figures"),
    REFERENCE: (
        "configuration",
        "preflight-exit-codes",
        "failure-codes",
        "verification",
        "sizing",
        "node-size",
        "first-answer",
        "layouts",
    ),
    INTERNALS: ("kernels", "state-records"),
}
DOCUMENTS = tuple(BLOCKS)
IMAGE_COMPONENT = "k8s/components/image/kustomization.yaml"
# A container's `image:` in a Kubernetes file, and the component's `images:` entry (name, newName, newTag).
CONTAINER_IMAGE = re.compile(r"^\s*(?:-\s+)?image:\s*[\"']?([^\s\"'#]+)", re.M)
IMAGE_ENTRY = re.compile(r"^\s*(?:-\s+)?(name|newName|newTag|digest):\s*[\"']?([^\s\"'#]+)", re.M)
FIGURES = "ci/figures.toml"  # measured figures, rendered into the README's figures table
LOG = Log("ci/render")
MARKER = "# ci/render: "
NAME = re.compile(r"\{(\w+)\}")


class RenderError(Exception):
    pass


def values(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a template may use: source values and the values derived from them."""
    v: dict[str, Any] = dict(cfg["deployment"]) | dict(cfg["image"])
    defaults = settings.resolve({}, cfg, where="ci")
    v["model_host_dir"], v["bind"] = defaults["model_host_dir"], defaults["bind"]
    v["monitoring_bind"], v["exporter_bind"] = defaults["monitoring_bind"], defaults["exporter_bind"]
    v["kernels"] = defaults["kernels"]  # the image build's GLM5_KERNELS (Dockerfile ARG, compose build args)
    # The pod's log volume: the server log and its rotations with room to spare (twice their bound, plus 64 MiB).
    v["log_volume_size"] = f"{math.ceil(2 * v['log_max_bytes'] * (v['log_backups'] + 1) / 2**20) + 64}Mi"
    v["stop_grace_seconds"] = v["drain_seconds"] + v["stop_margin_seconds"]
    v["termination_grace_seconds"] = v["prestop_seconds"] + v["stop_grace_seconds"]
    v["gpu_count_minus_one"] = v["gpu_count"] - 1
    v.update(image_values(v["image"]))
    v["gpu_device_ids_json"] = json.dumps(
        [str(i) for i in range(v["gpu_count"])], separators=(",", ":")
    )  # no blank: a marked value
    probe = f"{v['home']}/healthcheck/healthcheck"
    v["readiness_command_json"] = json.dumps([probe, "--status"])
    v["liveness_command_json"] = json.dumps([probe, "--live", "--status"])
    v["compose_readiness_json"] = json.dumps(["CMD", probe, "--status"])
    v["api_key_dir"] = "/run/secrets/glm5"
    v["admin_api_key_dir"] = "/run/secrets/glm5-admin"  # GLM5_ADMIN_API_KEY_FILE's folder: its own Secret
    v["home_dir"] = "/home/glm5"  # the image user's HOME (the Dockerfile's useradd)
    for key, value in cfg["monitoring"].items():
        v[f"monitoring_{key}"] = value
    v["monitoring_restart_loop_starts_minus_one"] = v["monitoring_restart_loop_starts"] - 1
    for key, value in cfg["gateway"].items():
        if not isinstance(value, list):
            v[f"gateway_{key}"] = value
    for key, value in cfg["autoscaling"].items():
        v[f"autoscaling_{key}"] = value
    # A replica's largest captured decode batch (what it runs at once), and its capacity as the gateway's admission
    # counts it (what its KV pool holds of [gateway].context_tokens, at most that batch) at the defaults: KEDA reads
    # each replica's own (glm5_capacity_admitted_requests) and aims at target_utilization of it.
    v["autoscaling_capacity"] = effective_decode_max_bs(
        defaults["cuda_graph_max_bs_decode"],
        defaults["speculative"] != "off",
        defaults["max_running_requests"],
    )
    # A replica's KV pool at TP attention and the defaults, by the layout's estimate (configuration/layout.py).
    v["replica_pool_tokens"] = pool = layout.default_pool(cfg)
    v["autoscaling_admitted"] = admission.per_replica(
        v["autoscaling_capacity"], pool, v["gateway_context_tokens"]
    )
    # smg keeps listening min(grace / 2, 5 s) after SIGTERM (for load balancers to notice), then drains the rest.
    v["gateway_stop_grace_seconds"] = v["gateway_shutdown_grace_seconds"] + 5 + v["stop_margin_seconds"]
    problems = [
        f"stop_margin_seconds = {v['stop_margin_seconds']}: supervisord needs time to kill and exit after the drain; use 5 or more"
        for _ in [1]
        if v["stop_margin_seconds"] < 5
    ]
    longest = settings.declarations(cfg)["GLM5_HEALTH_TIMEOUT"].high
    if v["probe_command_timeout_seconds"] <= max(v["health_timeout_seconds"], longest):
        problems.append(
            f"probe_command_timeout_seconds = {v['probe_command_timeout_seconds']} must exceed health_timeout_seconds "
            f"= {v['health_timeout_seconds']} and GLM5_HEALTH_TIMEOUT's max {longest} (the probe waits that long for /health)"
        )
    problems += autoscaling_problems(v)
    problems += node_problems(v)
    problems += admission.drift(cfg, pool)
    if problems:
        raise RenderError("entrypoint/glm5.toml: " + "; ".join(problems))
    return v


# The kubelet's reserve as GKE computes it, the largest of the common defaults (upstream kubelet reserves nothing
# but its eviction threshold): cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes. Bands of (width, share).
KUBELET_CPU_BANDS = ((1.0, 0.06), (1.0, 0.01), (2.0, 0.005), (math.inf, 0.0025))
KUBELET_MEMORY_BANDS = ((4.0, 0.25), (4.0, 0.20), (8.0, 0.10), (112.0, 0.06), (math.inf, 0.02))
EVICTION_GIB = 100 / 1024  # the kubelet's default hard eviction threshold, memory.available<100Mi


def quantity(text: str) -> float:
    """A Kubernetes quantity as a number: cores for CPU ("16", "500m"), GiB for memory ("128Gi", "512Mi")."""
    units = {"m": 1e-3, "Gi": 1.0, "Mi": 1 / 1024, "Ki": 1 / 1024**2, "Ti": 1024.0}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * scale
    return float(text)


def banded(total: float, bands: tuple[tuple[float, float], ...]) -> float:
    reserved, left = 0.0, total
    for width, share in bands:
        part = min(left, width)
        reserved, left = reserved + part * share, left - part
    return reserved


def node_fit(v: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """What the smallest node the kit names leaves: rows of (what, cores, GiB), the last one what is left over, which
    must not be negative. On one node the weights Job runs while the pod waits in Init, so both are counted."""
    cpus, ram = float(v["node_cpus"]), float(v["node_memory_gib"])
    reserve_cpu, reserve_memory = banded(cpus, KUBELET_CPU_BANDS), banded(ram, KUBELET_MEMORY_BANDS)
    rows = [
        (f"the node the kit names (README: Needs): {v['node_cpus']} CPUs, {v['node_memory_gib']} GiB installed", cpus, ram),
        ("RAM the kernel never counts in MemTotal, the node's capacity (firmware, the kernel, a crash kernel; an "
         "estimate)", 0.0, -float(v["node_unreported_gib"])),
        ("the kubelet's reserve, by GKE's formula (CPU: 6% of the first core, 1% of the next, 0.5% of the next 2, 0.25% "
         "above 4; memory: 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of the next 112, 2% above; "
         "a kubelet left at its defaults reserves none)", -reserve_cpu, -reserve_memory),
        ("the kubelet's hard eviction threshold (memory.available<100Mi, its default)", 0.0, -EVICTION_GIB),
        ("the node's own DaemonSets (CNI, kube-proxy, the GPU Operator's; an estimate)",
         -quantity(v["system_pods_cpu"]), -quantity(v["system_pods_memory"])),
        ("the weights Job (k8s/base/job-weights.yaml), beside the pod on one node",
         -quantity(v["weights_job_cpu_request"]), -quantity(v["weights_job_memory_request"])),
        ("the server pod (k8s/base/statefulset.yaml; its init container asks less)",
         -quantity(v["cpu_request"]), -quantity(v["memory_request"])),
    ]  # fmt: skip
    rows.append(("left over", sum(r[1] for r in rows), sum(r[2] for r in rows)))
    return rows


def node_problems(v: Mapping[str, Any]) -> list[str]:
    _, cpu_left, memory_left = node_fit(v)[-1]
    found = []
    short = [f"{-cpu_left:.2f} CPUs"] * (cpu_left < 0) + [f"{-memory_left:.1f} GiB"] * (memory_left < 0)
    if short:
        found.append(
            f"cpu_request = {v['cpu_request']!r}, memory_request = {v['memory_request']!r}: with the weights Job and the "
            f"system pods they ask {' and '.join(short)} more than a node of node_cpus = {v['node_cpus']} and "
            f"node_memory_gib = {v['node_memory_gib']} leaves (docs/reference.md: Node size): lower the requests, or "
            "raise the node the kit names (and the README's Needs)"
        )
    ranks_gib = v["gpu_count"] * v["server_host_mib_per_rank"] / 1024
    if quantity(v["memory_request"]) < ranks_gib:
        found.append(
            f"memory_request = {v['memory_request']!r} is below the ranks' own host memory, gpu_count x "
            f"server_host_mib_per_rank = {ranks_gib:g} GiB: raise it"
        )
    return found


DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def image_values(image: str) -> dict[str, str]:
    """[deployment].image as its parts: NAME:VERSION, or NAME:VERSION@sha256:<64 hex> (a published release, by
    digest). The tag is the kit's version (pyproject.toml's, the release's v-tag): an image without one is refused.
    Kubernetes names the image without its tag: k8s/components/image's entry sets the name and newTag, or digest
    (kustomize then renders NAME@DIGEST)."""
    where = f"entrypoint/glm5.toml: [deployment].image = {image!r}"
    named, at, digest = image.partition("@")
    if at and not DIGEST.match(digest):
        raise RenderError(f"{where}: {digest!r} is not a digest: write NAME:VERSION@sha256:<64 hex digits>")
    if ":" not in named.rsplit("/", 1)[-1]:
        raise RenderError(
            f"{where} has no tag: write NAME:TAG (glm5-serve:0.1.0), or NAME:TAG@sha256:<digest> for a published "
            "image; the tag is the kit's version (ci/render writes it into pyproject.toml)"
        )
    name, tag = named.rsplit(":", 1)
    if not re.fullmatch(r"\d+\.\d+\.\d+([.+-]?[0-9A-Za-z.]+)?", tag):
        raise RenderError(
            f"{where}: its tag {tag!r} is the kit's version: write MAJOR.MINOR.PATCH (0.1.0), the release's v-tag"
        )
    pin_field, pin = ("digest", digest) if at else ("newTag", tag)
    return {
        "image_name": name,
        "image_tag": tag,
        "version": tag,
        "image_pin_field": pin_field,  # k8s/components/image: newTag or digest
        "image_pin": pin,
        "image_kubernetes": f"{name}@{digest}" if at else f"{name}:{tag}",  # what kubectl kustomize renders
    }


def autoscaling_problems(v: Mapping[str, Any]) -> list[str]:
    """[autoscaling] within what KEDA and the HorizontalPodAutoscaler accept (their schemas check types, not these)."""
    found = []
    if not 1 <= v["autoscaling_min_replicas"] <= v["autoscaling_max_replicas"]:
        found.append(
            f"[autoscaling] min_replicas = {v['autoscaling_min_replicas']}, max_replicas = "
            f"{v['autoscaling_max_replicas']}: 1 <= min_replicas <= max_replicas"
        )
    if not 0 < v["autoscaling_target_utilization"] <= 1 or v["autoscaling_admitted"] < 1:
        found.append(
            f"[autoscaling] target_utilization = {v['autoscaling_target_utilization']}: above 0 and at most 1, of a "
            f"replica's admitted capacity (at least 1 request: {v['autoscaling_admitted']} at the defaults)"
        )
    if not 1 <= v["autoscaling_scale_up_period_seconds"] <= 1800:
        found.append(
            f"[autoscaling] scale_up_period_seconds = {v['autoscaling_scale_up_period_seconds']}: 1 to 1800 (the "
            "HorizontalPodAutoscaler's policy period)"
        )
    if not 0 <= v["autoscaling_scale_down_window_seconds"] <= 3600:
        found.append(
            f"[autoscaling] scale_down_window_seconds = {v['autoscaling_scale_down_window_seconds']}: 0 to 3600 (the "
            "HorizontalPodAutoscaler's stabilization window)"
        )
    return found


def form_value(form: str, found: Mapping[str, Any], where: str) -> str:
    """FORM with its values filled in."""
    names = NAME.findall(form)
    if not names:
        raise RenderError(
            f"{where}: the marker `{MARKER}{form}` names no value: write its form, say {{port}}"
        )
    unknown = sorted(set(names) - set(found))
    if unknown:
        raise RenderError(
            f"{where}: unknown value(s) {', '.join(unknown)} in `{MARKER}{form}`: use a value of ci/render.values()"
        )
    value = NAME.sub(lambda m: str(found[m.group(1)]), form)
    blank = next((name for name in names if re.search(r"\s", str(found[name]))), None)
    if blank:
        raise RenderError(f"{where}: {blank} = {found[blank]!r} has a blank: a marked value is one word")
    return value


def form_pattern(form: str) -> re.Pattern[str]:
    """The text FORM stands for, at the end of a line: its literal parts, each value a run of non-blank characters."""
    parts = NAME.split(form)
    body = "".join(re.escape(part) if i % 2 == 0 else r"\S+" for i, part in enumerate(parts))
    return re.compile(rf"(?<!\S){body}$")


def rewrite_line(line: str, form: str, found: Mapping[str, Any], where: str) -> str:
    """LINE with the end that reads as FORM rewritten with the values."""
    value = form_value(form, found, where)
    match = form_pattern(form).search(line)
    if match is None:
        raise RenderError(
            f"{where}: `{line.strip()}` does not end in the form `{form}` of its marker: fix the line or the marker"
        )
    return line[: match.start()] + value


def rewrite(text: str, found: Mapping[str, Any], rel: str) -> str:
    """TEXT with every marked value rewritten; a file without a marker is an error (it left MARKED's list)."""
    lines = text.split("\n")
    out: list[str] = []
    above: str | None = None  # the form of a marker on its own line, for the line below
    markers = 0
    for number, line in enumerate(lines, 1):
        where = f"{rel}:{number}"
        if above is not None:
            out.append(rewrite_line(line, above, found, where))
            above = None
            continue
        content, marker, form = line.partition(MARKER)
        if not marker:
            out.append(line)
            continue
        markers += 1
        if not content.strip():
            above = form.strip()
            out.append(line)
            continue
        body = content.rstrip()
        out.append(rewrite_line(body, form.strip(), found, where) + content[len(body) :] + marker + form)
    if above is not None:
        raise RenderError(f"{rel}: the last line is a marker with no line below it to rewrite")
    if not markers:
        raise RenderError(f"{rel}: no `{MARKER}FORM` marker left: take the file off ci/render.MARKED")
    return "\n".join(out)


def without_markers(line: str) -> str:
    content, marker, _ = line.partition(MARKER)
    return content.rstrip() if marker else line


def host_env_example(cfg: Mapping[str, Any]) -> str:
    lines = [
        "# Written by ci/render from entrypoint/glm5.toml's [setting.*]: edit those, then run ci/render.",
        "# Host-side settings: copy to .env beside docker-compose.yml. docker compose reads them from there (or the",
        "# shell, which wins) and so do ci/smoke and ci/bench; inside the container (glm5.env) they are refused.",
    ]
    for s in settings.declarations(cfg).values():
        if s.where in ("host", "ci"):
            lines += [f"# {s.doc}", f"# {s.name}={s.default or ''}"]
    return "\n".join(lines) + "\n"


def env_example(cfg: Mapping[str, Any]) -> str:
    lines = [
        "# Written by ci/render from entrypoint/glm5.toml's [setting.*]: edit those, then run ci/render.",
        "# Copy to glm5.env (docker compose passes it to the container). Every variable is optional; bad values stop",
        "# the start with a message naming them. Host-side settings (the published address and port, the model's",
        "# host folder, the image) go in .env instead: see .env.example.",
    ]
    decls = settings.declarations(cfg).values()
    for s in decls:
        if s.where == "container" and s.name not in ("GLM5_HOME", "GLM5_SERVER_PROGRAM"):
            lines.append(f"# {s.doc}")
            lines.append(
                f"# {s.name}={s.default or ''}" if s.kind != "secret" else f"# {s.name}_FILE=/run/secrets/..."
            )
    return "\n".join(lines) + "\n"


MONITORING_HEAD = """\
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: glm5-serve
    app.kubernetes.io/component: monitoring
"""


def prometheus_rule(alerts_text: str) -> str:
    """The alerts file as a prometheus-operator PrometheusRule: its groups, moved under spec (one source)."""
    lines = alerts_text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("groups:")), None)
    if start is None:
        raise RenderError(f"{ALERTS}: no top-level `groups:`")
    groups = "\n".join(f"  {without_markers(line)}".rstrip() for line in lines[start:]).rstrip("\n") + "\n"
    return (
        f"# Written by ci/render from {ALERTS}: edit that, then run ci/render.\n"
        "# The kit's alerts for the prometheus-operator; match your Prometheus's ruleSelector.\n"
        "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\n"
        + MONITORING_HEAD.format(name="glm5-serve")
        + "spec:\n"
        + groups
    )


def dashboard_configmap(dashboard_json: str) -> str:
    """The dashboard as a ConfigMap that Grafana's dashboard sidecar loads (its default label grafana_dashboard)."""
    body = "".join(f"    {line}\n" if line else "\n" for line in dashboard_json.rstrip("\n").split("\n"))
    return (
        f"# Written by ci/render from {DASHBOARD} (ci/render-dashboard writes that): do not edit.\n"
        '# The GLM-5 dashboard for Grafana\'s dashboard sidecar (label grafana_dashboard: "1").\n'
        "apiVersion: v1\nkind: ConfigMap\n"
        + MONITORING_HEAD.format(name="glm5-serve-dashboard")
        + '    grafana_dashboard: "1"\n'
        + "data:\n  glm5.json: |\n"
        + body
    )


def preflight_exit_codes(found: Mapping[str, Any]) -> str:
    """entrypoint/preflight.py's EXIT_CODES as a table, its {NAME}s filled with the values."""
    rows = ["| code | what | fix named in the message |", "|---|---|---|"]
    for codes, what, fix in preflight.EXIT_CODES:
        run = len(codes) > 2 and list(codes) == list(range(codes[0], codes[-1] + 1))
        code = f"{codes[0]}-{codes[-1]}" if run else ", ".join(map(str, codes))
        where = f"{preflight.__name__}.EXIT_CODES ({code})"
        rows.append(f"| {code} | {fill(what, found, where)} | {fill(fix, found, where)} |")
    return "\n".join(rows) + "\n"


def fill(text: str, found: Mapping[str, Any], where: str) -> str:
    """TEXT with each {NAME} replaced by its value (text without one is returned as it is)."""
    unknown = sorted(set(NAME.findall(text)) - set(found))
    if unknown:
        raise RenderError(
            f"{where}: unknown value(s) {', '.join(unknown)}: use a value of ci/render.values()"
        )
    return NAME.sub(lambda m: str(found[m.group(1)]), text)


def readme_blocks(cfg: Mapping[str, Any]) -> dict[str, Callable[[], str]]:
    def configuration() -> str:
        return config.reference(cfg)

    def phases() -> str:
        rows = ["| phase | what is happening | typical time |", "|---|---|---|"]
        rows += [f"| `{p}` | {p.meaning} | {p.typical} |" for p in Phase]
        return "\n".join(rows) + "\n"

    def exit_codes() -> str:
        rows = ["| code | meaning | tools |", "|---|---|---|"]
        rows += [f"| {code} | {meaning} | {tools} |" for code, meaning, tools in EXIT_CODES]
        return "\n".join(rows) + "\n"

    def figures() -> str:
        rows = ["| figure | value | measured |", "|---|---|---|"]
        rows += [f"| {f['what']} | {f['value']:g} {f['unit']} | {f['measured']} |" for f in load_figures()]
        return "\n".join(rows) + "\n"

    def failure_codes() -> str:
        rows = ["| code | kind | what failed | exit code | a restart | fix |", "|---|---|---|---|---|---|"]
        rows += [
            f"| {f.exported} | `{f.kind}` | {f.meaning} | {f.exit_code if f.kind != 'refused' else '3, 10-43'} | "
            f"{'restarted, counted; past GLM5_START_RETRIES the kit gives up' if f.restart else 'the kit gives up at once'}"
            f" | {f.fix} |"
            for f in FAILURES
        ]
        return "\n".join(rows) + "\n"

    def sizing() -> str:
        gw, deployment = cfg["gateway"], cfg["deployment"]
        found = values(cfg)
        decode = int(found["autoscaling_capacity"])  # the largest captured decode batch at the defaults
        # The pools by the layout's estimate at TP attention: the fp8 cache (the default), and bf16's at its own
        # bytes a token (configuration/layout.py kv_bytes_per_token).
        pool, wide = found["replica_pool_tokens"], layout.default_pool(cfg, {"GLM5_KV_CACHE_DTYPE": "bf16"})
        rows = [
            f"| context (prompt + answer) | requests a replica holds at once (fp8 KV cache, {pool:,} tokens) "
            f"| with `GLM5_KV_CACHE_DTYPE=bf16` ({wide:,} tokens) |",
            "|---|---|---|",
        ]
        for context in gw["sizing_contexts"]:
            fp8 = admission.per_replica(decode, pool, context)
            bf16 = admission.per_replica(decode, wide, context)
            mark = " (the gateway's `context_tokens`)" if context == gw["context_tokens"] else ""
            rows.append(f"| {context:,}{mark} | {fp8} | {bf16} |")
        rows += [
            "",
            f"| the {deployment['weights_gb']} GB of weights read from | a start's load |",
            "|---|---|",
        ]
        for rate in (0.5, 1, 2, 4):
            rows.append(
                f"| a disk or share at {rate:g} GB/s (cold) | {deployment['weights_gb'] / rate / 60:.1f} min |"
            )
        rows.append(
            f"| the host's page cache (warm: only where the host's free RAM holds all {deployment['weights_gb']} GB "
            "besides the container's, so not at the 128 GiB minimum) | ~1 min |"
        )
        return "\n".join(rows) + "\n"

    def node_size() -> str:
        rows = ["| on the node | CPUs | memory (GiB) |", "|---|---|---|"]
        rows += [f"| {what} | {cpu:+.2f} | {gib:+.1f} |" for what, cpu, gib in node_fit(values(cfg))]
        return "\n".join(rows) + "\n"

    def first_answer() -> str:
        return first_answer_table(cfg)

    def layouts() -> str:
        gw = cfg["gateway"]
        chosen = config.resolve({"GLM5_PROFILE": "throughput"}, cfg).layout
        contexts = [c for c in gw["sizing_contexts"] if c in (4096, 16384, 131072)]
        rows = [
            "| attention | attention weights a GPU | KV cache a GPU | KV tokens a replica | "
            + " | ".join(f"requests of {c:,}" for c in contexts)
            + " |",
            "|---|---|---|---|" + "---|" * len(contexts),
        ]
        for o in chosen.options:
            name = "TP (`latency`)" if o.attn_dp_size == 1 else f"DP {o.attn_dp_size} (`throughput`"
            name += (
                ", auto)" if o.attn_dp_size == chosen.attn_dp_size else (")" if o.attn_dp_size > 1 else "")
            )
            held = [o.attn_dp_size * (o.pool_tokens // c) for c in contexts]
            rows.append(f"| {name} | {o.attention_gib_per_gpu:.1f} GiB | {o.kv_gib_per_gpu:.1f} GiB | "
                        f"{o.replica_tokens:,} | " + " | ".join(str(h) for h in held) + " |")  # fmt: skip
        return "\n".join(rows) + "\n"

    def state_records() -> str:
        rows = [
            "| record | written by | when | read by | start stamp | lifetime | what |",
            "|---|---|---|---|---|---|---|",
        ]
        rows += [
            f"| `{r.name}` | {', '.join(f'`{w}`' for w in r.writers)} | {r.when} | {r.readers} | {r.stamp} | "
            f"{r.lifetime} | {r.what} |"
            for r in state.RECORDS
        ]
        return "\n".join(rows) + "\n"

    def verification() -> str:
        rows = ["| kind | the same answer | may miss | why |", "|---|---|---|---|"]
        for kind, same in verify_items.SAME_ANSWER.items():
            share, why = verify_run.TOLERANCE[kind]
            rows.append(f"| {kind} | {same} | {share:.0%} of its group | {why} |")
        rows += [
            "",
            f"A reply cut by its token bound and not right is asked again once at {verify_run.LENGTH_FACTOR}x the "
            f"bound; an HTTP error or timeout up to {verify_run.TRANSPORT_ATTEMPTS} asks in all, "
            f"{verify_run.TRANSPORT_PAUSE:g} s apart.",
        ]
        return "\n".join(rows) + "\n"

    def kernels() -> str:
        def figure(module: kernel_modules.Module, key: str, unit: str) -> str:
            value = module.figures.get(key)
            return f"{value:g} {unit}" if isinstance(value, int | float) else "not measured"

        kernel_list = kernel_modules.load()
        rows = [
            "| module | sources | a start without it compiles it at | 2 cores | 32 cores | memory per job | size |",
            "|---|---|---|---|---|---|---|",
        ]
        rows += [
            f"| `{m.name}`{' (CI)' if m.name in kernel_list.ci else ''} | {m.sources} | {m.when} | "
            f"{figure(m, 'build_seconds', 's')} | {figure(m, 'build_seconds_32', 's')} | "
            f"{figure(m, 'job_memory_mib', 'MiB')} | {figure(m, 'so_mib', 'MiB')} |"
            for m in kernel_list.modules
        ]
        rows += ["", "| still compiled at a first start | why no image build can |", "|---|---|"]
        rows += [f"| {n.name} | {n.why} |" for n in kernel_list.first_start]
        rows += ["", "| not prebuilt: not reached with these flags | why |", "|---|---|"]
        rows += [f"| `{n.name}` | {n.why} |" for n in kernel_list.not_requested]
        return "\n".join(rows) + "\n"

    return {
        "kernels": kernels,
        "configuration": configuration,
        "phases": phases,
        "exit-codes": exit_codes,
        "figures": figures,
        "failure-codes": failure_codes,
        "state-records": state_records,
        "sizing": sizing,
        "node-size": node_size,
        "first-answer": first_answer,
        "layouts": layouts,
        "preflight-exit-codes": lambda: preflight_exit_codes(values(cfg)),
        "verification": verification,
    }


# The two boxes the time-to-first-answer estimates are for: (name, cores, network Gbit/s, weights disk GB/s).
BOXES = (("the minimum box: 16 cores, 1 Gbit/s, a 1 GB/s disk", 16, 1.0, 1.0),
         ("a fast box: 32 cores, 10 Gbit/s, a 4 GB/s disk", 32, 10.0, 4.0))  # fmt: skip
# The start's phases after the load, from the phase table (healthcheck/verdict.py): capture ~4 min, warm-up under a
# minute, verification ~30 s; autotune "minutes", not counted.
AFTER_LOAD_MINUTES = 4 + 1 + 0.5


def first_answer_table(cfg: Mapping[str, Any]) -> str:
    """docs/reference.md's time to a first answer by phase, and the sweep's time: arithmetic on the kit's own figures
    (the checkpoint's size, the Figures table, the kernels' build times, the phase table, ci/sweep-sm120.toml)."""
    weights_gb = cfg["deployment"]["weights_gb"]
    figures = {f["key"]: f["value"] for f in load_figures()}
    kernel_seconds_32 = sum(
        float(m.figures.get("build_seconds_32", 0)) for m in kernel_modules.load().modules
    )
    rows = [f"| phase (estimates) | {BOXES[0][0]} | {BOXES[1][0]} | from |", "|---|---|---|---|"]
    phases: list[tuple[str, list[float], str]] = [
        (f"`hf download`, {weights_gb} GB", [weights_gb * 8 / gbit / 60 for _, _, gbit, _ in BOXES],
         "the checkpoint's size at the line rate"),
        ("build: the image without its kernels", [figures["build_minutes"]] * 2,
         "Figures: ci/build-image on 2 cores (the CUDA base image's pull not counted)"),
        ("build: every FlashInfer kernel (`GLM5_KERNELS=all`)",
         [kernel_seconds_32 * 32 / cores / 60 for _, cores, _, _ in BOXES],
         "docs/internals.md: the modules' 32-core build times, scaled by the cores"),
        ("first start: load, capture, warm-up, verification",
         [weights_gb / disk / 60 + AFTER_LOAD_MINUTES for _, _, _, disk in BOXES],
         "Sizing's cold load; the phase table (autotune and the first start's JIT compiles not counted)"),
    ]  # fmt: skip
    for what, minutes, source in phases:
        rows.append(f"| {what} | {minutes[0]:.0f} min | {minutes[1]:.0f} min | {source} |")
    total = [sum(p[1][i] for p in phases) for i in range(2)]
    overlapped = [max(phases[0][1][i], phases[1][1][i] + phases[2][1][i]) + phases[3][1][i] for i in range(2)]
    rows.append(
        f"| to a first answer, one step after another | {total[0]:.0f} min | {total[1]:.0f} min | the sum |"
    )
    rows.append(
        f"| the same with `docker compose build glm5` run during the download | {overlapped[0]:.0f} min | "
        f"{overlapped[1]:.0f} min | the build needs no weights |"
    )
    rows.append(
        f"| a later start (the image built, the weights cold on disk) | {phases[3][1][0]:.0f} min | "
        f"{phases[3][1][1]:.0f} min | the first start's row; warm in the page cache: Figures, {figures['start_warm_minutes']:g} min |"
    )
    with (ROOT / "ci" / "sweep-sm120.toml").open("rb") as fh:
        sweep = tomllib.load(fh)
    shapes = {
        s["name"]: s["num_prompts"] * s["output_len"] / s["published_output_tok_s"] / 60
        for s in sweep["shape"]
    }
    start = phases[3][1][0]
    per_variant = start + sum(shapes.values())
    variants = len(sweep["variant"])
    winner = sweep["winner_shape"]
    rows += [
        "",
        "| `ci/bench --sweep` (estimates: each shape's output tokens at its published rate, a cold start a variant) | time |",
        "|---|---|",
        f"| `ci/bench --sweep ci/sweep-sm120.toml`: {variants} variants, each a start and {len(shapes)} shapes "
        f"({', '.join(f'{n} {m:.0f} min' for n, m in shapes.items())}) | {variants * per_variant / 60:.0f} h |",
        f"| `ci/bench --sweep ci/sweep-sm120.toml --shape {winner}`: every variant at the winner's shape alone | "
        f"{variants * (start + shapes[winner]) / 60:.1f} h |",
        f"| the same with a copy of the file keeping only the variants to compare, two of them | "
        f"{2 * (start + shapes[winner]) / 60:.1f} h |",
    ]
    return "\n".join(rows) + "\n"


def kubernetes_image_problems(files: Mapping[str, str], image: str) -> list[str]:
    """Every container image `kubectl kustomize` gives, as k8s/components/image's entry rewrites it (kustomize's
    images transformer: a container whose image name is the entry's `name` becomes newName:newTag, any other stays
    as written), must be glm5.toml's image: a name the entry does not match would be pulled untagged (`:latest`)."""
    entry = dict(IMAGE_ENTRY.findall(files[IMAGE_COMPONENT].split("images:", 1)[-1]))
    problems = []
    for rel, text in sorted(files.items()):
        if rel == IMAGE_COMPONENT:
            continue
        for written in CONTAINER_IMAGE.findall(text):
            name = (
                written.split("@", 1)[0].rsplit(":", 1)[0] if ":" in written.rsplit("/", 1)[-1] else written
            )
            pin = f"@{entry['digest']}" if "digest" in entry else f":{entry['newTag']}"
            result = f"{entry.get('newName', name)}{pin}" if name == entry.get("name") else written
            if result != image:
                untagged = (
                    " (untagged: the cluster pulls :latest)" if ":" not in result.rsplit("/", 1)[-1] else ""
                )
                problems.append(
                    f"{rel}: image {written} renders as {result}{untagged}, not glm5.toml's {image}: write "
                    f"`image: {entry.get('name')}`, the name {IMAGE_COMPONENT} rewrites"
                )
    return problems


def image_component_problems(text: str) -> list[str]:
    """k8s/components/image pins the image with the one line ci/render writes from glm5.toml (newTag, or digest for
    NAME:TAG@sha256:...): a `digest:` or `newTag:` line added by hand would pin another image than glm5.toml names."""
    problems = []
    for number, line in enumerate(text.split("\n"), 1):
        entry = IMAGE_ENTRY.match(line)
        if entry and entry[1] in ("newTag", "digest") and MARKER not in line:
            problems.append(
                f"{IMAGE_COMPONENT}:{number}: `{line.strip()}` is not ci/render's: this file's pin is written from "
                'entrypoint/glm5.toml\'s [deployment].image; to pin a digest write image = "NAME:TAG@sha256:<64 hex>" '
                "there, delete this line and run ci/render"
            )
    return problems


def kubernetes_files(root: Path, out: Mapping[str, str]) -> dict[str, str]:
    """Every Kubernetes file of the kit as it will read: rendered where ci/render keeps it, else as it is."""
    found = {str(p.relative_to(root)): p.read_text() for p in sorted((root / "k8s").rglob("*.yaml"))}
    return found | {rel: text for rel, text in out.items() if rel.startswith("k8s/")}


def load_figures(root: Path = ROOT) -> list[dict[str, Any]]:
    with (root / FIGURES).open("rb") as fh:
        return list(tomllib.load(fh)["figure"])


def replace_block(text: str, name: str, body: str, document: str = README) -> str:
    begin, end = f"<!-- ci/render: {name} -->\n", f"<!-- ci/render: end {name} -->"
    if begin not in text or end not in text:
        raise RenderError(f"{document}: no block `{begin.strip()}` ... `{end}`: put the markers back")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + body + end + tail


def render(root: Path) -> dict[str, str]:
    """Every file ci/render keeps, by path relative to `root`, as it should read."""
    cfg = settings.load_config(root / SOURCE)
    config.resolve({}, cfg)  # the configuration itself must be valid before anything is rendered
    found = values(cfg)
    out = {rel: rewrite((root / rel).read_text(), found, rel) for rel in MARKED}
    out[PROMETHEUS_RULE] = prometheus_rule(out[ALERTS])
    out[DASHBOARD_CONFIGMAP] = dashboard_configmap((root / DASHBOARD).read_text())
    out[ENV_EXAMPLE] = env_example(cfg)
    out[HOST_ENV_EXAMPLE] = host_env_example(cfg)
    images = image_component_problems(out[IMAGE_COMPONENT]) or kubernetes_image_problems(
        kubernetes_files(root, out), found["image_kubernetes"]
    )
    if images:
        raise RenderError("; ".join(images))
    blocks = readme_blocks(cfg)
    placed = [name for names in BLOCKS.values() for name in names]
    if sorted(placed) != sorted(blocks):
        raise RenderError(
            f"ci/render.BLOCKS places {sorted(placed)}, the blocks are {sorted(blocks)}: place each once"
        )
    for document, names in BLOCKS.items():
        text = (root / document).read_text()
        for name in names:
            text = replace_block(text, name, blocks[name](), document)
        out[document] = text
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ci/render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 naming each stale file; write nothing")
    parser.add_argument("--root", type=Path, default=ROOT, help="the kit's folder (default: this checkout)")
    args = parser.parse_args(argv)
    try:
        wanted = render(args.root)
    except (RenderError, Problems) as err:
        LOG.error(str(err))
        return FAILED
    stale = [
        rel
        for rel, text in wanted.items()
        if not (args.root / rel).exists() or (args.root / rel).read_text() != text
    ]
    if args.check:
        for rel in stale:
            LOG.error(f"stale: {rel} (run ci/render, then commit it)")
        return FAILED if stale else OK
    for rel in stale:
        (args.root / rel).write_text(wanted[rel])
        print(f"ci/render: wrote {rel}")
    if not stale:
        print(f"ci/render: all {len(wanted)} files current")
    return OK


if __name__ == "__main__":
    sys.exit(main())
