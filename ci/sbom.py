"""The image's SBOM, CycloneDX 1.6 JSON, read from the image as the registry serves it (a `skopeo copy ... dir:`
copy: manifest.json and each blob named by its digest), and the check that it lists what glm5.toml pins.

The generator is this module (named in the SBOM's metadata.tools): it reads the layers in order, applying their
whiteouts, and lists the Debian packages (var/lib/dpkg/status), each purl's `upstream` qualifier naming its source
package (dpkg's `Source:`, with the source version where it differs: the name scanners match Debian and Ubuntu
advisories by, as syft writes it, github.com/anchore/syft/pull/769); every Python distribution wherever it lies
(each `*.dist-info/METADATA` and `*.egg-info/PKG-INFO`, one component per folder, so one name at two versions or two
places is listed twice, each with its path in the property `glm5-serve:path`), with the SBOMs its wheel ships
(`*.dist-info/sboms/*.json`, PEP 770: peps.python.org/pep-0770) merged in as its nested components and their
dependencies; and the FlashInfer patches the build applied (the image's record /opt/glm5/PATCHES-APPLIED.json,
written by patches/apply) as flashinfer-python's pedigree. Standard library only; tests/test_sbom.py validates the
result against CycloneDX's schema (cyclonedx-python-lib).
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import re
import tarfile
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

GENERATOR = "glm5-serve ci/sbom.py"
DPKG_STATUS = "var/lib/dpkg/status"
OS_RELEASE = ("etc/os-release", "usr/lib/os-release")
PATCH_RECORD = "opt/glm5/PATCHES-APPLIED.json"
METADATA = re.compile(r"(^|/)[^/]+\.(dist-info/METADATA|egg-info/PKG-INFO)$")
EMBEDDED = re.compile(r"(^|/)[^/]+\.dist-info/sboms/[^/]+\.json$")
SPEC = "1.6"
# The fields an embedded SBOM's component keeps (CycloneDX 1.6's component, less what a merged copy cannot carry:
# an embedded document's own evidence, release notes, model cards and the like).
KEPT = (
    "type", "bom-ref", "supplier", "author", "authors", "publisher", "group", "name", "version", "description",
    "scope", "hashes", "licenses", "copyright", "cpe", "purl", "externalReferences", "pedigree", "properties",
    "tags", "components",
)  # fmt: skip
# The Python distributions glm5.toml's [image] pins, by the key that pins them.
PINNED = {"sglang": "sglang", "torch": "torch", "flashinfer-python": "flashinfer"}


class SbomError(Exception):
    pass


def wanted(path: str) -> bool:
    return path in (DPKG_STATUS, PATCH_RECORD, *OS_RELEASE) or bool(
        METADATA.search(path) or EMBEDDED.search(path)
    )


def layers(copy: Path) -> list[Path]:
    manifest = json.loads((copy / "manifest.json").read_text())
    if "layers" not in manifest:
        raise SbomError(f"{copy}/manifest.json has no layers (a manifest list?): copy one platform's image")
    return [copy / layer["digest"].split(":", 1)[1] for layer in manifest["layers"]]


def members(layer: Path) -> Iterator[tuple[str, bytes | None]]:
    """Each entry of a layer (gzip or plain tar, streamed): its path, and its bytes where wanted (None otherwise)."""
    with tarfile.open(layer, mode="r|*") as tar:
        for info in tar:
            path = info.name.removeprefix("./").rstrip("/")
            data = None
            if info.isfile() and wanted(path):
                handle = tar.extractfile(info)
                data = handle.read() if handle else None
            yield path, data


def image_files(copy: Path) -> dict[str, bytes]:
    """The wanted files as the image's root has them: later layers win, whiteouts remove."""
    found: dict[str, bytes] = {}
    for layer in layers(copy):
        added: dict[str, bytes] = {}
        for path, data in members(layer):
            parent, name = PurePosixPath(path).parent, PurePosixPath(path).name
            if name == ".wh..wh..opq":  # an opaque folder: what lower layers had under it is gone
                prefix = "" if str(parent) == "." else f"{parent}/"
                found = {p: d for p, d in found.items() if not p.startswith(prefix)}
            elif name.startswith(".wh."):
                gone = str(parent / name.removeprefix(".wh.")).removeprefix("./")
                found = {p: d for p, d in found.items() if p != gone and not p.startswith(f"{gone}/")}
            elif data is not None:
                added[path] = data
        found |= added
    return found


