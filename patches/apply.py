"""Apply the patch series in this folder to the installed packages it names.

    patches/apply [--target SITE_PACKAGES] [--package NAME ...] [--dry-run]

Each patch names its distribution by the first word of its Pinned-Version header
(flashinfer-python, sglang) and its package by the folder of its `+++ b/PACKAGE/...`
paths. Without --target, each package is patched where this python imports it from;
with it, each must be in that site-packages folder. Every package the series names is
patched, and one that is missing is an error naming it; --package NAME (again for more)
patches those packages alone. Each patch is applied with GNU patch, -p1 --fuzz=0, in the
site-packages folder, in the series' order. Exit 0 when every patch is applied (or was
already), 1 when one does not apply cleanly or a package is missing, 2 on bad usage.
A record of what was applied to each package is written to PACKAGE/GLM5_SERVE_PATCHES.json
(flashinfer/GLM5_SERVE_PATCHES.json, sglang/GLM5_SERVE_PATCHES.json).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from common.report import FAILED, OK, Log, Problem

HERE = Path(__file__).resolve().parent
LOG = Log("patches/apply")
RECORD_NAME = "GLM5_SERVE_PATCHES.json"


class ApplyError(Problem):
    """A failure that names the file (or option) and the fix."""

    def __init__(self, where: str, message: str, fix: str = "") -> None:
        super().__init__(where, message, fix, FAILED)


@dataclass(frozen=True)
class Patch:
    path: Path
    pinned: str
    files: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def dist(self) -> str:
        """The distribution it patches: Pinned-Version's first word (flashinfer-python)."""
        return self.pinned.split()[0]

    @property
    def package(self) -> str:
        """The import package it patches: the folder of its files (flashinfer)."""
        return self.files[0].split("/", 1)[0]


def record_key(dist: str) -> str:
    """The record's version key: the distribution as its dist-info folder spells it (flashinfer_python)."""
    return re.sub(r"[-_.]+", "_", dist).lower()


def read_series(series: Path) -> list[Patch]:
    if not series.is_file():
        raise ApplyError(str(series), "series file not found", "restore patches/series")
    patches = []
    for line in series.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        path = series.parent / line
        if not path.is_file():
            raise ApplyError(
                str(series),
                f"lists {line}, which is not in {series.parent}",
                "add the patch or remove the line",
            )
        text = path.read_text()
        pinned = re.search(r"^Pinned-Version:\s*(.+)$", text, re.M)
        files = tuple(re.findall(r"^\+\+\+ b/(\S+)", text, re.M))
        if pinned is None or not pinned.group(1).split() or not files:
            raise ApplyError(
                str(path),
                "has no Pinned-Version header or no unified diff with b/ paths",
                "add them (see patches/README.md)",
            )
        packages = sorted({f.split("/", 1)[0] for f in files})
        if len(packages) > 1 or "/" not in files[0]:
            raise ApplyError(
                str(path),
                f"patches {', '.join(files)}: a patch must change files of one package, under b/PACKAGE/",
                "split it, one patch per package",
            )
        patches.append(Patch(path, pinned.group(1).strip(), files))
    return patches


def packages_of(patches: list[Patch]) -> dict[str, list[Patch]]:
    """The packages the series names, in the order they first appear, each with its patches in series order."""
    out: dict[str, list[Patch]] = {}
    for patch in patches:
        out.setdefault(patch.package, []).append(patch)
    return out


def locate(package: str, patches: list[Patch], target: Path | None) -> Path:
    """The site-packages folder holding `package`: --target's, or the one this python imports it from."""
    names = ", ".join(p.name for p in patches)
    dist = patches[0].dist
    if target is None:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise ApplyError(
                sys.executable,
                f"cannot import {package}, which patches/series patches ({names})",
                f"install {dist}, or pass --target SITE_PACKAGES, or --package NAME for the others alone",
            )
        return Path(spec.origin).resolve().parent.parent
    if not (target / package / "__init__.py").is_file():
        raise ApplyError(
            f"--target {target}",
            f"no {package}/ package there, which patches/series patches ({names})",
            f"pass the site-packages folder that holds {package}/, or --package NAME for those it holds",
        )
    return target


