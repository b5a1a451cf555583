"""Least privilege: the scanner's skips (checkov itself runs in ci/lint), the compose services' own rules, the pods' security settings and NetworkPolicies, and the entrypoint with the real supervisord and the server
double under a read-only root (bubblewrap) with only the paths docker-compose.yml makes writable."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from configuration import settings
from conftest import ROOT
from helpers import k8s
from helpers.container import Container, free_port, start, stop_inside
from helpers.sandbox import NEEDS_BWRAP, sandbox

BIN = Path(sys.executable).parent

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


OVERLAYS = k8s.OVERLAYS
CONFIG = settings.load_config()
DEPLOYMENT = CONFIG["deployment"]


def kustomized(overlay: str) -> str:
    return k8s.kustomized(ROOT / overlay)


def objects(overlay: str) -> list[dict[str, Any]]:
    return k8s.objects(ROOT / overlay)


def checkov(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(CHECKOV), *args, "--skip-download", "--output", "json"],
        capture_output=True,
        text=True,
    )
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    return {
        "failed": [c for r in reports for c in r["results"]["failed_checks"]],
        "skipped": [c for r in reports for c in r["results"]["skipped_checks"]],
        "passed": sum(len(r["results"]["passed_checks"]) for r in reports),
        "rc": done.returncode,
    }


def rendered_folder(
    tmp: Path, overlays: tuple[str, ...] = ("k8s/data", "k8s/data-one-node", *OVERLAYS)
) -> Path:
    folder = tmp / "k8s"
    folder.mkdir()
    for overlay in overlays:
        (folder / (overlay.replace("/", "-") + ".yaml")).write_text(kustomized(overlay))
    return folder


# --- the scanner ----------------------------------------------------------------------------------------------------


# The scanner findings the kit judged and skipped, each with its reason where it is skipped.
SKIPPABLE = {"CKV_K8S_11", "CKV_K8S_15", "CKV_K8S_35", "CKV_K8S_38", "CKV_K8S_40", "CKV_K8S_43"}


def unjudged_skips(docs: list[dict[str, Any]]) -> list[str]:
    """Each `checkov.io/skipN: CHECK=REASON` annotation whose check the kit did not judge or whose reason is short."""
    found = []
    for d in docs:
        for key, value in d["metadata"].get("annotations", {}).items():
            check, _, reason = value.partition("=")
            if key.startswith("checkov.io/skip") and (check not in SKIPPABLE or len(reason) <= 40):
                found.append(f"{check} on {d['kind']}/{d['metadata']['name']}: {reason!r}")
    return found


@pytest.mark.parametrize("overlay", ["k8s/data", "k8s/data-one-node", *OVERLAYS])
def test_every_scanner_skip_is_one_judged_with_its_reason(overlay: str) -> None:
    assert unjudged_skips(objects(overlay)) == []
    dockerfile = re.findall(r"^# checkov:skip=(\S+): (.*)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert [c for c, _ in dockerfile] == ["CKV_DOCKER_7"] and all(len(r) > 40 for _, r in dockerfile)


def test_an_unjudged_or_unreasoned_skip_is_named() -> None:
    (statefulset,) = [d for d in objects("k8s/base") if d["kind"] == "StatefulSet"]
    annotations = statefulset["metadata"]["annotations"]
    annotations["checkov.io/skip9"] = (
        "CKV_K8S_20=A long enough reason that names no judged check at all, though."
    )
    annotations["checkov.io/skip1"] = "CKV_K8S_11=short"
    assert unjudged_skips([statefulset]) == [
        "CKV_K8S_11 on StatefulSet/glm5: 'short'",
        "CKV_K8S_20 on StatefulSet/glm5: 'A long enough reason that names no judged check at all, though.'",
    ]


# --- the pods --------------------------------------------------------------------------------------------------------


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("StatefulSet", "Deployment", "Job")
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.boots
def test_every_pod_meets_the_restricted_standard_with_read_only_roots_and_memory_limits(overlay: str) -> None:
    docs = objects(overlay)
    assert {d["metadata"].get("namespace") for d in docs} == {DEPLOYMENT["namespace"]}
    (ns,) = [d for d in objects("k8s/data") if d["kind"] == "Namespace"]  # applied first, kept on uninstall
    assert ns["metadata"]["name"] == DEPLOYMENT["namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for name, spec in pod_specs(docs).items():
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["automountServiceAccountToken"] is False, name  # the gateway lists pods through DNS
        for c in spec.get("initContainers", []) + spec["containers"]:
            ctx = c["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False, (
                name,
                c["name"],
            )
            assert ctx["capabilities"] == {"drop": ["ALL"]}, (name, c["name"])
            assert "memory" in c["resources"]["limits"] and "cpu" not in c["resources"]["limits"], (
                name,
                c["name"],
            )


def test_the_server_memory_limit_holds_its_request_and_shared_memory() -> None:
    def gib(q: str) -> int:
        assert q.endswith("Gi"), q
        return int(q[:-2])

    assert gib(DEPLOYMENT["memory_limit"]) >= gib(DEPLOYMENT["memory_request"]) + gib(
        DEPLOYMENT["shm_size_limit"]
    )


def test_the_kustomizations_name_the_configured_namespace() -> None:
    for overlay in ("k8s/data", "k8s/data-one-node", *OVERLAYS):
        assert (
            yaml.safe_load((ROOT / overlay / "kustomization.yaml").read_text())["namespace"]
            == DEPLOYMENT["namespace"]
        )


# --- the network ----------------------------------------------------------------------------------------------------


def policies(overlay: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"] for d in objects(overlay) if d["kind"] == "NetworkPolicy"}


def allowed_ports(spec: dict[str, Any], source: dict[str, Any]) -> set[str]:
    """Ports (as named) a policy's ingress rules open to a peer: a pod's labels or a namespace."""
    ports: set[str] = set()
    for rule in spec.get("ingress", []):
        peers = rule.get("from")
        matched = peers is None or any(
            ("podSelector" in p and p["podSelector"]["matchLabels"].items() <= source.get("pod", {}).items())
            or (
                "namespaceSelector" in p
                and p["namespaceSelector"]["matchLabels"].items() <= source.get("ns", {}).items()
            )
            for p in peers
        )
        if matched:
            ports.update(str(p["port"]) for p in rule.get("ports", []))
    return ports


@pytest.mark.boots
def test_network_policies_let_in_only_clients_the_gateway_and_prometheus() -> None:
    p = policies("k8s/overlays/gateway-monitoring")
    deny = p["glm5-default-deny"]
    assert deny["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "glm5-serve"}
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny and "egress" not in deny
    client = {"pod": {DEPLOYMENT["client_label"]: "true"}}
    gateway = {"pod": {"app.kubernetes.io/name": "glm5-serve", "app.kubernetes.io/component": "gateway"}}
    prometheus = {"ns": {"kubernetes.io/metadata.name": DEPLOYMENT["monitoring_namespace"]}}
    stranger = {"pod": {"app": "other"}, "ns": {"kubernetes.io/metadata.name": "default"}}
    server = p["glm5-server"]
    # where a gateway runs, clients reach it alone (issue 50); the one-replica base lets them call the server
    assert allowed_ports(server, client) == set()
    assert allowed_ports(policies("k8s/base")["glm5-server"], client) == {"http"}
    assert allowed_ports(server, gateway) == {"http", "exporter"}  # the rotation asks the exporter's /ready
    assert allowed_ports(server, prometheus) == {"http", "exporter"}
    assert allowed_ports(server, stranger) == set()
    gw = p["glm5-gateway"]
    assert allowed_ports(gw, client) == {"http", "probes", "rotation"}
    assert allowed_ports(gw, prometheus) == {"metrics", "rotation", "probes"}
    assert allowed_ports(gw, stranger) == {"probes", "rotation"}  # the kubelet's probes (the kit's: rotation)
    # Egress: the server none (only the default deny selects it for Egress), the weights Job DNS and HTTPS.
    egress_of_server = [
        n
        for n, s in p.items()
        if "Egress" in s["policyTypes"]
        and s["podSelector"]["matchLabels"].get("app.kubernetes.io/component") == "server"
    ]
    assert egress_of_server == []
    weights = p["glm5-weights"]["egress"]
    assert sorted(port["port"] for rule in weights for port in rule["ports"]) == [53, 53, 443]


def test_the_server_runs_offline() -> None:
    env = {e["name"]: e.get("value") for e in CONFIG["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"


# --- compose ----------------------------------------------------------------------------------------------------------


def services() -> dict[str, dict[str, Any]]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"])


@pytest.mark.parametrize("name", ["glm5", "download", "gateway", "prometheus", "grafana"])
def test_every_compose_service_drops_capabilities_and_runs_read_only(name: str) -> None:
    s = services()[name]
    assert (
        s["read_only"] is True
        and s["cap_drop"] == ["ALL"]
        and s["security_opt"] == ["no-new-privileges:true"]
    )
    assert "privileged" not in s and "cap_add" not in s
    bind = "GLM5_MONITORING_BIND" if name in ("prometheus", "grafana") else "GLM5_BIND"
    for port in s.get("ports", []):
        owner = "GLM5_EXPORTER_BIND" if f":{DEPLOYMENT['exporter_port']}:" in port else bind
        assert port.startswith(f"${{{owner}:-127.0.0.1}}:"), port


def writable(service: dict[str, Any]) -> list[str]:
    """The container paths a compose service can write: its tmpfs mounts and its volumes and binds not read-only."""
    paths = [t.split(":")[0] for t in service.get("tmpfs", [])]
    for volume in service.get("volumes", []):
        if isinstance(
            volume, dict
        ):  # the long syntax: a named volume (type volume) or a host folder (type bind)
            if not volume.get("read_only"):
                paths.append(volume["target"])
            continue
        source, target, *mode = volume.split(":")
        if not source.startswith((".", "/", "$")) and mode != ["ro"]:
            paths.append(target)
    return paths


def test_the_server_service_writes_only_where_the_pod_does() -> None:
    pod = next(d for d in objects("k8s/base") if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    mounts = {m["mountPath"] for m in server["volumeMounts"] if not m.get("readOnly")}
    assert set(writable(services()["glm5"])) | {"/dev/shm"} == mounts


def test_only_the_download_service_writes_the_weights() -> None:
    """The serving container could rewrite or delete the 410 GB checkpoint: the weights were a read-write bind."""
    model_dir = DEPLOYMENT["model_dir"]
    assert [name for name, s in services().items() if model_dir in writable(s)] == ["download"]
    assert services()["download"]["profiles"] == ["download"]  # `docker compose run --rm download` only


def compose_config(*args: str, **env: str) -> dict[str, Any]:
    """The compose file as the real compose reads it (docker-compose config), under these host settings."""
    done = subprocess.run(
        [str(BIN / "docker-compose"), "-f", "docker-compose.yml", *args, "config", "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith(("GLM5_", "GF_"))} | env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout)["services"])


def test_the_exporter_stays_on_loopback_when_the_api_is_published() -> None:
    """The exporter (/metrics, /ready: failure reasons, capacity) has no key: it was published on GLM5_BIND, so a
    multi-host setup's GLM5_BIND=0.0.0.0 opened it to the network. GLM5_EXPORTER_BIND alone publishes it."""
    published = {p["target"]: p["host_ip"] for p in compose_config(GLM5_BIND="0.0.0.0")["glm5"]["ports"]}
    assert published == {DEPLOYMENT["port"]: "0.0.0.0", DEPLOYMENT["exporter_port"]: "127.0.0.1"}
    published = {
        p["target"]: p["host_ip"] for p in compose_config(GLM5_EXPORTER_BIND="10.0.0.11")["glm5"]["ports"]
    }
    assert published[DEPLOYMENT["exporter_port"]] == "10.0.0.11"


