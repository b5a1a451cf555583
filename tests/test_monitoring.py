"""monitoring/: the start exporter, the alerts (promtool), the dashboard's and the rules' series against the pinned
SGLang, smg and the exporter, a real Prometheus scraping the double behind the real gateway and the exporter under the
real supervisord, and the monitoring overlays' objects (ci/lint checks them against the prometheus-operator's CRD
schemas)."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import util
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from common.report import EXIT_CODES, FAILURE, FAILURES
from configuration import settings, state
from conftest import ROOT, kit_env
from gateway import rotation
from healthcheck.verdict import Verification
from helpers import k8s, start_record
from helpers.container import Container, free_port, start
from helpers.gateway import KEY, Gateway, chat
from helpers.prometheus import Prometheus
from monitoring import dashboard, exporter

PROM = ROOT / "monitoring" / "prometheus"
DASHBOARD = ROOT / "monitoring" / "grafana" / "dashboards" / "glm5.json"
LOGS = ROOT / "tests" / "fixtures" / "logs"
SERIES = re.compile(r"\b(sglang:[a-z_0-9]+|glm5_[a-z_0-9]+|smg_[a-z_0-9]+)")
HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def rules() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"]}


def dashboard_queries() -> list[tuple[str, str]]:
    return dashboard.queries(json.loads(DASHBOARD.read_text()))


def base_name(name: str) -> str:
    for part in HISTOGRAM_PARTS:
        if name.endswith(part):
            return name[: -len(part)]
    return name


# --- the series the dashboard and the alerts use exist ----------------------------------------------------------


def sglang_names() -> set[str]:
    """Every `sglang:` metric name in the installed sglang package's source."""
    spec = util.find_spec("sglang")
    assert spec is not None and spec.origin
    found: set[str] = set()
    for path in Path(spec.origin).parent.rglob("*.py"):
        found.update(re.findall(r"[\"'](sglang:[a-z_0-9]+)[\"']", path.read_text(errors="replace")))
    return found


def smg_binary() -> Path:
    spec = util.find_spec("smg")
    assert spec is not None and spec.origin
    binaries = sorted(Path(spec.origin).parent.glob("*.so"))
    assert binaries, "smg ships its router as a shared object"
    return binaries[0]


def in_binary(binary: Path, names: set[str]) -> set[str]:
    """The names that occur in the binary (Rust packs its strings end to end, so no word boundary to check; the real
    Prometheus test below sees the series themselves)."""
    with binary.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return {n for n in names if data.find(n.encode()) >= 0}


def exporter_names() -> set[str]:
    counters = {"glm5_starts", "glm5_exporter_scrape_errors"}
    return {f"{n}_total" if n in counters else n for n in exporter.NAMES}


def keda_query() -> str:
    """The autoscaling overlay's Prometheus query (k8s/overlays/gateway-autoscaling/scaledobject.yaml)."""
    so = yaml.safe_load((ROOT / "k8s/overlays/gateway-autoscaling/scaledobject.yaml").read_text())
    return str(so["spec"]["triggers"][0]["metadata"]["query"])


def used_series() -> dict[str, set[str]]:
    exprs = [q for _, q in dashboard_queries()] + [r["expr"] for r in rules().values()] + [keda_query()]
    used: dict[str, set[str]] = {"sglang:": set(), "glm5_": set(), "smg_": set()}
    for expr in exprs:
        for name in SERIES.findall(expr):
            used[next(p for p in used if name.startswith(p))].add(base_name(name))
    return used


@pytest.mark.boots
def test_every_series_the_dashboard_and_alerts_use_exists_in_sglang_smg_or_the_exporter() -> None:
    used = used_series()
    assert len(used["sglang:"]) >= 10 and used["glm5_"] and used["smg_"]
    missing = used["sglang:"] - sglang_names()
    assert not missing, f"not in the installed sglang's source: {sorted(missing)}"
    missing = used["glm5_"] - exporter_names() - set(rotation.NAMES)
    assert not missing, f"not exported by monitoring/exporter.py or gateway/rotation.py: {sorted(missing)}"
    missing = used["smg_"] - in_binary(smg_binary(), used["smg_"])
    assert not missing, f"not in smg's binary: {sorted(missing)}"


