"""Kubernetes objects as `kubectl apply -k` would apply them, rendered offline with `kubectl kustomize`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from conftest import ROOT

# Every folder `kubectl apply -k` is given, the overlays found on disk: a new one is scanned and checked unasked.
OVERLAYS = (
    "k8s/base",
    *sorted(f"k8s/overlays/{p.name}" for p in (ROOT / "k8s" / "overlays").iterdir() if p.is_dir()),
)


def kustomized(folder: Path) -> str:
    done = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def objects(folder: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(kustomized(folder)) if d]
