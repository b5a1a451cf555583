"""Kubernetes on one GPU node whose storage offers only ReadWriteOnce (local-path, a block class): the weights claim
asked ReadWriteMany and nothing else rendered, so the Job and glm5-0 stayed Pending. k8s/data-one-node, or
the component in an overlay of the user's own (outside the checkout, with the storage class it names), renders the
claim ReadWriteOnce without a file of the kit edited. Rendered with kubectl kustomize."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ci import render
from configuration import settings
from conftest import ROOT
from helpers import k8s


def claim(objects: list[dict[str, object]]) -> dict[str, object]:
    (found,) = [
        o for o in objects if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] == "glm5-weights"
    ]  # type: ignore[index]
    return found["spec"]  # type: ignore[return-value]


def test_the_kits_data_asks_read_write_many_and_the_one_node_overlay_read_write_once() -> None:
    assert claim(k8s.objects(ROOT / "k8s" / "data"))["accessModes"] == ["ReadWriteMany"]
    one = claim(k8s.objects(ROOT / "k8s" / "data-one-node"))
    assert (
        one["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in one
    )  # the cluster's default class


def test_a_users_own_overlay_picks_the_access_mode_and_the_storage_class(tmp_path: Path) -> None:
    kit = os.path.relpath(ROOT / "k8s", tmp_path / "mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{kit}/data]\ncomponents: [{kit}/components/weights-one-node]\n"
        "patches:\n  - target: {kind: PersistentVolumeClaim, name: glm5-weights}\n"
        '    patch: \'[{"op": "add", "path": "/spec/storageClassName", "value": "local-path"}]\'\n'
    )
    spec = claim(k8s.objects(tmp_path / "mine"))
    assert spec["accessModes"] == ["ReadWriteOnce"] and spec["storageClassName"] == "local-path"


def requests(spec: dict[str, Any]) -> tuple[float, float]:
    """A pod's effective requests as the scheduler counts them, (cores, GiB): the larger of its containers' sum and
    its largest init container."""

    def each(containers: list[dict[str, Any]]) -> list[tuple[float, float]]:
        asked = [c.get("resources", {}).get("requests", {}) for c in containers]
        return [
            (render.quantity(str(r.get("cpu", "0"))), render.quantity(str(r.get("memory", "0"))))
            for r in asked
        ]

    run = each(spec["containers"])
    init = each(spec.get("initContainers", []))
    return (
        max([sum(c for c, _ in run), *(c for c, _ in init)]),
        max([sum(m for _, m in run), *(m for _, m in init)]),
    )


def test_the_one_node_path_fits_the_node_the_readme_names() -> None:
    """k8s/data-one-node then k8s/base, rendered as ci/render left them: the server pod and the weights Job (which runs
    while the pod waits in Init) together fit what a node of the README's 16 cores and 128 GiB leaves after MemTotal,
    the kubelet's reserve and eviction threshold, and the system pods (docs/reference.md: Node size). At 16 CPUs and
    128Gi the pod alone asked more than such a node has: Pending, Insufficient cpu and memory."""
    assert claim(k8s.objects(ROOT / "k8s" / "data-one-node"))["accessModes"] == ["ReadWriteOnce"]
    base = k8s.objects(ROOT / "k8s" / "base")
    (server,) = [o for o in base if o["kind"] == "StatefulSet"]
    (job,) = [o for o in base if o["kind"] == "Job"]
    pod, weights = requests(server["spec"]["template"]["spec"]), requests(job["spec"]["template"]["spec"])
    found = render.values(settings.load_config())
    needs = re.search(r"(\d+)\+ cores and (\d+) GiB of RAM", (ROOT / "README.md").read_text())
    assert needs is not None and (int(needs[1]), int(needs[2])) == (
        found["node_cpus"],
        found["node_memory_gib"],
    )
    rows = render.node_fit(found)
    free_cpu = sum(
        r[1] for r in rows[:5]
    )  # the node, less MemTotal's shortfall, the kubelet and the system pods
    free_gib = sum(r[2] for r in rows[:5])
    assert (
        15 < free_cpu + render.quantity(found["system_pods_cpu"]) < 16
    )  # allocatable: a reserve, never none
    assert 110 < free_gib + render.quantity(found["system_pods_memory"]) < 125
    assert pod[0] + weights[0] <= free_cpu, (pod, weights, free_cpu)
    assert pod[1] + weights[1] <= free_gib, (pod, weights, free_gib)
    assert (
        pod[1] >= found["gpu_count"] * found["server_host_mib_per_rank"] / 1024
    )  # the ranks' own host memory


def test_the_render_refuses_requests_the_named_node_cannot_hold() -> None:
    cfg = copy.deepcopy(settings.load_config())  # load_config() is cached: never change the kit's own
    cfg["deployment"] = cfg["deployment"] | {"cpu_request": "16", "memory_request": "128Gi"}
    with pytest.raises(
        render.RenderError, match=r"cpu_request = '16', memory_request = '128Gi'.*node_cpus = 16"
    ):
        render.values(cfg)
    cfg["deployment"] = cfg["deployment"] | {"cpu_request": "12", "memory_request": "32Gi"}
    with pytest.raises(
        render.RenderError, match=r"memory_request = '32Gi' is below the ranks' own host memory"
    ):
        render.values(cfg)