@pytest.mark.boots
def test_the_name_check_catches_a_series_sglang_does_not_have() -> None:
    names = sglang_names()
    assert "sglang:num_queue_reqs" in names and "sglang:cuda_graph_passes_total" in names
    assert "sglang:num_queued_reqs" not in names  # one letter off: the check above would name it
    assert in_binary(smg_binary(), {"smg_worker_health", "smg_worker_up"}) == {"smg_worker_health"}


@pytest.mark.boots
def test_the_doubles_metrics_are_sglangs_names() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "doubles"))
    try:
        from sglang_metrics_double import Metrics
    finally:
        sys.path.pop(0)
    m = Metrics("glm-5")
    began = m.begin()
    m.token(began, m.token(began, None, True), True)
    m.end(began, 10, 2, True)
    exposed = {
        base_name(s.name)
        for family in text_string_to_metric_families(m.text().decode())
        for s in family.samples
        if not s.name.endswith("_created")
    }
    assert not exposed - sglang_names(), sorted(exposed - sglang_names())
    assert len(exposed) >= 14


# --- the alerts -----------------------------------------------------------------------------------------------------


@pytest.mark.boots
def test_every_alert_has_a_firing_unit_test_and_promtool_passes_them() -> None:
    done = subprocess.run(
        ["promtool", "test", "rules", "alerts.test.yml"], cwd=PROM, capture_output=True, text=True
    )
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    tested = yaml.safe_load((PROM / "alerts.test.yml").read_text())["tests"]
    fired = {c["alertname"] for t in tested for c in t.get("alert_rule_test", []) if c.get("exp_alerts")}
    assert set(rules()) == fired, f"alerts without a firing test: {set(rules()) - fired}"
    assert len(rules()) == 14


@pytest.mark.boots
def test_a_changed_threshold_fails_its_promtool_test(tmp_path: Path) -> None:
    shutil.copytree(PROM, tmp_path / "p")
    alerts = tmp_path / "p" / "alerts.yml"
    text = alerts.read_text()
    assert "(sglang:num_queue_reqs[5m])) > 0) > 0.95" in text
    alerts.write_text(
        text.replace("(sglang:num_queue_reqs[5m])) > 0) > 0.95", "(sglang:num_queue_reqs[5m])) > 0) > 0.99")
    )
    done = subprocess.run(
        ["promtool", "test", "rules", "alerts.test.yml"], cwd=tmp_path / "p", capture_output=True, text=True
    )
    assert done.returncode != 0 and "alertname: GLM5KVCacheFull" in done.stdout + done.stderr


def test_every_alert_has_a_severity_a_summary_and_a_runbook() -> None:
    for name, rule in rules().items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert len(rule["annotations"]["runbook"]) > 60, name
        # Which replica, in the summary: but for the alert on there being none.
        assert ("{{ $labels." in rule["annotations"]["summary"]) != (name == "GLM5ServerMissing"), name


def test_the_stuck_alert_uses_the_healthcheck_stall_setting_and_no_number_of_its_own(tmp_path: Path) -> None:
    assert rules()["GLM5StartStuck"]["expr"] == "glm5_start_progress_age_seconds > glm5_start_stall_seconds"
    run = start_files(tmp_path, "glm5-serve-restart-after-failure.log")
    metrics = scrape_once(run, GLM5_STALL_SECONDS="900")
    assert metrics["glm5_start_stall_seconds"][()] == 900


# --- the exporter ---------------------------------------------------------------------------------------------------


def start_files(tmp: Path, fixture: str, launch: dict[str, Any] | None = None) -> dict[str, str]:
    """A state and log folder holding a fixture log (and a launch.json), as the container has them."""
    (tmp / "log").mkdir(parents=True, exist_ok=True)
    (tmp / "run").mkdir(exist_ok=True)
    shutil.copy(LOGS / fixture, tmp / "log" / state.SERVER_LOG)
    if launch is not None:
        start_record.write(tmp / "run", **launch | {"log_dir": str(tmp / "log")})
    return {"GLM5_LOG_DIR": str(tmp / "log"), "GLM5_STATE_DIR": str(tmp / "run")}