def os_release(files: Mapping[str, bytes]) -> dict[str, str]:
    text = next((files[p].decode() for p in OS_RELEASE if p in files), "")
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: v.strip().strip('"') for k, v in pairs}


def debian_packages(status: str, distro: Mapping[str, str]) -> list[dict[str, Any]]:
    osid = distro.get("ID", "debian")
    out = []
    for paragraph in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in paragraph.splitlines() if ": " in line and not line[0].isspace()
        )
        if not fields.get("Package") or not fields.get("Status", "").endswith(" installed"):
            continue
        name, version, arch = fields["Package"], fields["Version"], fields.get("Architecture", "all")
        purl = f"pkg:deb/{osid}/{name}@{quote(version, safe='.+~-_')}?arch={arch}"
        if distro.get("VERSION_ID"):
            purl += f"&distro={osid}-{distro['VERSION_ID']}"
        purl += f"&upstream={quote(upstream(name, version, fields.get('Source', '')), safe='.+~-_')}"
        out.append(component(name, version, purl))
    return out


def upstream(name: str, version: str, source: str) -> str:
    """The source package of a binary one from dpkg's `Source: NAME [(VERSION)]` (absent: the binary's own name),
    NAME@VERSION where the source's version differs from the binary's."""
    found = re.fullmatch(r"\s*([^\s(]+)?\s*(?:\(([^)]+)\))?\s*", source)
    src, src_version = (found.group(1), found.group(2)) if found else (None, None)
    src = src or name
    return f"{src}@{src_version}" if src_version and src_version != version else src


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def purl_name(name: str) -> str:
    """A distribution's name as its pypi purl has it: lowercased, `_` as `-`, a `.` kept (purl-spec's pypi type,
    github.com/package-url/purl-spec: `pkg:pypi/ruamel.yaml`, as packageurl-python and cyclonedx-py write it)."""
    return quote(name.lower().replace("_", "-"), safe=".-")


