"""Run FlashInfer CUDA-version scenarios under the real torch Dynamo; print one JSON object.

Run in a subprocess with PYTHONPATH pointing at the flashinfer tree under test:
    python dynamo_scenarios.py SCENARIO [SCENARIO ...]
"""

from __future__ import annotations

import json
import os
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from patches import verify  # the caller puts the kit's root on PYTHONPATH after the tree under test

ROOT = Path(__file__).resolve().parents[2]
ENV = "FLASHINFER_CUDA_VERSION"


def spawn_counter() -> Callable[[], int]:
    seen: list[str] = []

    def hook(event: str, _args: tuple[Any, ...]) -> None:
        if event.startswith(verify.SPAWN_EVENTS):
            seen.append(event)

    sys.addaudithook(hook)
    return lambda: len(seen)


def scenario_compile() -> dict[str, Any]:
    from flashinfer.jit import cpp_ext

    return verify.compile_probe(cpp_ext.is_cuda_version_at_least)


def scenario_follow() -> dict[str, Any]:
    """A compiled graph must follow a change of the variable, never keep a stale value."""
    import torch
    from flashinfer.jit import cpp_ext

    spawns = spawn_counter()

    def fn(x: torch.Tensor) -> torch.Tensor:
        if cpp_ext.is_cuda_version_at_least("12.8"):
            return x * 2
        return x * 3

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    results = {}
    for value in ("13.0", "12.4", "12.8.1", "13.0"):
        os.environ[ENV] = value
        results[value + ("#2" if value in results else "")] = float(compiled(torch.ones(1)))
    os.environ["GLM5_UNRELATED_VARIABLE"] = "changed"
    results["unrelated-change"] = float(compiled(torch.ones(1)))
    return {"results": results, "spawns": spawns()}


def scenario_malformed() -> dict[str, Any]:
    import torch
    from flashinfer.jit import cpp_ext

    out: dict[str, Any] = {}
    for raw in ("abc", "12", "v12.8", "12.8a", "12.8.1.4", "1 2.8"):
        os.environ[ENV] = raw
        entry: dict[str, Any] = {}
        try:
            entry["eager"] = str(cpp_ext.get_cuda_version())
        except ValueError as err:
            entry["eager_error"] = str(err)
        compiled = torch.compile(
            lambda x: x * 2 if cpp_ext.is_cuda_version_at_least("12.8") else x,
            fullgraph=True,
            backend="eager",
        )
        try:
            entry["compiled"] = float(compiled(torch.ones(1)))
        except Exception as err:  # noqa: BLE001 - the error is the result
            cause = err.__cause__
            entry["compiled_error"] = f"{type(err).__name__} caused by {type(cause).__name__}: {cause}"
        out[raw] = entry
    return out


def scenario_parse() -> dict[str, Any]:
    from flashinfer.jit import cpp_ext

    out = {}
    for raw in (" 12.8 ", "13.0.1", "12.9", "13.0"):
        os.environ[ENV] = raw
        out[raw] = str(cpp_ext.get_cuda_version())
    os.environ[ENV] = ""
    out["<empty: detected>"] = str(cpp_ext.get_cuda_version())
    return out


def scenario_unset() -> dict[str, Any]:
    """Override unset, nvcc present: detection runs once, outside the traced graph."""
    import torch
    from flashinfer.jit import cpp_ext

    os.environ.pop(ENV, None)
    spawns = spawn_counter()
    probe = verify.compile_probe(cpp_ext.is_cuda_version_at_least)
    first = spawns()
    again = float(
        torch.compile(
            lambda x: x + cpp_ext.is_cuda_version_at_least("12.8"), fullgraph=True, backend="eager"
        )(torch.zeros(1))
    )
    return {
        "probe": probe,
        "version": str(cpp_ext.get_cuda_version()),
        "spawns_first": first,
        "spawns_after": spawns() - first,
        "again": again,
    }


def scenario_timing() -> dict[str, Any]:
    """Cost per call in microseconds; the unpatched tree is timed uncached (cache cleared)."""
    from flashinfer.jit import cpp_ext

    def per_call(fn: Callable[[], Any], number: int) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

    out = {}
    if hasattr(cpp_ext, "CUDA_VERSION_ENV"):
        os.environ[ENV] = "13.0"
        out["get_cuda_version_override_us"] = per_call(cpp_ext.get_cuda_version, 20000)
        out["is_at_least_override_us"] = per_call(lambda: cpp_ext.is_cuda_version_at_least("12.8"), 20000)
        os.environ.pop(ENV)
        out["get_cuda_version_unset_warm_us"] = per_call(cpp_ext.get_cuda_version, 20000)
    else:

        def uncached() -> Any:
            cpp_ext.get_cuda_path.cache_clear()
            cpp_ext.get_cuda_version.cache_clear()
            return cpp_ext.get_cuda_version()

        out["get_cuda_version_uncached_us"] = per_call(uncached, 20)
        out["get_cuda_version_cache_hit_us"] = per_call(cpp_ext.get_cuda_version, 20000)
    return out


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "compile": scenario_compile,
    "follow": scenario_follow,
    "malformed": scenario_malformed,
    "parse": scenario_parse,
    "unset": scenario_unset,
    "timing": scenario_timing,
}


def main() -> None:
    import flashinfer.jit.cpp_ext as cpp_ext

    out: dict[str, Any] = {"module": cpp_ext.__file__}
    for name in sys.argv[1:]:
        out[name] = SCENARIOS[name]()
    print("SCENARIOS-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