def test_grafana_has_no_login_for_admin_admin_to_open() -> None:
    """Grafana's admin/admin opened the published Grafana: GF_SECURITY_ADMIN_PASSWORD set in .env or the shell never
    reached the service (and Grafana reads it only when its database is first made). No login form, no basic auth:
    anonymous viewers only (Grafana's [auth] disable_login_form, [auth.basic] enabled)."""
    grafana = compose_config("--profile", "monitoring", GF_SECURITY_ADMIN_PASSWORD="s3cret")["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_DISABLE_LOGIN_FORM"] == "true" and env["GF_AUTH_BASIC_ENABLED"] == "false"
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def bwrap_for(tmp: Path, service: dict[str, Any], root: Path) -> tuple[list[str], dict[str, str]]:
    """bubblewrap with a read-only root and only the service's writable paths writable, each aimed at a folder of the
    test through the setting that names it; a path the test cannot aim fails it."""
    aims = {
        DEPLOYMENT["state_dir"]: "GLM5_STATE_DIR",
        DEPLOYMENT["log_dir"]: "GLM5_LOG_DIR",
        DEPLOYMENT["cache_dir"]: "GLM5_CACHE_DIR",
        "/home/glm5": "HOME",
    }
    binds: list[tuple[str, Path]] = []
    # Each setting at the container's own path, on the read-only root, unless compose makes that path writable.
    env: dict[str, str] = {setting: path for path, setting in aims.items()}
    for path in writable(service):
        if path == "/tmp":
            continue  # the tmpfs above
        assert path in aims, f"{path}: writable in compose; teach this test which setting aims it"
        folder = tmp / "rw" / path.strip("/").replace("/", "-")
        folder.mkdir(parents=True)
        binds.append(("rw", folder))
        env[aims[path]] = str(folder)
    return list(sandbox(root, *binds)), env


