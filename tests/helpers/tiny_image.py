"""A tiny OCI image layout (a few KB) laid out as the kit's image records itself: a dpkg status, the pinned Python
distributions' METADATA under /opt/venv, and patches/apply's record. For ci/publish's test, no buildah needed."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ci import sbom


def blob(root: Path, data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / "sha256" / digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def layer_tar(files: Mapping[str, str]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path, text in sorted(files.items()):
            info = tarfile.TarInfo(path)
            data = text.encode()
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def image_files(pins: Mapping[str, str], patches: list[str]) -> dict[str, str]:
    files = {
        "etc/os-release": 'ID=ubuntu\nVERSION_ID="24.04"\n',
        "var/lib/dpkg/status": "".join(
            f"Package: {n}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {v}\n\n"
            for n, v in (("bash", "5.2.21-2ubuntu4"), ("python3.12", "3.12.3-1ubuntu0.9"))
        ),
        "opt/glm5/PATCHES-APPLIED.json": json.dumps(
            {
                "flashinfer_python": pins["flashinfer-python"],
                "patches": [{"name": p, "sha256": "0" * 64} for p in patches],
            }
        ),
    }
    for name, version in pins.items():
        folder = f"opt/venv/lib/python3.12/site-packages/{name.replace('-', '_')}-{version}.dist-info"
        files[f"{folder}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    return files


def oci_layout(root: Path, tag: str, files: Mapping[str, str], label: str = "") -> str:
    """An OCI layout at ROOT with one image, tagged TAG, of one gzip layer holding FILES: its skopeo reference."""
    raw = layer_tar(files)
    layer = blob(root, gzip.compress(raw, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {"test": label}},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
    }
    config_blob = blob(root, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_blob,
        "layers": [layer],
    }
    entry = blob(root, json.dumps(manifest).encode(), manifest["mediaType"])
    entry["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    (root / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return f"oci:{root}:{tag}"


def bom_of(tmp_path: Path, files: dict[str, str]) -> dict[str, Any]:
    """The SBOM (ci/sbom.py) of a layout's image, read through a dir:-like copy (manifest.json and blobs by hex
    digest), as ci/publish reads the copy it pulled."""
    layout = tmp_path / "layout"
    oci_layout(layout, "t", files)
    index = json.loads((layout / "index.json").read_text())
    copy = tmp_path / "copy"
    copy.mkdir()
    for found in (layout / "blobs" / "sha256").iterdir():
        shutil.copy(found, copy / found.name)
    shutil.copy(copy / index["manifests"][0]["digest"].split(":")[1], copy / "manifest.json")
    return sbom.build(copy, "127.0.0.1:5000/glm5-serve", "sha256:" + "a" * 64, "0.1.0")
