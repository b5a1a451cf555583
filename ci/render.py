"""Render every file that repeats a deployment value from the one source, entrypoint/glm5.toml.

    ci/render            write the rendered files (and the README's generated blocks)
    ci/render --check    change nothing; exit 1 naming every stale file (part of ci/test)

The renderer owns the files in OUTPUTS: edit their template in ci/templates/ (or glm5.toml), never the output;
each output's first comment line says so. Templates use `{{ name }}` for a value of `values()`: glm5.toml's
[deployment] and [image], the settings' defaults, and the values derived from them (stop and termination
grace, the startup probe's failure threshold, the probe commands). An unknown name fails the render.
README.md keeps hand-written prose around blocks that the renderer owns between `<!-- ci/render: NAME -->`
and `<!-- ci/render: end NAME -->`. Files written by hand that need a rendered value (a kustomize overlay,
say) take it from a rendered file rather than repeating it (see ci/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from common.report import EXIT_CODES, FAILED, FAILURE_KINDS, OK, Log, Problems
from configuration import config, settings
from kernels import modules as kernel_modules

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = "ci/templates"
# output: template (relative to the root)
OUTPUTS = {
    "Dockerfile": f"{TEMPLATES}/Dockerfile",
    "docker-compose.yml": f"{TEMPLATES}/docker-compose.yml",
    "k8s/base/statefulset.yaml": f"{TEMPLATES}/k8s/base/statefulset.yaml",
    "k8s/base/service.yaml": f"{TEMPLATES}/k8s/base/service.yaml",
    "k8s/base/pvc-weights.yaml": f"{TEMPLATES}/k8s/base/pvc-weights.yaml",
    "k8s/base/job-weights.yaml": f"{TEMPLATES}/k8s/base/job-weights.yaml",
    "k8s/base/namespace.yaml": f"{TEMPLATES}/k8s/base/namespace.yaml",
    "k8s/base/networkpolicy.yaml": f"{TEMPLATES}/k8s/base/networkpolicy.yaml",
    "k8s/overlays/gateway/gateway.yaml": f"{TEMPLATES}/k8s/overlays/gateway/gateway.yaml",
    "k8s/overlays/gateway/replicas.yaml": f"{TEMPLATES}/k8s/overlays/gateway/replicas.yaml",
    "image/requirements.in": f"{TEMPLATES}/image/requirements.in",
    "monitoring/prometheus/prometheus.yml": f"{TEMPLATES}/monitoring/prometheus.yml",
    "monitoring/prometheus/alerts.yml": f"{TEMPLATES}/monitoring/alerts.yml",
    "k8s/components/monitoring/podmonitor.yaml": f"{TEMPLATES}/k8s/components/monitoring/podmonitor.yaml",
}
DASHBOARD = "monitoring/grafana/dashboards/glm5.json"  # built by monitoring/dashboard.py, no template
PROMETHEUS_RULE = "k8s/components/monitoring/prometheusrule.yaml"  # the rendered alerts, wrapped
DASHBOARD_CONFIGMAP = "k8s/components/monitoring/dashboard.yaml"  # the dashboard, for Grafana's sidecar
GENERATED = (DASHBOARD, PROMETHEUS_RULE, DASHBOARD_CONFIGMAP)  # written from code, not from a template
ENV_EXAMPLE = "glm5.env.example"  # rendered from the settings' declarations, no template
HOST_ENV_EXAMPLE = ".env.example"  # the host-side settings, likewise
README = "README.md"
FIGURES = "ci/figures.toml"  # measured figures, rendered into the README's figures table
LOG = Log("ci/render")
PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


class RenderError(Exception):
    pass


def values(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a template may use: source values and the values derived from them."""
    v: dict[str, Any] = dict(cfg["deployment"]) | dict(cfg["image"])
    defaults = settings.resolve({}, cfg, where="ci")
    v["model_host_dir"], v["bind"] = defaults["model_host_dir"], defaults["bind"]
    v["monitoring_bind"] = defaults["monitoring_bind"]
    v["kernels"] = defaults["kernels"]  # the image build's GLM5_KERNELS (Dockerfile ARG, compose build args)
    # The pod's log volume: the server log and its rotations with room to spare (twice their bound, plus 64 MiB).
    v["log_volume_size"] = f"{math.ceil(2 * v['log_max_bytes'] * (v['log_backups'] + 1) / 2**20) + 64}Mi"
    v["stop_grace_seconds"] = v["drain_seconds"] + v["stop_margin_seconds"]
    v["termination_grace_seconds"] = v["prestop_seconds"] + v["stop_grace_seconds"]
    v["startup_failure_threshold"] = math.ceil(v["startup_budget_seconds"] / v["probe_period_seconds"])
    v["startup_budget_minutes"] = round(v["startup_budget_seconds"] / 60)
    v["gpu_count_minus_one"] = v["gpu_count"] - 1
    # Kubernetes names the image without its tag: kustomization.yaml's images entry sets registry, name and tag.
    v["image_name"] = v["image"].rsplit(":", 1)[0]
    v["gpu_device_ids_json"] = json.dumps([str(i) for i in range(v["gpu_count"])])
    probe = f"{v['home']}/healthcheck/healthcheck"
    v["readiness_command_json"] = json.dumps([probe, "--status"])
    v["liveness_command_json"] = json.dumps([probe, "--live", "--status"])
    v["startup_command_json"] = json.dumps([probe, "--started", "--status"])
    v["compose_readiness_json"] = json.dumps(["CMD", probe, "--status"])
    v["api_key_dir"] = "/run/secrets/glm5"
    v["home_dir"] = "/home/glm5"  # the image user's HOME (the Dockerfile's useradd)
    for key, value in cfg["monitoring"].items():
        v[f"monitoring_{key}"] = value
    v["monitoring_restart_loop_starts_minus_one"] = v["monitoring_restart_loop_starts"] - 1
    for key, value in cfg["gateway"].items():
        if not isinstance(value, list):
            v[f"gateway_{key}"] = value
    problems = [
        f"stop_margin_seconds = {v['stop_margin_seconds']}: supervisord needs time to kill and exit after the drain; use 5 or more"
        for _ in [1]
        if v["stop_margin_seconds"] < 5
    ]
    if v["start_seconds"] < v["startup_budget_seconds"]:
        problems.append(
            f"start_seconds = {v['start_seconds']} is under startup_budget_seconds = {v['startup_budget_seconds']}: a "
            "start that fails after it would restart forever without counting towards FATAL"
        )
    longest = settings.declarations(cfg)["GLM5_HEALTH_TIMEOUT"].high
    if v["probe_command_timeout_seconds"] <= max(v["health_timeout_seconds"], longest):
        problems.append(
            f"probe_command_timeout_seconds = {v['probe_command_timeout_seconds']} must exceed health_timeout_seconds "
            f"= {v['health_timeout_seconds']} and GLM5_HEALTH_TIMEOUT's max {longest} (the probe waits that long for /health)"
        )
    if problems:
        raise RenderError("entrypoint/glm5.toml: " + "; ".join(problems))
    return v