@NEEDS_BWRAP
@pytest.mark.boots
def test_the_entrypoint_serves_under_a_read_only_root_with_only_the_compose_writable_paths(
    tmp_path: Path, containers: list[Container]
) -> None:
    wrapper, env = bwrap_for(tmp_path, services()["glm5"], ROOT)
    exporter_port = free_port()
    c = start(tmp_path, wrapper=tuple(wrapper), GLM5_EXPORTER_PORT=str(exporter_port), **env)
    containers.append(c)
    c.wait_healthy(timeout=90)
    with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics", timeout=10) as r:
        assert 'glm5_start_phase{phase="ready"} 1.0' in r.read().decode()
    written = {p.name for p in (tmp_path / "rw").iterdir() if any(p.iterdir())}
    assert {"run-glm5", "var-log-glm5", "cache"} <= written  # the cache: the build's verification record
    assert stop_inside(c) == 0
    assert "Read-only file system" not in c.entrypoint_output.read_text()


@NEEDS_BWRAP
def test_the_read_only_root_is_enforced_a_log_folder_outside_the_writable_paths_stops_the_start(
    tmp_path: Path, containers: list[Container]
) -> None:
    wrapper, env = bwrap_for(tmp_path, services()["glm5"], ROOT)
    # on the read-only root; the tests run as root, who could create it outside
    blocked = ROOT / "not-writable-log"
    c = start(tmp_path, wrapper=tuple(wrapper), **(env | {"GLM5_LOG_DIR": str(blocked)}))
    containers.append(c)
    assert c.target.proc.wait(timeout=60) == 3  # type: ignore[union-attr]
    assert f"GLM5_LOG_DIR={blocked}: cannot create it or write to it" in c.entrypoint_output.read_text()
    assert not blocked.exists()


