"""Every metric the kit's files name exists: the kit's own (monitoring/exporter.py NAMES, gateway/rotation.py NAMES),
SGLang 0.5.23's (read from the pinned package's source: `name="sglang:..."`) and smg 1.13.0's (read from its shipped
binary). A name that exists nowhere (glm5.toml once told operators to size admission from one) fails here."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from conftest import ROOT
from gateway import rotation
from monitoring import exporter

NAMED = re.compile(r"\b(glm5_[a-z0-9_]*[a-z0-9]|sglang:[a-z0-9_]*[a-z0-9]|smg_[a-z0-9_]*[a-z0-9])\b")
FILES = ("README.md", "docs", "entrypoint/glm5.toml", "k8s", "monitoring")
SUFFIXES = (
    "_bucket",
    "_sum",
    "_count",
    "_total",
)  # what prometheus-client adds to a histogram's or counter's name
NOT_METRICS = {"glm5_serve"}  # names of the kit that are not metrics (a Python-like identifier in prose)


def named() -> dict[str, set[str]]:
    """Each metric-like name in the kit's files, with the files that name it."""
    found: dict[str, set[str]] = {}
    for place in FILES:
        path = ROOT / place
        files = (
            [path]
            if path.is_file()
            else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix not in (".png", ".pyc"))
        )
        for file in files:
            for name in NAMED.findall(file.read_text(errors="replace")):
                found.setdefault(name, set()).add(str(file.relative_to(ROOT)))
    return found


def package(name: str) -> Path:
    """The installed package's folder, without importing it (sglang's import needs a GPU stack)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, f"{name} is not installed (ci/setup-test-env)"
    return Path(spec.origin).parent


def sglang_names() -> set[str]:
    source = package("sglang")
    text = "\n".join(p.read_text(errors="replace") for p in source.rglob("*.py"))
    return set(re.findall(r"[\"'](sglang:[a-z0-9_]+)[\"']", text))


def exists(name: str, kit: set[str], sglang_known: set[str], smg_binary: bytes) -> bool:
    bases = {name} | {name.removesuffix(s) for s in SUFFIXES if name.endswith(s)}
    if name.startswith("glm5_"):
        return bool(bases & kit)
    if name.startswith("sglang:"):
        return bool(bases & sglang_known) or any(b + "_total" in sglang_known for b in bases)
    return any(b.encode() in smg_binary for b in bases)


def test_every_metric_the_kit_names_exists() -> None:
    kit = set(exporter.NAMES) | set(rotation.NAMES)
    binary = b"".join(p.read_bytes() for p in package("smg").glob("*.so"))
    known = sglang_names()
    assert len(known) > 50 and binary, "the pinned packages' names were not found"
    missing = {
        name: sorted(where)
        for name, where in named().items()
        if name not in NOT_METRICS and not exists(name, kit, known, binary)
    }
    assert not missing, f"named, but no such metric: {missing}"