def fill(text: str, found: Mapping[str, Any], source: str) -> str:
    unknown = sorted({m.group(1) for m in PLACEHOLDER.finditer(text)} - set(found))
    if unknown:
        raise RenderError(
            f"{source}: unknown placeholder(s) {', '.join(unknown)}: use a value of ci/render.values()"
        )
    return PLACEHOLDER.sub(lambda m: str(found[m.group(1)]), text)


def with_header(output: str, template: str, text: str) -> str:
    """The generated-file line, after a Dockerfile's syntax directive (which must stay first)."""
    line = f"# Generated by ci/render from {template} and entrypoint/glm5.toml: edit those, then run ci/render.\n"
    if text.startswith("# syntax="):
        first, rest = text.split("\n", 1)
        return f"{first}\n{line}{rest}"
    return line + text


def host_env_example(cfg: Mapping[str, Any]) -> str:
    lines = [
        "# Generated by ci/render from entrypoint/glm5.toml's [setting.*]: edit those, then run ci/render.",
        "# Host-side settings: copy to .env beside docker-compose.yml. docker compose reads them from there (or the",
        "# shell, which wins) and so do ci/smoke and ci/bench; inside the container (glm5.env) they are refused.",
    ]
    for s in settings.declarations(cfg).values():
        if s.where in ("host", "ci"):
            lines += [f"# {s.doc}", f"# {s.name}={s.default or ''}"]
    return "\n".join(lines) + "\n"


