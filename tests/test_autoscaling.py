"""k8s/overlays/gateway-autoscaling (ci/lint checks KEDA's ScaledObject against its CRD schema): its keys, the
HorizontalPodAutoscaler behaviour it hands on against Kubernetes' own, and the overlay's seams (the count, the
gateway's admission, each replica's cap)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from configuration import admission, layout, settings
from configuration.batch_sizes import effective_decode_max_bs
from conftest import ROOT
from helpers import k8s

pytestmark = pytest.mark.boots  # kustomize, tests/crd's packages, kubernetes-validate, promtool
OVERLAY = ROOT / "k8s" / "overlays" / "gateway-autoscaling"
MODELS = ROOT / "tests" / "crd" / "node_modules" / "@kubernetes-models" / "keda" / "keda.sh" / "v1alpha1"
CONFIG = settings.load_config()
AUTO = CONFIG["autoscaling"]


def built() -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in k8s.objects(OVERLAY)}


def capacity() -> int:
    d = settings.resolve({})
    return effective_decode_max_bs(
        d["cuda_graph_max_bs_decode"], d["speculative"] != "off", d["max_running_requests"]
    )


def admitted() -> int:
    """A replica's share of the gateway's admission: what its KV pool holds of [gateway].context_tokens, at most its
    largest captured decode batch (configuration/admission.py); the pool by the layout's estimate at the defaults."""
    return admission.per_replica(capacity(), layout.default_pool(CONFIG), CONFIG["gateway"]["context_tokens"])


def scaled_object() -> dict[str, Any]:
    return built()[("ScaledObject", "glm5")]


def declared(model: str) -> set[str]:
    """The properties a KEDA model declares (its TypeScript interface): the schema check passes unknown keys."""
    text = (MODELS / f"{model}.d.ts").read_text()
    return set(re.findall(r"^\s+\"?([A-Za-z]+)\"?\??: ", text, re.M))