@NEEDS_BWRAP
@pytest.mark.boots
def test_the_gateway_runs_under_a_read_only_root_with_only_tmp_writable(tmp_path: Path) -> None:
    assert writable(services()["gateway"]) == ["/tmp"]
    from helpers.gateway import Gateway

    # the discovery file, as compose mounts it :ro
    # the rotation in the sandbox's own /tmp, as in the image (glm5.toml [gateway].rotation_file)
    rotation = Path(settings.load_config()["gateway"]["rotation_file"])
    gw = Gateway(tmp_path, {}, wrapper=sandbox(ROOT, ("ro", tmp_path)), rotation=rotation)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert gw.proc.poll() is None, gw.output.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{gw.metrics}/metrics", timeout=5) as r:
                    assert b"smg_" in r.read()
                    break
            except OSError:
                assert time.monotonic() < deadline, gw.output.read_text()[-3000:]
                time.sleep(0.5)
    finally:
        gw.stop()
    assert "Read-only file system" not in gw.output.read_text()


@NEEDS_BWRAP
@pytest.mark.boots
def test_prometheus_runs_under_a_read_only_root_with_only_its_data_volume_writable(tmp_path: Path) -> None:
    """Debian's prometheus (the profile runs the official image: the same program, another build)."""
    assert writable(services()["prometheus"]) == ["/prometheus"]
    from helpers.prometheus import Prometheus

    (tmp_path / "data").mkdir()
    prom = Prometheus(
        tmp_path,
        {
            "glm5": "127.0.0.1:1",
            "glm5-exporter": "127.0.0.1:1",
            "glm5-gateway": "127.0.0.1:1",
            "glm5-rotation": "127.0.0.1:1",
        },
        wrapper=sandbox(ROOT, ("ro", tmp_path / "prometheus.yml"), ("rw", tmp_path / "data")),
    )
    try:
        prom.wait_ready()
        assert {g["name"] for g in prom.api("rules")["groups"]} == {
            "glm5-start",
            "glm5-serving",
            "glm5-gateway",
        }
        # it writes its database where the volume is, and nowhere else
        assert any((tmp_path / "data").iterdir())
    finally:
        prom.stop()