def installed_version(target: Path, dist: str) -> str:
    key = record_key(dist)
    versions = []
    for meta in sorted(target.glob("*.dist-info/METADATA")):
        text = meta.read_text(errors="replace")
        name = re.search(r"^Name:\s*(\S+)", text, re.M)
        if name is None or record_key(name.group(1)) != key:
            continue
        match = re.search(r"^Version:\s*(\S+)", text, re.M)
        versions.append(match.group(1) if match else "?")
    return ", ".join(versions) if versions else f"unknown (no {key} dist-info)"


def run_patch(target: Path, patch: Patch, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        "patch",
        "-p1",
        "--fuzz=0",
        "--no-backup-if-mismatch",
        "-d",
        str(target),
        "-i",
        str(patch.path),
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def apply_one(target: Path, patch: Patch, version: str, dry_run: bool) -> str:
    if run_patch(target, patch, "--reverse", "--force", "--dry-run").returncode == 0:
        return "already applied"
    check = run_patch(target, patch, "--forward", "--batch", "--dry-run")
    if check.returncode != 0:
        detail = (check.stdout + check.stderr).strip().replace("\n", "\n    ")
        raise ApplyError(
            patch.name,
            f"does not apply cleanly to {', '.join(patch.files)} in {target}: the patch is pinned to {patch.pinned}, "
            f"found {patch.dist} {version}.\n    {detail}\n",
            f"pin {patch.dist} to the version in Pinned-Version, or refresh {patch.path} against the found "
            "version and re-run the tests",
        )
    if dry_run:
        return "would apply" + offset_note(check.stdout)
    done = run_patch(target, patch, "--forward", "--batch")
    if done.returncode != 0:
        raise ApplyError(
            patch.name,
            f"patch failed after a clean dry run:\n{done.stdout}{done.stderr}",
            "report it: the tree changed under the patch",
        )
    return "applied" + offset_note(done.stdout)


def offset_note(patch_output: str) -> str:
    offsets = re.findall(r"Hunk #\d+ succeeded at \d+ \(offset -?\d+ lines?\)", patch_output)
    return f" ({'; '.join(offsets)})" if offsets else ""


def write_record(target: Path, patches: list[Patch], version: str) -> Path:
    """PACKAGE/GLM5_SERVE_PATCHES.json for one package's patches: {"<dist key>": version, "patches": [...]}."""
    record = {
        record_key(patches[0].dist): version,
        "patches": [
            {
                "name": p.name,
                "sha256": sha256(p.path),
                "pinned": p.pinned,
                "files": {f: sha256(target / f) for f in p.files},
            }
            for p in patches
        ],
    }
    path = target / patches[0].package / RECORD_NAME
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="patches/apply", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, help="site-packages folder holding the packages")
    parser.add_argument(
        "--package",
        action="append",
        metavar="NAME",
        help="patch only this package's patches (again for more); default: every package the series names",
    )
    parser.add_argument("--series", type=Path, default=HERE / "series", help="the series file")
    parser.add_argument("--dry-run", action="store_true", help="report, change nothing")
    args = parser.parse_args(argv)
    try:
        if shutil.which("patch") is None:
            raise ApplyError("patch", "GNU patch is not on PATH", "install it (apt-get install patch)")
        series = packages_of(read_series(args.series))
        unknown = sorted(set(args.package or ()) - set(series))
        if unknown:
            parser.error(
                f"--package {', '.join(unknown)}: {args.series} patches no such package "
                f"(it patches {', '.join(series)})"
            )
        chosen = {name: series[name] for name in series if not args.package or name in args.package}
        target = args.target.resolve() if args.target else None
        sites, missing = {}, []
        for name, patches in chosen.items():
            try:
                sites[name] = locate(name, patches, target)
            except ApplyError as err:
                missing.append(err)
        if missing:
            return LOG.problems(missing, "package(s) of the series not found; nothing was applied")
        done = []
        for name, patches in chosen.items():
            site = sites[name]
            version = installed_version(site, patches[0].dist)
            print(f"patches/apply: target {site} ({patches[0].dist} {version})")
            for patch in patches:
                print(f"patches/apply: {patch.name}: {apply_one(site, patch, version, args.dry_run)}")
            done.append((site, patches, version))
        if not args.dry_run:
            for site, patches, version in done:
                record = write_record(site, patches, version)
                print(f"patches/apply: recorded {len(patches)} patch(es) in {record}")
    except ApplyError as err:
        return LOG.problems([err], "patch problem; nothing more was applied")
    return OK


if __name__ == "__main__":
    sys.exit(main())
