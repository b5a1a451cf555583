"""The list of FlashInfer modules the image prebuilds (kernels/sm120.toml), and what FlashInfer makes of each.

Stdlib only at import: FlashInfer is imported by `spec()` alone, after the caller has set the environment it reads
at import time (FLASHINFER_CUDA_ARCH_LIST, FLASHINFER_WORKSPACE_BASE, FLASHINFER_DISABLE_JIT).
"""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.report import USAGE, Problem

LIST = Path(__file__).with_name("sm120.toml")
SETTING = "GLM5_KERNELS"  # the Dockerfile's build argument that selects what kernels/build compiles
RECORD_NAME = "GLM5_SERVE_KERNELS.json"  # in FlashInfer's AOT folder, beside the modules it describes


@dataclass(frozen=True)
class Cite:
    file: str  # relative to site-packages
    line: int
    text: str  # what that line holds (tests/test_kernels.py checks it in the pinned packages)


@dataclass(frozen=True)
class Module:
    name: str  # FlashInfer's JitSpec name: the AOT file is <aot>/<name>/<name>.so
    generator: str  # "package.module:function"
    args: dict[str, Any]
    sources: int
    why: str
    when: str
    cite: tuple[Cite, ...]
    figures: dict[str, Any] = field(default_factory=dict)

    def spec(self) -> Any:
        """FlashInfer's JitSpec for this module, from the pinned generator (imports FlashInfer)."""
        module_name, _, function = self.generator.partition(":")
        return getattr(importlib.import_module(module_name), function)(**self.args)


@dataclass(frozen=True)
class Note:
    """What the list leaves out, and why: a module not requested, or a kernel only a first start can compile."""

    name: str
    why: str
    cite: tuple[Cite, ...]


@dataclass(frozen=True)
class KernelList:
    arch_list: str
    ci: tuple[str, ...]
    modules: tuple[Module, ...]
    not_requested: tuple[Note, ...] = ()
    first_start: tuple[Note, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.modules)

    def select(self, value: str) -> tuple[Module, ...]:
        """GLM5_KERNELS: `all`, `none` (a quick build), `ci`, or names from the list, comma-separated."""
        text = value.strip()
        if text in ("", "all"):
            return self.modules
        if text == "none":
            return ()
        wanted = list(self.ci) if text == "ci" else [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in self.names]
        if unknown:
            raise Problem(
                SETTING,
                f"unknown module(s) {', '.join(unknown)} (value '{value}')",
                f"use all, none, ci, or names from kernels/sm120.toml: {', '.join(self.names)}",
                USAGE,
            )
        return tuple(m for m in self.modules if m.name in wanted)


_FIGURES = ("build_seconds", "build_seconds_32", "job_memory_mib", "so_mib", "measured")


def _cites(entry: dict[str, Any]) -> tuple[Cite, ...]:
    return tuple(Cite(c["file"], int(c["line"]), c["text"]) for c in entry["cite"])


def load(path: Path = LIST) -> KernelList:
    data = tomllib.loads(path.read_text())
    modules = tuple(
        Module(
            name=m["name"],
            generator=m["generator"],
            args=dict(m.get("args", {})),
            sources=int(m["sources"]),
            why=m["why"],
            when=m["when"],
            cite=_cites(m),
            figures={k: m[k] for k in _FIGURES if k in m},
        )
        for m in data["module"]
    )
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: a module is listed twice: {names}")
    kernel_list = KernelList(
        arch_list=data["arch_list"],
        ci=tuple(data["ci"]),
        modules=modules,
        not_requested=tuple(Note(n["name"], n["why"], _cites(n)) for n in data.get("not_requested", [])),
        first_start=tuple(Note(n["name"], n["why"], _cites(n)) for n in data.get("first_start", [])),
    )
    kernel_list.select(",".join(kernel_list.ci))  # the ci selection names listed modules
    return kernel_list


def aot_dir() -> Path:
    """FlashInfer's prebuilt-module folder, as its runtime computes it (imports FlashInfer)."""
    from flashinfer.jit import env as jit_env

    return Path(jit_env.FLASHINFER_AOT_DIR)
