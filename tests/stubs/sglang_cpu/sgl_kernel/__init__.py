"""Stand-in for sgl-kernel's CPU build (not on PyPI), tests only: with SGLANG_USE_CPU_ENGINE=1 SGLang imports CPU
ops from `sgl_kernel` at module level (sglang/kernels/ops/kvcache/cache_move.py, sglang/srt/mem_cache/allocation.py,
sglang/kernels/ops/speculative/*) that a Llama served without speculative decoding never calls. Every name imports;
calling one raises, naming it, so a test that reaches one fails loudly instead of computing something else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__version__ = "0.0.0+cpu-stand-in"


def __getattr__(name: str) -> Callable[..., Any]:
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(f"sgl_kernel.{name}: the CPU stand-in has no ops (tests/stubs/sglang_cpu)")

    missing.__name__ = name
    return missing