def env_example(cfg: Mapping[str, Any]) -> str:
    lines = [
        "# Generated by ci/render from entrypoint/glm5.toml's [setting.*]: edit those, then run ci/render.",
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


MONITORING_LABELS = {"app.kubernetes.io/name": "glm5-serve", "app.kubernetes.io/component": "monitoring"}


def prometheus_rule(alerts_text: str) -> str:
    """The alerts file as a prometheus-operator PrometheusRule: the same groups, one source."""
    import yaml

    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "glm5-serve", "labels": MONITORING_LABELS},
        "spec": {"groups": yaml.safe_load(alerts_text)["groups"]},
    }
    head = (
        f"# Generated by ci/render from {OUTPUTS['monitoring/prometheus/alerts.yml']} and entrypoint/glm5.toml: edit those, "
        "then run ci/render.\n# The kit's alerts (monitoring/prometheus/alerts.yml) for the prometheus-operator; match your "
        "Prometheus's ruleSelector.\n"
    )
    return head + yaml.safe_dump(rule, sort_keys=False, width=120)


def dashboard_configmap(dashboard_json: str) -> str:
    """The dashboard as a ConfigMap that Grafana's dashboard sidecar loads (its default label grafana_dashboard)."""
    import yaml

    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "glm5-serve-dashboard",
            "labels": MONITORING_LABELS | {"grafana_dashboard": "1"},
        },
        "data": {"glm5.json": dashboard_json},
    }
    head = (
        "# Generated by ci/render from monitoring/dashboard.py: edit that, then run ci/render.\n"
        '# The GLM-5 dashboard for Grafana\'s dashboard sidecar (label grafana_dashboard: "1").\n'
    )
    return head + yaml.safe_dump(cm, sort_keys=False, width=120)


def readme_blocks(cfg: Mapping[str, Any]) -> dict[str, Callable[[], str]]:
    def configuration() -> str:
        return config.reference(cfg)

    def exit_codes() -> str:
        rows = ["| code | meaning | tools |", "|---|---|---|"]
        rows += [f"| {code} | {meaning} | {tools} |" for code, meaning, tools in EXIT_CODES]
        return "\n".join(rows) + "\n"

    def figures() -> str:
        rows = ["| figure | value | measured |", "|---|---|---|"]
        rows += [f"| {f['what']} | {f['value']:g} {f['unit']} | {f['measured']} |" for f in load_figures()]
        return "\n".join(rows) + "\n"

    def failure_codes() -> str:
        rows = ["| code | kind | what failed |", "|---|---|---|"]
        rows += [f"| {code} | `{kind}` | {meaning} |" for code, kind, meaning in FAILURE_KINDS]
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
        "exit-codes": exit_codes,
        "figures": figures,
        "failure-codes": failure_codes,
    }


def load_figures(root: Path = ROOT) -> list[dict[str, Any]]:
    import tomllib

    with (root / FIGURES).open("rb") as fh:
        return list(tomllib.load(fh)["figure"])


def replace_block(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- ci/render: {name} -->\n", f"<!-- ci/render: end {name} -->"
    if begin not in text or end not in text:
        raise RenderError(f"{README}: no block `{begin.strip()}` ... `{end}`: put the markers back")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + body + end + tail


def render(root: Path) -> dict[str, str]:
    """Every owned file's rendered text, by path relative to `root`."""
    cfg = settings.load_config(root / "entrypoint" / "glm5.toml")
    config.resolve({}, cfg)  # the configuration itself must be valid before anything is rendered
    found = values(cfg)
    out = {}
    for output, template in OUTPUTS.items():
        out[output] = with_header(output, template, fill((root / template).read_text(), found, template))
    try:
        import yaml  # noqa: F401  (the Kubernetes wrappers below)

        from monitoring import dashboard
    except ImportError as err:
        raise RenderError(
            f"{err.name} is not installed: the dashboard and the PrometheusRule need it; run ci/setup-test-env tests "
            "(ci/render then uses .venv)"
        ) from err
    out[DASHBOARD] = dashboard.json_text()
    out[PROMETHEUS_RULE] = prometheus_rule(out["monitoring/prometheus/alerts.yml"])
    out[DASHBOARD_CONFIGMAP] = dashboard_configmap(out[DASHBOARD])
    out[ENV_EXAMPLE] = env_example(cfg)
    out[HOST_ENV_EXAMPLE] = host_env_example(cfg)
    readme = (root / README).read_text()
    for name, body in readme_blocks(cfg).items():
        readme = replace_block(readme, name, body())
    out[README] = readme
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
