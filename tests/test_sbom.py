"""ci/sbom.py's document on tiny images (no registry): what a scanner matches on (Debian source packages in the purls),
every Python distribution with its path, the SBOMs wheels ship merged in (the real ones .venv's wheels carry, smg's
797 Rust crates among them), the whole validated against CycloneDX's JSON schema by cyclonedx-python-lib, and the
Python part against cyclonedx-bom's `cyclonedx-py environment` on this test venv."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from ci import sbom
from conftest import ROOT
from helpers.tiny_image import bom_of, image_files
from patches.apply import read_series

IMAGE = tomllib.loads((ROOT / "entrypoint" / "glm5.toml").read_text())["image"]
PINS = {"sglang": IMAGE["sglang"], "torch": IMAGE["torch"], "flashinfer-python": IMAGE["flashinfer"]}
SERIES = [p.name for p in read_series(ROOT / "patches" / "series") if p.package == "flashinfer"]
VENV = "opt/venv/lib/python3.12/site-packages"
# .venv's site-packages (smg==1.13.0 is pinned in ci/requirements-test.txt): the wheels' own SBOMs, as PEP 770 lays them.
SITE = Path(str(importlib.metadata.distribution("smg").locate_file("")))
SMG_SBOM = "smg-1.13.0.dist-info/sboms/smg-python.cyclonedx.json"


def dist(folder: str, name: str, version: str) -> dict[str, str]:
    return {f"{folder}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}


def validate(bom: dict[str, Any]) -> None:
    error = JsonStrictValidator(SchemaVersion.from_version(bom["specVersion"])).validate_str(json.dumps(bom))
    assert error is None, str(error)


def all_refs(components: list[dict[str, Any]]) -> list[str]:
    return [r for c in components for r in [c["bom-ref"], *all_refs(c.get("components", []))]]


def test_debian_purls_name_the_source_package() -> None:
    status = (
        "Package: libssl3t64\nStatus: install ok installed\nArchitecture: amd64\nSource: openssl\n"
        "Version: 3.0.13-0ubuntu3.5\n\n"
        "Package: libgcc-s1\nStatus: install ok installed\nArchitecture: amd64\nSource: gcc-14 (14.2.0-4ubuntu2~24.04)\n"
        "Version: 14.2.0-4ubuntu2~24.04\n\n"
        "Package: libpython3.12t64\nStatus: install ok installed\nArchitecture: amd64\nSource: python3.12 (3.12.3-1)\n"
        "Version: 3.12.3-1ubuntu0.9\n\n"
        "Package: bash\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.2.21-2ubuntu4\n\n"
    )
    purls = {
        c["name"]: c["purl"] for c in sbom.debian_packages(status, {"ID": "ubuntu", "VERSION_ID": "24.04"})
    }
    assert purls == {
        "libssl3t64": "pkg:deb/ubuntu/libssl3t64@3.0.13-0ubuntu3.5?arch=amd64&distro=ubuntu-24.04&upstream=openssl",
        "libgcc-s1": "pkg:deb/ubuntu/libgcc-s1@14.2.0-4ubuntu2~24.04?arch=amd64&distro=ubuntu-24.04&upstream=gcc-14",
        "libpython3.12t64": "pkg:deb/ubuntu/libpython3.12t64@3.12.3-1ubuntu0.9?arch=amd64&distro=ubuntu-24.04"
        "&upstream=python3.12%403.12.3-1",
        "bash": "pkg:deb/ubuntu/bash@5.2.21-2ubuntu4?arch=amd64&distro=ubuntu-24.04&upstream=bash",
    }


def test_every_python_distribution_is_listed_with_its_path(tmp_path: Path) -> None:
    files = image_files(PINS, SERIES)
    files |= dist("usr/lib/python3/dist-packages/torch-2.1.0.dist-info", "torch", "2.1.0")
    files |= dist(f"{VENV}/pip/_vendor/vendored_thing-1.0.dist-info", "vendored-thing", "1.0")
    files |= {
        "usr/lib/python3/dist-packages/legacy.egg-info/PKG-INFO": "Metadata-Version: 1.1\nName: Legacy\nVersion: 0.3\n"
    }
    bom = bom_of(tmp_path, files)
    paths = {
        (c["name"], c["version"], p["value"])
        for c in bom["components"]
        for p in c.get("properties", [])
        if p["name"] == "glm5-serve:path"
    }
    assert {
        ("torch", IMAGE["torch"], f"/{VENV}/torch-{IMAGE['torch']}.dist-info"),
        ("torch", "2.1.0", "/usr/lib/python3/dist-packages/torch-2.1.0.dist-info"),
        ("vendored-thing", "1.0", f"/{VENV}/pip/_vendor/vendored_thing-1.0.dist-info"),
        ("legacy", "0.3", "/usr/lib/python3/dist-packages/legacy.egg-info"),
    } <= paths
    refs = all_refs(bom["components"])
    assert len(refs) == len(set(refs)), "every bom-ref is unique"
    # Two torches in one image: the check names both, whichever the pin matches.
    assert any(
        f"torch {IMAGE['torch']} and 2.1.0" in p or f"torch 2.1.0 and {IMAGE['torch']}" in p
        for p in sbom.problems(bom, IMAGE, SERIES)
    )
    validate(bom)


def test_the_sbom_a_wheel_ships_is_merged_with_its_dependencies(tmp_path: Path) -> None:
    shipped = json.loads((SITE / SMG_SBOM).read_text())
    files = image_files(PINS, SERIES) | dist(f"{VENV}/smg-1.13.0.dist-info", "smg", "1.13.0")
    files[f"{VENV}/{SMG_SBOM}"] = json.dumps(shipped)
    bom = bom_of(tmp_path, files)
    (smg,) = [c for c in bom["components"] if c["name"] == "smg"]
    crates = [c for c in smg["components"] if c["purl"].startswith("pkg:cargo/")]
    assert len(crates) == len(shipped["components"]) + 1  # its crates and the wheel's own crate, smg-python
    assert {"name": "glm5-serve:embedded-sbom", "value": f"/{VENV}/{SMG_SBOM}"} in smg["properties"]
    refs = all_refs(bom["components"])
    assert len(refs) == len(set(refs))
    assert len(bom["dependencies"]) == len(shipped["dependencies"])
    assert all(d["ref"] in refs and set(d.get("dependsOn", [])) <= set(refs) for d in bom["dependencies"])
    assert sbom.problems(bom, IMAGE, SERIES) == []
    validate(bom)


def test_every_sbom_dot_venvs_wheels_ship_merges_into_a_valid_document(tmp_path: Path) -> None:
    """Each real embedded SBOM .venv holds (CycloneDX 1.4 to 1.7, from cargo-cyclonedx, auditwheel and others),
    under its distribution in the tiny image: the merged document passes CycloneDX's strict JSON schema."""
    shipped = sorted(SITE.glob("*.dist-info/sboms/*.json"))
    assert len(shipped) >= 5 and SITE / SMG_SBOM in shipped
    files = image_files(PINS, SERIES)
    for path in shipped:
        folder = path.parent.parent
        meta = (folder / "METADATA").read_text(errors="replace")
        files[f"{VENV}/{folder.name}/METADATA"] = meta
        files[f"{VENV}/{folder.name}/sboms/{path.name}"] = path.read_text()
    bom = bom_of(tmp_path, files)
    merged = [
        p
        for c in bom["components"]
        for p in c.get("properties", [])
        if p["name"] == "glm5-serve:embedded-sbom"
    ]
    assert len(merged) == len(shipped)
    validate(bom)


