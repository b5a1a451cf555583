"""The release's checks and notes, from the one source of the version and CHANGELOG.md.

    ci/release check vX.Y.Z    the tag is glm5.toml [deployment].image's tag (the version), CHANGELOG.md has its
                               section, whose Versions line matches glm5.toml [image]; exit 1 naming each problem
    ci/release notes vX.Y.Z    print that section (the release notes), with `Image:` set by --digest when given

Needs the system python3 alone.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = "CHANGELOG.md"


def load(root: Path) -> tuple[dict[str, Any], str]:
    with (root / "entrypoint" / "glm5.toml").open("rb") as fh:
        cfg = tomllib.load(fh)
    return cfg, (root / CHANGELOG).read_text()


def version(cfg: Mapping[str, Any]) -> str:
    return str(cfg["deployment"]["image"].split("@", 1)[0].rsplit(":", 1)[-1])


def section(changelog: str, ver: str) -> str | None:
    match = re.search(rf"^## \[{re.escape(ver)}\][^\n]*\n(.*?)(?=^## \[|\Z)", changelog, re.M | re.S)
    return match.group(1).strip() + "\n" if match else None


def versions_line(image: Mapping[str, Any]) -> str:
    return (
        f"Versions: SGLang {image['sglang']}, FlashInfer {image['flashinfer']} (patched: patches/series), "
        f"torch {image['torch']}, smg {image['smg']}"
    )


def problems(tag: str, cfg: Mapping[str, Any], changelog: str) -> list[str]:
    ver = version(cfg)
    found = []
    if tag != f"v{ver}":
        found.append(
            f"the tag {tag} is not v{ver}, entrypoint/glm5.toml [deployment].image's tag (the version): set that "
            "tag there, run ci/render, commit, then tag"
        )
    body = section(changelog, tag.removeprefix("v"))
    if body is None:
        found.append(
            f"{CHANGELOG} has no section `## [{tag.removeprefix('v')}]`: write what the version changed"
        )
    elif versions_line(cfg["image"]) not in body:
        found.append(
            f"{CHANGELOG} [{tag.removeprefix('v')}]: its Versions line is not `{versions_line(cfg['image'])}` "
            "(glm5.toml [image]): write that line"
        )
    return found


def notes(tag: str, changelog: str, digest: str | None) -> str:
    body = section(changelog, tag.removeprefix("v")) or ""
    if digest:
        body = re.sub(r"^Image: .*$", f"Image: {digest}", body, count=1, flags=re.M)
    return body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ci/release", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["check", "notes"])
    parser.add_argument("tag", help="the release tag, vX.Y.Z")
    parser.add_argument("--digest", help="notes: NAME@sha256:... for the Image line")
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    cfg, changelog = load(args.root)
    if args.action == "check":
        found = problems(args.tag, cfg, changelog)
        for line in found:
            print(f"ci/release: {line}", file=sys.stderr)
        return 1 if found else 0
    sys.stdout.write(notes(args.tag, changelog, args.digest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