def python_packages(files: Mapping[str, bytes]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One component per distribution folder, sorted by name, version and path, each with the SBOMs its wheel ships
    nested; and those SBOMs' dependencies, their references made unique."""
    out = []
    dependencies: list[dict[str, Any]] = []
    for path, data in files.items():
        if METADATA.search(path):
            meta = email.parser.BytesHeaderParser().parsebytes(data)
            name, version = normalized(str(meta["Name"])), str(meta["Version"])
            folder = "/" + str(PurePosixPath(path).parent)
            purl = f"pkg:pypi/{purl_name(str(meta['Name']))}@{quote(version, safe='.+!-_')}"
            package = component(name, version, purl) | {
                "bom-ref": f"{purl}#{folder}",
                "properties": [{"name": "glm5-serve:path", "value": folder}],
            }
            for sbom_path in sorted(
                p for p in files if p.startswith(f"{folder[1:]}/sboms/") and EMBEDDED.search(p)
            ):
                dependencies += embed(package, sbom_path, json.loads(files[sbom_path]))
            out.append(package)
    return sorted(out, key=lambda c: (c["name"], c["version"], c["bom-ref"])), dependencies


def embed(package: dict[str, Any], path: str, document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A wheel's own SBOM (PEP 770) into PACKAGE: its subject and components as PACKAGE's nested components, every
    bom-ref prefixed with PACKAGE's and the file's name (unique in the merged document); its dependencies returned,
    rewritten alike. A document not in CycloneDX JSON (SPDX) is named in a property, not merged."""
    source = {"name": "glm5-serve:embedded-sbom", "value": "/" + path}
    package["properties"].append(source)
    if document.get("bomFormat") != "CycloneDX":
        source["value"] += " (not CycloneDX: not merged)"
        return []
    prefix = f"{package['bom-ref']}|{PurePosixPath(path).name}|"
    refs: dict[str, str] = {}

    def rewrite(found: Mapping[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in found.items() if k in KEPT}
        if "bom-ref" in kept:
            refs[kept["bom-ref"]] = kept["bom-ref"] = prefix + str(kept["bom-ref"])
        if "components" in kept:
            kept["components"] = [rewrite(c) for c in kept["components"]]
        return kept

    subject = document.get("metadata", {}).get("component")
    nested = []
    for found in ([subject] if subject else []) + list(document.get("components", [])):
        if found.get("bom-ref") is None or prefix + str(found["bom-ref"]) not in refs.values():
            nested.append(
                rewrite(found)
            )  # the subject listed again among the components (auditwheel's): once
    package.setdefault("components", []).extend(nested)
    out = []
    for dependency in document.get("dependencies", []):
        ref = dependency.get("ref")
        if ref in refs:
            on = [refs[d] for d in dependency.get("dependsOn", []) if d in refs]
            out.append({"ref": refs[ref], "dependsOn": on} if on else {"ref": refs[ref]})
    return out


def component(name: str, version: str, purl: str) -> dict[str, Any]:
    return {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}


def with_patches(packages: list[dict[str, Any]], record: Mapping[str, Any]) -> None:
    """flashinfer-python's pedigree: each patch the build applied, by name and hash (CycloneDX patch, unofficial)."""
    for package in packages:
        if package["name"] == "flashinfer-python":
            package["pedigree"] = {
                "patches": [
                    {"type": "unofficial", "diff": {"url": f"patches/{p['name']}"}} for p in record["patches"]
                ]
            }
            package["properties"] = [
                {"name": "glm5-serve:patch", "value": f"{p['name']} sha256:{p['sha256']}"}
                for p in record["patches"]
            ] + [{"name": "glm5-serve:patched-version", "value": str(record["flashinfer_python"])}]


def build(copy: Path, reference: str, digest: str, version: str) -> dict[str, Any]:
    """The CycloneDX document of the image copied to `copy` (a skopeo dir: copy of reference@digest)."""
    files = image_files(copy)
    distro = os_release(files)
    debs = debian_packages(files.get(DPKG_STATUS, b"").decode(), distro)
    python, dependencies = python_packages(files)
    if PATCH_RECORD in files:
        with_patches(python, json.loads(files[PATCH_RECORD]))
    name = reference.rsplit("/", 1)[-1]
    image_purl = (
        f"pkg:oci/{name}@{quote(digest, safe='')}?repository_url={quote(reference, safe='/')}&tag={version}"
    )
    return {
        "bomFormat": "CycloneDX",
        "specVersion": SPEC,
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": GENERATOR}]},
            "component": {
                "type": "container",
                "bom-ref": image_purl,
                "name": name,
                "version": version,
                "purl": image_purl,
                "hashes": [{"alg": "SHA-256", "content": digest.split(":", 1)[1]}],
            },
        },
        "components": debs + python,
        **({"dependencies": dependencies} if dependencies else {}),
    }


def problems(bom: Mapping[str, Any], image: Mapping[str, str], series: list[str]) -> list[str]:
    """What the SBOM misses of glm5.toml's [image] pins and of patches/series: one line each, naming the fix."""
    found: dict[str, dict[str, Any]] = {}
    versions: dict[str, list[str]] = {}
    for c in bom["components"]:
        if c["purl"].startswith("pkg:pypi/"):
            versions.setdefault(c["name"], []).append(c["version"])
            if c["name"] not in found or c["version"] == image.get(PINNED.get(c["name"], ""), None):
                found[c["name"]] = c
    out = []
    for name, key in PINNED.items():
        if versions.get(name) != [image[key]]:
            listed = " and ".join(versions.get(name, [])) or "not at all"
            out.append(
                f"the SBOM lists {name} {listed}, glm5.toml [image].{key} pins {image[key]}: "
                "the image is not the one glm5.toml describes (rebuild it, or fix the pin and run image/relock)"
            )
    patched = [
        p["diff"]["url"].removeprefix("patches/")
        for p in found.get("flashinfer-python", {}).get("pedigree", {}).get("patches", [])
    ]
    if patched != series:
        out.append(
            f"the SBOM's flashinfer-python carries patches {patched}, patches/series lists {series}: the image's "
            f"{PATCH_RECORD} (patches/apply's record) does not match the checkout (rebuild the image)"
        )
    if not any(c["purl"].startswith("pkg:deb/") for c in bom["components"]):
        out.append(f"the SBOM lists no Debian package: the image has no {DPKG_STATUS}")
    return out


def digest_of(path: Path) -> str:
    """sha256:HEX of a file, read in 4 MiB pieces (a layer of the real image is gigabytes)."""
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while piece := fh.read(4 * 2**20):
            sha.update(piece)
    return f"sha256:{sha.hexdigest()}"
