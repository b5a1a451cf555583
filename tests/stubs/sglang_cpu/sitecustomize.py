"""Import-time stand-ins that let the real SGLang 0.5.23 server import on a CPU-only machine: tests only, never
shipped. The real-server tests' program (tests/helpers/sglang_cpu_server.py) puts this folder on the server's
PYTHONPATH, so Python runs this file at the start of the server and of each process it spawns (scheduler,
detokenizer); it does nothing unless SGLANG_USE_CPU_ENGINE=1 (the CPU engine of sglang/srt/utils/common.py
is_cpu()).

No stand-in runs code for a Llama: each only lets a module-level import succeed.
- triton: imported at module level (sglang/srt/utils/common.py `import triton`) and used to define @triton.jit
  kernels that the CPU path never launches; its GPU wheel does not import here. Modelled on SGLang's own macOS
  stand-in, sglang/_platform_stubs.py (_MockModule, _TritonFinder), which SGLang installs only on darwin.
- torchvision: imported at module level by sglang/srt/multimodal/internvl_utils.py (`import torchvision.transforms`),
  reached from sglang/srt/configs/__init__.py; PyPI's wheel links CUDA torch and fails to import beside the CPU
  build. Probes (importlib.util.find_spec, as transformers' is_torchvision_available does) still find it absent:
  transformers would otherwise build tables from torchvision's enums (transformers/image_utils.py).
- sgl_kernel: the folder beside this file (the CPU build of sgl-kernel is not on PyPI).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from collections.abc import Callable
from typing import Any


def _passthrough(*args: Any, **kwargs: Any) -> Any:
    """`@triton.jit` returns the function; `@triton.jit(...)` / `@triton.autotune(...)` return a decorator."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda fn: fn


class StandIn(types.ModuleType):
    """A package whose every attribute is another stand-in: a class for a CamelCase name (so it can be subclassed
    or caught: the stand-ins of triton's classes are Exception subclasses), else a sub-package; calling one is a
    pass-through decorator."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, LOADER, is_package=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value: Any = type(name, (Exception,), {"__module__": self.__name__}) if name[:1].isupper() else None
        if value is None:
            value = sys.modules.get(f"{self.__name__}.{name}") or register(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _passthrough(*args, **kwargs)

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())


class StandInLoader:
    """Loads the stand-in already registered under the spec's name (the import system would otherwise make an
    empty namespace package of a spec without a loader)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return sys.modules[spec.name]

    def exec_module(self, module: types.ModuleType) -> None:
        pass


LOADER = StandInLoader()


def register(name: str) -> StandIn:
    module = StandIn(name)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, module)
    return module


def probing() -> bool:
    """True when importlib.util.find_spec asked (a probe for an optional package), not an import statement."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "find_spec" and frame.f_globals.get("__name__") == "importlib.util":
            return True
        frame = frame.f_back
    return False


class StandInFinder:
    """Serves a stand-in for `top` and its submodules, to imports only when `hidden_from_probes`."""

    def __init__(self, top: str, hidden_from_probes: bool, setup: Callable[[StandIn], None]) -> None:
        self.top, self.hidden, self.setup = top, hidden_from_probes, setup

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> Any:
        if fullname != self.top and not fullname.startswith(self.top + "."):
            return None
        if self.hidden and fullname not in sys.modules and probing():
            return None
        module = sys.modules.get(fullname)
        if module is None:
            module = register(fullname)
            if fullname == self.top:
                self.setup(module)
        return module.__spec__


class Config:
    """triton.Config (subclassed by torch/_inductor/runtime/triton_heuristics.py) and tl.constexpr."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def triton_values(triton: StandIn) -> None:
    """The values SGLang's host code computes with (sglang/_platform_stubs.py sets the same)."""
    triton.__version__ = "3.0.0"
    triton.cdiv = lambda a, b: -(a // -b)
    triton.next_power_of_2 = lambda n: 1 << (n - 1).bit_length() if n > 0 else 1
    triton.Config = Config
    triton.language.constexpr = Config  # an annotation, or a value wrapper: tl.constexpr(0)
    triton.compiler.compiler.triton_key = lambda: "triton-stand-in"
    triton.runtime.cache.triton_key = lambda: "triton-stand-in"


def install() -> None:
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        return
    finders = [StandInFinder("torchvision", True, lambda _m: None)]
    if importlib.machinery.PathFinder.find_spec("triton") is None:
        finders.append(StandInFinder("triton", False, triton_values))
    sys.meta_path[:0] = finders


install()