def scrape_once(run: dict[str, str], **env: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """`monitoring/exporter --once`, parsed: {name: {labels: value}}."""
    full = kit_env() | run | env
    done = subprocess.run(
        [str(ROOT / "monitoring" / "exporter"), "--once"],
        capture_output=True,
        text=True,
        env=full,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(done.stdout):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def phase_of(metrics: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> str:
    (on,) = [dict(k)["phase"] for k, v in metrics["glm5_start_phase"].items() if v == 1]
    return on


def test_exporter_reports_capture_progress_of_a_start_in_progress(tmp_path: Path) -> None:
    m = scrape_once(start_files(tmp_path, "glm5-serve-restart-after-failure.log"))
    assert phase_of(m) == "capturing"
    assert m["glm5_start_graphs_captured"][(("graph", "decode"),)] == 36
    assert m["glm5_start_graphs_expected"][(("graph", "decode"),)] == 52
    assert m["glm5_starts_total"][()] == 2
    assert m["glm5_start_failure_code"][()] == 0
    assert "glm5_start_progress_age_seconds" in m  # the start is not over: its quiet time counts


def test_exporter_gives_a_failure_its_code_without_a_label(tmp_path: Path) -> None:
    m = scrape_once(start_files(tmp_path, "sglang-0.5.23-oom-during-decode-capture.log"))
    assert phase_of(m) == "failed"
    assert (
        m["glm5_start_failure_code"] == {(): FAILURE["oom"].exported} == {(): 201}
    )  # common/report.py FAILURES
    assert "glm5_start_progress_age_seconds" not in m  # the start is over


def test_exporter_reports_a_recorded_failure_by_its_exit_code_not_as_a_hang(tmp_path: Path) -> None:
    """A preflight failure recorded after an earlier start's log went quiet: waiting for a fix, not hung (liveness
    must not restart it, and the alert is StartFailed, not StartStuck)."""
    run = start_files(tmp_path, "glm5-serve-restart-after-failure.log")
    old = time.time() - 7200
    os.utime(tmp_path / "log" / state.SERVER_LOG, (old, old))
    state.write_failed(tmp_path / "run", 3, "refused", 31, "the model folder is empty")
    m = scrape_once(run, GLM5_STALL_SECONDS="1800")
    assert phase_of(m) == "failed" and m["glm5_start_failure_code"] == {(): 31}
    assert m["glm5_start_hung"] == {(): 0} and "glm5_start_progress_age_seconds" not in m
    full = kit_env() | run | {"GLM5_STALL_SECONDS": "1800"}
    live = subprocess.run(
        [str(ROOT / "healthcheck" / "healthcheck"), "--live"], env=full, capture_output=True, text=True
    )
    assert live.returncode == 0, live.stdout + live.stderr


def test_exporter_names_the_doctors_warnings_of_the_current_start(tmp_path: Path) -> None:
    warnings = [
        {"name": "pcie_link", "detail": "GPU 3 at Gen4 x8"},
        {"name": "acs", "detail": "ACS on at 2 bridges"},
    ]
    run = start_files(
        tmp_path, "glm5-serve-restart-after-failure.log", {"start": 2, "doctor_warnings": tuple(warnings)}
    )
    m = scrape_once(run)
    assert m["glm5_doctor_warnings"] == {(): 2}
    assert m["glm5_doctor_warning"] == {(("check", "acs"),): 1, (("check", "pcie_link"),): 1}
    other = start_files(
        tmp_path / "other",
        "glm5-serve-restart-after-failure.log",
        {"start": 1, "doctor_warnings": tuple(warnings)},
    )
    assert scrape_once(other)["glm5_doctor_warnings"] == {
        (): 0
    }  # an earlier start's record is not this one's


def test_exporter_reports_a_hung_start_as_the_healthcheck_does(tmp_path: Path) -> None:
    run = start_files(tmp_path, "glm5-serve-restart-after-failure.log")
    old = time.time() - 3600
    os.utime(tmp_path / "log" / state.SERVER_LOG, (old, old))
    m = scrape_once(run, GLM5_STALL_SECONDS="1800")
    assert m["glm5_start_hung"][()] == 1 and m["glm5_start_failure_code"][()] == 209
    assert m["glm5_start_progress_age_seconds"][()] > m["glm5_start_stall_seconds"][()]


def test_failure_codes_never_collide_with_exit_codes() -> None:
    exits = set()
    for code, _, _ in EXIT_CODES:
        low, _, high = code.partition("-")
        exits.update(range(int(low), int(high or low) + 1))
    kinds = [f.exported for f in FAILURES if f.kind != "refused"]
    assert len(set(kinds)) == len(kinds) and not exits & set(kinds)


def sized_log(path: Path, size: int) -> None:
    """A server log of `size` bytes ending in 8 MiB of SGLang request lines and a start in capture (the probe reads only
    the tail; the rest is a hole in the file, so the test costs no gigabyte of disk)."""
    body = (LOGS / "glm5-serve-restart-after-failure.log").read_bytes()
    lines = (
        b'[2026-08-27 05:12:01] INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
        b"[2026-08-27 05:12:01 TP0] Decode batch. #running-req: 37, #token: 81234, token usage: 0.41, "
        b"cuda graph: True, gen throughput (token/s): 1234.56, #queue-req: 0\n"
    )
    tail = lines * ((8 << 20) // len(lines)) + body
    with path.open("wb") as fh:
        fh.truncate(size - len(tail))
        fh.seek(size - len(tail))
        fh.write(tail)


def test_a_scrape_costs_little_cpu_on_a_1_gb_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = start_files(tmp_path, "glm5-serve-restart-after-failure.log")
    sized_log(tmp_path / "log" / state.SERVER_LOG, 1 << 30)
    assert (tmp_path / "log" / state.SERVER_LOG).stat().st_size == 1 << 30
    for key, value in run.items():
        monkeypatch.setenv(key, value)
    from prometheus_client import generate_latest

    reg = exporter.registry(os.environ)
    generate_latest(reg)  # imports and first reads
    began, rounds = time.process_time(), 10
    for _ in range(rounds):
        text = generate_latest(reg).decode()
    per_scrape = (time.process_time() - began) / rounds
    assert 'glm5_start_phase{phase="capturing"} 1.0' in text
    print(f"exporter CPU per scrape on a 1 GiB log: {per_scrape * 1000:.1f} ms")
    assert per_scrape < 0.25, f"{per_scrape:.3f} s of CPU per scrape"


# --- the dashboard --------------------------------------------------------------------------------------------------


def test_the_dashboard_is_the_sdks_build_and_grafana_foundation_sdk_reads_it_back() -> None:
    from grafana_foundation_sdk.models.dashboard import Dashboard

    model = json.loads(DASHBOARD.read_text())
    assert DASHBOARD.read_text() == dashboard.json_text(), "stale: run ci/render-dashboard"
    parsed = Dashboard.from_json(model)
    assert parsed.uid == dashboard.UID and parsed.panels
    titles = {p["title"] for p in model["panels"]}
    for want in ("Generation throughput", "Time to first token", "Inter-token latency", "KV cache use",
                 "Prefix cache hit rate", "Decode passes without a CUDA graph", "Retractions", "Phase",
                 "CUDA graphs captured", "Replica health (gateway's checks)"):  # fmt: skip
        assert want in titles
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids)) and all(ids)
    assert all(p["datasource"]["uid"] == "${datasource}" for p in model["panels"] if p["type"] != "row")


# --- a real Prometheus ----------------------------------------------------------------------------------------------


def grafana_to_promql(expr: str, rate_window: str = "10s") -> str:
    return expr.replace("$__rate_interval", rate_window)


@pytest.fixture
def stack(tmp_path: Path, containers: list[Container]) -> Iterator[tuple[Prometheus, Container, Gateway]]:
    """The container (real supervisord: the double and the exporter), the real gateway in front, a real Prometheus."""
    exporter_port = free_port()
    (tmp_path / "c").mkdir()
    c = start(tmp_path / "c", GLM5_API_KEY=KEY, GLM5_EXPORTER_PORT=str(exporter_port))
    containers.append(c)
    c.wait_healthy()
    gw = Gateway(tmp_path, {"glm5-a": c})
    prom = None
    try:
        gw.wait_healthy(1)
        prom = Prometheus(
            tmp_path,
            {"glm5": f"127.0.0.1:{c.port}", "glm5-exporter": f"127.0.0.1:{exporter_port}",
             "glm5-gateway": f"127.0.0.1:{gw.metrics}", "glm5-rotation": f"127.0.0.1:{gw.rotation_metrics}"},
        )  # fmt: skip
        prom.wait_up({"glm5", "glm5-exporter", "glm5-gateway", "glm5-rotation"})
        yield prom, c, gw
    finally:
        if prom is not None:
            prom.stop()
        gw.stop()


def load(gw: Gateway, seconds: float, streams: int = 4) -> None:
    """Requests through the gateway, several at a time (streamed and not); 4 at most is a healthy replica's load for
    the double (no batch above its captured graph sizes, the KV cache half used)."""
    from concurrent.futures import ThreadPoolExecutor

    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(streams) as pool:
        while time.monotonic() < deadline:
            codes = pool.map(lambda i: chat(gw.url, f"What is 2+{i}?", stream=bool(i % 2))[0], range(streams))
            assert set(codes) == {200}


@pytest.mark.boots
def test_real_prometheus_scrapes_the_stack_and_every_dashboard_query_returns_series(
    stack: tuple[Prometheus, Container, Gateway],
) -> None:
    prom, c, gw = stack
    load(gw, 12)
    time.sleep(2)  # a scrape after the last requests
    empty = []
    for title, expr in dashboard_queries():
        if not prom.query(grafana_to_promql(expr)):
            empty.append((title, expr))
    assert not empty, f"dashboard queries without series: {empty}"
    # KEDA's query, less its namespace matcher (no namespace label off Kubernetes): one number, the demand.
    (demand,) = prom.query(re.sub(r',\s*namespace="[^"]*"', "", keda_query()))
    parts = [
        prom.query(f"sum(max by (instance) (sglang:{n}))") for n in ("num_running_reqs", "num_queue_reqs")
    ]
    # In replicas' worth: over what the gateway admits to a replica, which its exporter says (TP or DP attention).
    (admitted,) = prom.query("avg(glm5_capacity_admitted_requests)")
    assert float(admitted["value"][1]) >= 1
    assert float(demand["value"][1]) == pytest.approx(
        sum(float(p[0]["value"][1]) for p in parts) / float(admitted["value"][1])
    )
    # The series are the exporter's, per replica under one instance label with the server's own.
    (phase,) = prom.query("glm5_start_phase == 1")
    assert phase["metric"]["phase"] == "ready" and phase["metric"]["instance"] == "127.0.0.1"
    (health,) = prom.query("smg_worker_health")
    assert health["value"][1] == "1" and health["metric"]["worker"] == f"http://127.0.0.1:{c.port}"
    (ready,) = prom.query("glm5_start_ready_seconds")
    assert 0 <= float(ready["value"][1]) < 120
    # Every alert's expression runs against the real series, and on a healthy replica none holds: none is pending.
    holding = {name: prom.query(rule["expr"]) for name, rule in rules().items()}
    assert not any(holding.values()), {name: found for name, found in holding.items() if found}
    assert prom.api("alerts")["alerts"] == []


@pytest.mark.boots
def test_real_prometheus_puts_replica_down_pending_when_the_replica_dies(
    stack: tuple[Prometheus, Container, Gateway],
) -> None:
    """The whole replica gone (its container, exporter and all, as a lost host): the rotation takes it out and says
    its exporter is silent. smg drains the worker it is no longer given for 5 s and drops its series: the alert holds
    on the rotation's view after that."""
    prom, c, _ = stack
    for proc in c.leftovers():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    deadline = time.monotonic() + 30
    while prom.query("smg_worker_health") or not prom.query("glm5_rotation_answering == 0"):
        assert time.monotonic() < deadline, (
            prom.query("smg_worker_health"),
            prom.query("glm5_rotation_answering"),
        )
        time.sleep(0.5)
    (out,) = prom.query("glm5_rotation_in_rotation")
    assert out["value"][1] == "0" and out["metric"]["id"] == "glm5-a"
    time.sleep(3)  # evaluations after smg's series went
    alerts = {a["labels"]["alertname"]: a for a in prom.api("alerts")["alerts"]}
    assert alerts["GLM5ReplicaDown"]["state"] == "pending"  # for its 2 minutes, then firing
    assert alerts["GLM5ReplicaDown"]["labels"]["worker"] == f"http://127.0.0.1:{c.port}"


@pytest.mark.boots
def test_a_replica_restarting_its_server_is_out_of_the_rotation_and_not_down(
    stack: tuple[Prometheus, Container, Gateway],
) -> None:
    """The server killed inside a live container: supervisord starts it again, the rotation takes the replica out
    while its exporter says it starts, and back in once ready; no replica-down alert for a start."""
    prom, c, gw = stack
    for proc in c.leftovers():  # the double and its scheduler stand-in
        with contextlib.suppress(psutil.Error):
            if "sglang_server_double" in " ".join(proc.cmdline()):
                proc.kill()
    deadline = time.monotonic() + 90
    for value in ("0", "1"):  # out, then in again
        while prom.query(f"glm5_rotation_in_rotation == {value}") == []:
            assert time.monotonic() < deadline, (value, prom.query("glm5_rotation_phase"))
            time.sleep(0.3)
    gw.wait_healthy(1)
    time.sleep(2)  # an evaluation after the last scrape
    # Over the whole restart its exporter answered; the killed start reads `failed` until the next one begins, and smg
    # (checking every second here) may see the dead server in its 5 s drain of the removed worker: seconds of pending,
    # never firing (`for: 2m`).
    assert prom.query("min_over_time(glm5_rotation_answering[5m]) == 0") == []
    seen = {r["metric"]["phase"] for r in prom.query("max_over_time(glm5_rotation_phase[5m])")}
    assert "ready" in seen and seen & {"starting", "loading", "capturing", "warming_up", "verifying"}, seen
    assert prom.query('ALERTS{alertname="GLM5ReplicaDown", alertstate="firing"}') == []


# --- Kubernetes and compose -----------------------------------------------------------------------------------------


def monitoring_objects(overlay: str) -> list[dict[str, Any]]:
    return [d for d in k8s.objects(ROOT / overlay) if d["apiVersion"].startswith("monitoring.coreos.com")]


@pytest.mark.parametrize(
    "overlay",
    ["k8s/overlays/monitoring", "k8s/overlays/gateway-monitoring", "k8s/overlays/gateway-autoscaling"],
)
def test_each_monitoring_overlay_adds_two_pod_monitors_a_rule_and_the_dashboard(overlay: str) -> None:
    """(ci/lint checks them against the prometheus-operator's CRD schemas, the rest strictly against Kubernetes'.)"""
    assert sorted(o["kind"] for o in monitoring_objects(overlay)) == [
        "PodMonitor",
        "PodMonitor",
        "PrometheusRule",
    ]
    assert "ConfigMap" in {d["kind"] for d in k8s.objects(ROOT / overlay)}


def test_the_pod_monitors_name_ports_the_pods_declare_and_the_rule_is_the_alerts_file() -> None:
    docs = k8s.objects(ROOT / "k8s/overlays/gateway-monitoring")
    ports: dict[str, set[str]] = {}
    for d in docs:
        if d["kind"] in ("StatefulSet", "Deployment"):
            component = d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
            ports[component] = {
                p["name"] for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
            }
    for d in docs:
        if d["kind"] == "PodMonitor":
            component = d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
            assert {e["port"] for e in d["spec"]["podMetricsEndpoints"]} <= ports[component], d["metadata"][
                "name"
            ]
        if d["kind"] == "PrometheusRule":
            assert d["spec"]["groups"] == yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]:
            assert json.loads(d["data"]["glm5.json"]) == json.loads(DASHBOARD.read_text())
    cfg = settings.load_config()
    exporter_port = next(
        p["containerPort"] for d in docs if d["kind"] == "StatefulSet"
        for c in d["spec"]["template"]["spec"]["containers"] for p in c["ports"] if p["name"] == "exporter"
    )  # fmt: skip
    assert exporter_port == cfg["deployment"]["exporter_port"]


def test_the_compose_profile_runs_pinned_prometheus_and_grafana_with_the_shipped_files() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    cfg = settings.load_config()["monitoring"]
    for name, image in (("prometheus", cfg["prometheus_image"]), ("grafana", cfg["grafana_image"])):
        service = compose[name]
        assert service["profiles"] == ["monitoring"] and service["image"] == image
        tag = image.rsplit(":", 1)[1]
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{image}: pin a release tag"
        for volume in service["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), volume
    env = compose["grafana"]["environment"]
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"].endswith("/glm5.json")
    provisioned = yaml.safe_load(
        (ROOT / "monitoring/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert provisioned["datasources"][0]["url"] == "http://prometheus:9090"
    done = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "--profile", "monitoring", "config", "--services"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert {"glm5", "prometheus", "grafana"} <= set(done.stdout.split())


def test_the_prometheus_config_scrapes_the_server_the_exporter_and_the_gateway_on_their_rendered_ports() -> (
    None
):
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    cfg = settings.load_config()
    assert jobs["glm5"]["static_configs"][0]["targets"] == [f"glm5:{cfg['deployment']['port']}"]
    assert jobs["glm5-exporter"]["static_configs"][0]["targets"] == [
        f"glm5:{cfg['deployment']['exporter_port']}"
    ]
    assert jobs["glm5-gateway"]["dns_sd_configs"][0]["port"] == cfg["gateway"]["metrics_port"]
    assert jobs["glm5-rotation"]["dns_sd_configs"][0]["port"] == cfg["gateway"]["rotation_metrics_port"]


def test_the_readme_names_every_alert_and_no_other() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Monitoring") :].split("\n### ", 1)[0]
    assert set(re.findall(r"GLM5[A-Z][A-Za-z]+", section)) == set(rules())


def test_a_runbook_that_says_fix_a_setting_says_how_the_change_is_read() -> None:
    """GLM5StartFailed said "fix the setting ..., then restart the container": `docker compose restart` does not
    re-read glm5.env (its env_file); `docker compose up -d` recreates the container with it."""
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())["groups"]
    runbooks = {r["alert"]: r["annotations"]["runbook"] for g in rules for r in g["rules"] if "alert" in r}
    told = [name for name, text in runbooks.items() if "setting" in text and "restart" in text]
    assert "GLM5StartFailed" in told
    assert [name for name in told if "docker compose up -d glm5" not in runbooks[name]] == []


def test_inconclusive_items_are_counted_and_named_apart_from_wrong_ones() -> None:
    """A verification with one wrong and two inconclusive items (cut twice, or unanswered after the retries): the
    dashboard's wrong count stays the model's misses; the inconclusive ones, which point at transport or the token
    budget, have their own count and names."""
    found = Verification(passed=False, verdict="wrong", accuracy=0.9, right=54, items=57, reasons=(), regressed=(),
                         compared_with=None, seconds=12.0, build_id="dev", wrong=("fact-japan",),
                         inconclusive=("retrieval-32000", "tool-1"))  # fmt: skip
    samples = {
        (s.name, s.labels.get("item", "")): s.value for f in exporter.verification(found) for s in f.samples
    }
    assert samples[("glm5_verification_items_wrong", "")] == 1
    assert samples[("glm5_verification_items_inconclusive", "")] == 2
    assert samples[("glm5_verification_item_inconclusive", "retrieval-32000")] == 1
    assert ("glm5_verification_item_wrong", "tool-1") not in samples