@pytest.mark.boots
def test_the_writable_root_component_opens_the_server_container_alone(tmp_path: Path) -> None:
    """The way out of a toolkit hook that writes into a read-only root: added to the base, the server container's
    root is writable, with its reasoned scanner skip, and nothing else changes."""
    copy = tmp_path / "k8s"
    shutil.copytree(ROOT / "k8s", copy)
    kustomization = copy / "base" / "kustomization.yaml"
    kustomization.write_text(
        kustomization.read_text().replace("components:\n", "components:\n  - ../components/writable-root\n")
    )
    opened = [d for d in yaml.safe_load_all(k8s.kustomized(copy / "base")) if d]
    shut = objects("k8s/base")
    (statefulset,) = [d for d in opened if d["kind"] == "StatefulSet"]
    pod = statefulset["spec"]["template"]["spec"]
    roots = {
        c["name"]: c["securityContext"]["readOnlyRootFilesystem"]
        for c in pod["initContainers"] + pod["containers"]
    }
    assert roots == {"weights": True, "glm5": False}
    strip = [d for d in opened if d["kind"] != "StatefulSet"]
    assert strip == [d for d in shut if d["kind"] != "StatefulSet"]  # every other object as it was
    folder = tmp_path / "rendered"
    folder.mkdir()
    (folder / "base.yaml").write_text(yaml.safe_dump_all(opened))
    found = checkov("-d", str(folder), "--framework", "kubernetes")
    assert found["failed"] == [] and found["rc"] == 0, [
        (c["check_id"], c["resource"]) for c in found["failed"]
    ]
    (skip,) = [c for c in found["skipped"] if c["check_id"] == "CKV_K8S_22"]
    assert "toolkit" in skip["check_result"]["suppress_comment"]
