"""Apply the patch series in this folder to an installed FlashInfer.

    patches/apply [--target SITE_PACKAGES] [--dry-run]

Without --target, patches the flashinfer package that this python imports. Each patch
is applied with GNU patch, -p1 --fuzz=0, in the site-packages folder. Exit 0 when every
patch is applied (or was already), 1 when one does not apply cleanly, 2 on bad usage.
A record of what was applied is written to flashinfer/GLM5_SERVE_PATCHES.json.
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
DIST_NAME = "flashinfer_python"


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
        if pinned is None or not files:
            raise ApplyError(
                str(path),
                "has no Pinned-Version header or no unified diff with b/ paths",
                "add them (see patches/README.md)",
            )
        patches.append(Patch(path, pinned.group(1).strip(), files))
    return patches


def default_target() -> Path:
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or spec.origin is None:
        raise ApplyError(
            sys.executable,
            "cannot import flashinfer",
            "install flashinfer-python, or pass --target SITE_PACKAGES",
        )
    return Path(spec.origin).resolve().parent.parent


def installed_version(target: Path) -> str:
    found = sorted(target.glob(f"{DIST_NAME}-*.dist-info/METADATA"))
    versions = []
    for meta in found:
        match = re.search(r"^Version:\s*(\S+)", meta.read_text(errors="replace"), re.M)
        versions.append(match.group(1) if match else "?")
    return ", ".join(versions) if versions else "unknown (no flashinfer_python dist-info)"


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
            f"found flashinfer-python {version}.\n    {detail}\n",
            f"pin flashinfer-python to the version in Pinned-Version, or refresh {patch.path} against the found "
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
    record = {
        "flashinfer_python": version,
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
    path = target / "flashinfer" / RECORD_NAME
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="patches/apply", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, help="site-packages folder holding flashinfer/")
    parser.add_argument("--series", type=Path, default=HERE / "series", help="the series file")
    parser.add_argument("--dry-run", action="store_true", help="report, change nothing")
    args = parser.parse_args(argv)
    try:
        if shutil.which("patch") is None:
            raise ApplyError("patch", "GNU patch is not on PATH", "install it (apt-get install patch)")
        patches = read_series(args.series)
        target = (args.target or default_target()).resolve()
        if not (target / "flashinfer" / "__init__.py").is_file():
            raise ApplyError(
                f"--target {target}",
                "no flashinfer/ package there",
                "pass the site-packages folder that holds flashinfer/",
            )
        version = installed_version(target)
        print(f"patches/apply: target {target} (flashinfer-python {version})")
        for patch in patches:
            print(f"patches/apply: {patch.name}: {apply_one(target, patch, version, args.dry_run)}")
        if not args.dry_run:
            record = write_record(target, patches, version)
            print(f"patches/apply: recorded {len(patches)} patch(es) in {record}")
    except ApplyError as err:
        return LOG.problems([err], "patch problem; nothing more was applied")
    return OK


if __name__ == "__main__":
    sys.exit(main())
