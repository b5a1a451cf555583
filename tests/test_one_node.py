"""Kubernetes on one GPU node whose storage offers only ReadWriteOnce (local-path, a block class): the weights claim
asked ReadWriteMany and nothing else rendered, so the Job and glm5-0 stayed Pending. k8s/data-one-node, or
the component in an overlay of the user's own (outside the checkout, with the storage class it names), renders the
claim ReadWriteOnce without a file of the kit edited. Rendered with kubectl kustomize."""

from __future__ import annotations

import os
from pathlib import Path

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