def test_the_schema_check_can_fail(tmp_path: Path) -> None:
    bom = bom_of(tmp_path, image_files(PINS, SERIES))
    bom["components"][0]["type"] = "not-a-type"
    with pytest.raises(AssertionError, match="not-a-type"):
        validate(bom)


def test_the_python_part_lists_every_distribution_cyclonedx_py_finds(tmp_path: Path) -> None:
    """cyclonedx-bom's `cyclonedx-py environment` (ci/requirements-test.txt pins it) on this test venv, and ci/sbom.py
    on the same site-packages laid out as an image: each distribution cyclonedx-py lists, ours lists at that version
    with an equal purl (it writes `+` as %2B, ours as is). Ours lists more (those vendored one folder deeper, as
    setuptools/_vendor's); what else differs: docs/release.md, "The SBOM next to cyclonedx-py"."""
    done = subprocess.run(
        [
            Path(sys.executable).parent / "cyclonedx-py",
            "environment",
            "--no-validate",
            "-o",
            "-",
            sys.executable,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    theirs = {
        (sbom.normalized(c["name"]), c["version"]): c["purl"] for c in json.loads(done.stdout)["components"]
    }
    site = Path(sysconfig.get_paths()["purelib"])
    files = {
        str(found.relative_to("/")): found.read_text(errors="replace")
        for found in site.rglob("*")
        if sbom.wanted(str(found.relative_to("/"))) and found.is_file()
    }
    bom = bom_of(tmp_path, files)
    ours = {
        (c["name"], c["version"]): c["purl"] for c in bom["components"] if c["purl"].startswith("pkg:pypi/")
    }
    assert len(theirs) >= 100, "this venv holds the suite's packages"
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"ci/sbom.py drops what cyclonedx-py lists: {missing}"
    differ = [
        (theirs[k], ours[k])
        for k in sorted(theirs)
        if PackageURL.from_string(theirs[k]) != PackageURL.from_string(ours[k])
    ]
    assert not differ, f"cyclonedx-py's purl, ours: {differ}"