def settings_of(objects: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    """The GLM5_* environment of the object's first container: its ConfigMaps (envFrom), then its own env."""
    container = objects[(kind, name)]["spec"]["template"]["spec"]["containers"][0]
    found: dict[str, str] = {}
    for source in container.get("envFrom", []):
        found |= objects[("ConfigMap", source["configMapRef"]["name"])].get("data", {})
    found |= {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return {k: v for k, v in found.items() if k.startswith("GLM5_")}


@pytest.mark.parametrize("overlay", ["gateway", "gateway-autoscaling"])
def test_the_gateway_sizes_admission_from_the_settings_the_replicas_run_with(overlay: str) -> None:
    """One ConfigMap (glm5-settings) for both: an operator's setting on the replicas reaches the gateway's admission
    (it once had only its namespace and key, and sized from glm5.toml's defaults whatever the replicas ran)."""
    objects = {
        (o["kind"], o["metadata"]["name"]): o for o in k8s.objects(ROOT / "k8s" / "overlays" / overlay)
    }
    server, gateway = (
        settings_of(objects, "StatefulSet", "glm5"),
        settings_of(objects, "Deployment", "glm5-gateway"),
    )
    assert server == gateway and "GLM5_VERIFY" in server, (server, gateway)


def test_every_key_of_the_scaled_object_is_one_keda_declares() -> None:
    spec = scaled_object()["spec"]
    assert set(spec) <= declared("ScaledObjectSpec"), set(spec) - declared("ScaledObjectSpec")
    assert set(spec["scaleTargetRef"]) <= declared("ScaleTarget")
    assert set(spec["advanced"]) <= declared("AdvancedConfig")
    assert set(spec["advanced"]["horizontalPodAutoscalerConfig"]) <= declared("HorizontalPodAutoscalerConfig")
    for trigger in spec["triggers"]:
        assert set(trigger) <= declared("ScaleTriggers"), set(trigger) - declared("ScaleTriggers")
    assert "pollingIntervall" not in declared("ScaledObjectSpec")  # the check can fail: a typo is no key


def test_the_behaviour_keda_hands_to_its_hpa_is_valid_autoscaling_v2(tmp_path: Path) -> None:
    """KEDA copies advanced.horizontalPodAutoscalerConfig.behavior into the HorizontalPodAutoscaler it creates:
    Kubernetes' own schema, strictly (an unknown key fails)."""
    spec = scaled_object()["spec"]
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-glm5", "namespace": "glm5"},
        "spec": {
            "scaleTargetRef": spec["scaleTargetRef"],
            "minReplicas": spec["minReplicaCount"],
            "maxReplicas": spec["maxReplicaCount"],
            "behavior": spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"],
            "metrics": [{"type": "External", "external": {"metric": {"name": "s0-prometheus"},
                         "target": {"type": "AverageValue", "averageValue": spec["triggers"][0]["metadata"]["threshold"]}}}],
        },
    }  # fmt: skip
    validator = Path(sys.executable).parent / "kubernetes-validate"
    path = tmp_path / "hpa.yaml"
    for doc, ok in (
        (hpa, True),
        (yaml.safe_load(yaml.safe_dump(hpa).replace("periodSeconds", "periodSecond")), False),
    ):
        path.write_text(yaml.safe_dump(doc))
        done = subprocess.run(
            [str(validator), "--strict", "-k", "1.30", str(path)], capture_output=True, text=True
        )
        assert (done.returncode == 0) is ok, done.stdout + done.stderr


def test_the_overlay_scales_the_statefulset_within_its_bounds_on_its_replicas_demand() -> None:
    objects = built()
    so = objects[("ScaledObject", "glm5")]["spec"]
    assert so["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "glm5"}
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (AUTO["min_replicas"], AUTO["max_replicas"])
    assert AUTO["min_replicas"] >= 1 and AUTO["max_replicas"] >= AUTO["min_replicas"]
    # The HPA owns the count: a replicas field would reset it on each apply.
    assert "replicas" not in objects[("StatefulSet", "glm5")]["spec"]
    (trigger,) = so["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == AUTO["prometheus_url"]
    # KEDA counts the demand in replicas' worth, each replica worth what the gateway admits to it (the exporter's own
    # figure, so TP and DP attention alike), and aims at target_utilization of that.
    assert admitted() <= capacity()
    assert float(meta["threshold"]) == AUTO["target_utilization"]
    namespace = CONFIG["deployment"]["namespace"]
    # every series of the namespace's own, and none read as 0 when missing (KEDA errs instead: its fallback)
    assert meta["query"].count(f'namespace="{namespace}"') == 6 and "vector(0)" not in meta["query"]
    assert "/ avg(glm5_capacity_admitted_requests{" in meta["query"]
    up = so["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["policies"]
    assert up == [{"type": "Pods", "value": 1, "periodSeconds": AUTO["scale_up_period_seconds"]}]


def test_each_replica_runs_at_most_its_capacity_and_the_gateway_admits_for_the_most_replicas(
    tmp_path: Path,
) -> None:
    objects = built()
    env = settings_of(objects, "StatefulSet", "glm5")
    assert env["GLM5_MAX_RUNNING_REQUESTS"] == str(capacity())
    assert env["GLM5_API_KEY_FILE"]  # the base's env kept
    gateway = objects[("Deployment", "glm5-gateway")]["spec"]["template"]["spec"]["containers"][0]
    args = gateway["args"]
    assert args[:3] == ["gateway", "--kubernetes", "$(POD_NAMESPACE)"]
    assert args[args.index("--replicas") + 1] == str(AUTO["max_replicas"])
    # What smg is given for those arguments: the bound for the most replicas, split across the gateway pods.
    done = subprocess.run(
        [str(ROOT / "gateway" / "launch"), "--kubernetes", "glm5", "--replicas", str(AUTO["max_replicas"]), "--dry-run"],
        capture_output=True, text=True, timeout=120, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    argv = done.stdout.split()
    bound = AUTO["max_replicas"] * admitted() // CONFIG["gateway"]["gateways"]
    assert argv[argv.index("--queue-size") + 1] == str(bound)
    refused = subprocess.run(
        [str(ROOT / "gateway" / "launch"), "--discovery-file", str(tmp_path / "w.json"), "--replicas", "4", "--dry-run"],
        capture_output=True, text=True, timeout=120, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )  # fmt: skip
    assert refused.returncode == 2 and "--replicas 4: 1 or more, with --kubernetes" in refused.stderr


def test_kedas_query_sums_each_replicas_running_and_queued_requests_once(tmp_path: Path) -> None:
    """The shipped query, evaluated by promtool over series as the PodMonitors label them: one replica reporting
    from two TP ranks counts once, another namespace not at all, what waits in the gateways' queues and what they
    refused (a second's refusals x the queue timeout) counts too, the sum in replicas' worth of what the gateway
    admits to each (25 to a TP-attention replica, 60 to a DP-attention one: their mean). Demand held in the gateway
    alone (the replicas full but not queueing) is above the threshold: the HPA adds a replica. A part with no series
    (no replica reporting, no gateway scraped) is no answer, never 0: KEDA errs and keeps the replicas it has."""
    trigger = scaled_object()["spec"]["triggers"][0]["metadata"]
    query, threshold = trigger["query"], float(trigger["threshold"])
    assert trigger["ignoreNullValues"] == "false"
    fallback = scaled_object()["spec"]["fallback"]
    assert fallback["behavior"] == "currentReplicasIfHigher" and fallback["replicas"] == AUTO["min_replicas"]
    ns = CONFIG["deployment"]["namespace"]
    timeout = CONFIG["gateway"]["queue_timeout_seconds"]

    def series(name: str, pod: str, value: int, rank: str = "0", namespace: str = ns) -> dict[str, str]:
        labels = f'job="glm5", namespace="{namespace}", instance="{pod}", tp_rank="{rank}"'
        return {"series": f"sglang:{name}{{{labels}}}", "values": f"{value}x3"}

    def gateway(pod: str, queued: int, refused_per_minute: int = 0) -> list[dict[str, str]]:
        labels = f'job="glm5-gateway", namespace="{ns}", instance="{pod}"'
        found = [{"series": f'smg_scheduler_queue_depth{{{labels}, class="{c}"}}', "values": f"{queued if c == 'default' else 0}x3"}
                 for c in ("default", "bulk")]  # fmt: skip
        if refused_per_minute:
            found.append({"series": f'smg_http_responses_total{{{labels}, path="/v1/chat/completions", status_code="429", error_code=""}}',
                          "values": f"0+{refused_per_minute}x3"})  # fmt: skip
        return found

    loaded = [series("num_running_reqs", "glm5-0", 300), series("num_queue_reqs", "glm5-0", 50),
              series("num_running_reqs", "glm5-0", 300, rank="1"), series("num_queue_reqs", "glm5-0", 50, rank="1"),
              series("num_running_reqs", "glm5-1", 200), series("num_queue_reqs", "glm5-1", 0),
              series("num_running_reqs", "other-0", 999, namespace="other"),
              series("num_queue_reqs", "other-0", 999, namespace="other")]  # fmt: skip

    def admits(pod: str, value: int, namespace: str = ns) -> dict[str, str]:
        labels = f'job="glm5-exporter", namespace="{namespace}", instance="{pod}"'
        return {"series": f"glm5_capacity_admitted_requests{{{labels}}}", "values": f"{value}x3"}

    loaded += [admits("glm5-0", 25), admits("glm5-1", 60), admits("other-0", 1, namespace="other")]
    full = [series("num_running_reqs", "glm5-0", 25), series("num_queue_reqs", "glm5-0", 0), admits("glm5-0", 25),
            series("num_running_reqs", "glm5-1", 25), series("num_queue_reqs", "glm5-1", 0), admits("glm5-1", 25)]  # fmt: skip
    refused = 6  # a minute, at each of two gateways: 0.1 a second, x the queue timeout
    cases = [
        (loaded + gateway("gw-a", 0), [550 / 42.5]),
        (
            full + gateway("gw-a", 10) + gateway("gw-b", 10, refused),
            [(50 + 20 + refused / 60 * timeout) / 25],
        ),
        (loaded, []),  # no gateway scraped
        (gateway("gw-a", 5) + [{"series": 'up{job="glm5"}', "values": "1x3"}], []),  # no replica reporting
    ]
    tests = [{"interval": "1m", "input_series": inputs,
              "promql_expr_test": [{"expr": query, "eval_time": "2m",
                                    "exp_samples": [{"labels": "{}", "value": v} for v in want]}]}
             for inputs, want in cases]  # fmt: skip
    # replicas full, 20 waiting in the gateways and some refused: desired = ceil(2 x demand / threshold) > 2
    assert cases[1][1][0] / threshold > 2
    (tmp_path / "none.yml").write_text("groups: []\n")
    path = tmp_path / "query.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": ["none.yml"], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    broken = path.read_text().replace("max by (instance)", "sum by (instance)")  # counting both ranks: 900
    path.write_text(broken)
    done = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, cwd=tmp_path
    )
    assert (
        done.returncode == 1 and "got: {} 2.1176470588235293E+01" in done.stdout + done.stderr
    )  # 900 / 42.5
