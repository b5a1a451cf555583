"""Check that the packages this python imports carry the patch series and that it works.

    patches/verify [--nvcc PATH] [--skip-compile] [--json] [--package NAME ...]

Checks every package patches/series names (--package NAME, again for more: those alone).
FlashInfer, in order: the imported flashinfer.jit.cpp_ext is the patched one (its record and
file hashes match); FLASHINFER_CUDA_VERSION is set and well-formed; it equals the image's
CUDA release (nvcc --version, else torch.version.cuda); a fullgraph torch.compile of a
function calling is_cuda_version_at_least() inline traces with zero graph breaks and
zero process spawns (seen by a Python audit hook). SGLang: its record lists the series'
sglang patches and the files' hashes match (sglang-patched); validate_top_logprobs_num()
refuses vocab_size + 1, a negative, a bool, a float and null, accepts 0 and vocab_size,
and _create_tokenized_object calls it (sglang-top-logprobs); build_server_info() masks
api_key and admin_api_key, in launch_command too, and server_info() passes the schedulers'
internal states through the same masking (sglang-server-info). A package the series names
that has no checks of its own gets the record check (PACKAGE-patched). Exit 0 when all pass,
1 otherwise, 2 on bad usage.

Cost: --skip-compile (the entrypoint's, at every start) leaves out the torch.compile check
alone; every other check is cheap. The SGLang checks import no sglang module (importing
sglang.srt.managers.tokenizer_manager costs some 6 CPU-seconds and loads sgl_kernel, which
a build without a GPU may not load): they compile the patched definitions from the
installed files (ast) and call them, in a few hundredths of a second.
"""

from __future__ import annotations
import __future__

import argparse
import ast
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from patches.apply import HERE, RECORD_NAME, ApplyError, Patch, packages_of, read_series, record_key, sha256

ENV = "FLASHINFER_CUDA_VERSION"
SPAWN_EVENTS = (
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
)


class Check:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def record(self, name: str, ok: bool, detail: str) -> bool:
        self.results.append({"check": name, "ok": ok, "detail": detail})
        return ok


def check_patched_module(check: Check) -> Any:
    try:
        import flashinfer.jit.cpp_ext as cpp_ext
    except Exception as err:  # noqa: BLE001 - any import failure is the finding
        check.record("patched-module", False, f"import flashinfer.jit.cpp_ext failed: {err!r}")
        return None
    module_file = Path(cpp_ext.__file__).resolve()
    package = module_file.parent.parent
    site = package.parent
    record_path = package / RECORD_NAME
    if not record_path.is_file():
        check.record(
            "patched-module", False, f"{module_file} has no {record_path.name} beside it: run patches/apply"
        )
        return cpp_ext
    record = json.loads(record_path.read_text())
    for patch in record["patches"]:
        for rel, digest in patch["files"].items():
            actual = hashlib.sha256((site / rel).read_bytes()).hexdigest()
            if actual != digest:
                check.record(
                    "patched-module",
                    False,
                    f"{site / rel} differs from what {patch['name']} left "
                    "(reinstalled or edited since?): run patches/apply again",
                )
                return cpp_ext
    if not hasattr(cpp_ext, "CUDA_VERSION_ENV"):
        check.record("patched-module", False, f"{module_file} lacks the override: run patches/apply")
        return cpp_ext
    names = ", ".join(p["name"] for p in record["patches"])
    check.record("patched-module", True, f"{module_file} carries {names}")
    return cpp_ext


def toolkit_release(nvcc: str | None) -> tuple[str | None, str]:
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None and os.environ.get("CUDA_HOME"):
        candidate = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        nvcc = str(candidate) if candidate.exists() else None
    if nvcc is not None:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
        match = re.search(r"release (\d+\.\d+),", out)
        return (match.group(1) if match else None), f"{nvcc} --version"
    import torch

    return torch.version.cuda, "torch.version.cuda"


def check_override(check: Check, cpp_ext: Any, nvcc: str | None) -> None:
    raw = os.environ.get(ENV, "")
    if not raw.strip():
        check.record("override-set", False, f"{ENV} is not set: set it to the image's CUDA release")
        return
    try:
        value = cpp_ext.parse_cuda_version_override(raw)
    except ValueError as err:
        check.record("override-set", False, str(err))
        return
    check.record("override-set", True, f"{ENV}={raw} -> {value}")
    release, source = toolkit_release(nvcc)
    if release is None:
        check.record(
            "override-matches-toolkit",
            False,
            f"cannot tell this environment's CUDA release from {source}: "
            "install nvcc or a CUDA build of torch, or pass --nvcc",
        )
        return
    major_minor = ".".join(release.split(".")[:2])
    ok = str(value) == major_minor
    detail = f"{ENV}={value}, {source} says {major_minor}"
    if not ok:
        detail += f": set {ENV}={major_minor} (it drives -DENABLE_FP4 and sm_120f builds)"
    check.record("override-matches-toolkit", ok, detail)


def compile_probe(is_at_least: Callable[[str], bool]) -> dict[str, Any]:
    """fullgraph-compile a function that calls is_at_least inline; count spawns and breaks."""
    import torch
    from torch._dynamo.utils import counters

    spawns: list[str] = []
    armed = [False]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if armed[0] and event.startswith(SPAWN_EVENTS):
            spawns.append(f"{event} {str(args)[:120]}")

    sys.addaudithook(hook)

    def fn(x: torch.Tensor) -> torch.Tensor:
        x = x * 2
        if is_at_least("12.8"):
            x = x + 1
        return torch.relu(x).sum()

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    armed[0] = True
    try:
        value = float(compiled(torch.ones(4)))
        error = None
    except Exception as err:  # noqa: BLE001 - the failure is the finding
        value, error = None, f"{type(err).__module__}.{type(err).__name__}: {str(err)[:400]}"
    finally:
        armed[0] = False
    breaks = sum(counters["graph_break"].values())
    return {"value": value, "error": error, "spawns": spawns, "graph_breaks": breaks}


def check_compile(check: Check, cpp_ext: Any) -> None:
    probe = compile_probe(cpp_ext.is_cuda_version_at_least)
    ok = probe["error"] is None and not probe["spawns"] and probe["graph_breaks"] == 0
    detail = (
        f"fullgraph compile: error={probe['error']}, spawns={len(probe['spawns'])}, "
        f"graph_breaks={probe['graph_breaks']}"
    )
    check.record("fullgraph-compile", ok, detail)


def check_record(check: Check, package: str, patches: list[Patch]) -> Path | None:
    """PACKAGE-patched: the package this python finds (not imported) has the record of the series' patches for it,
    and each file is as they left it. Returns its site-packages folder, None when it is not there."""
    name = f"{package}-patched"
    dist = patches[0].dist
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        check.record(name, False, f"{sys.executable} finds no {package} package: install {dist}")
        return None
    folder = Path(next(iter(spec.submodule_search_locations))).resolve()
    record_path = folder / RECORD_NAME
    if not record_path.is_file():
        check.record(name, False, f"{folder} has no {RECORD_NAME}: run patches/apply")
        return folder.parent
    record = json.loads(record_path.read_text())
    wanted = [(p.name, sha256(p.path)) for p in patches]
    found = [(p.get("name"), p.get("sha256")) for p in record.get("patches", [])]
    if found != wanted:
        check.record(
            name,
            False,
            f"{record_path} records {[n for n, _ in found]}, patches/series has {[n for n, _ in wanted]} for {package}, "
            f"or a patch changed since it was applied: reinstall {dist} ({record_key(dist)} "
            f"{record.get(record_key(dist), '?')}) and run patches/apply",
        )
        return folder.parent
    for patch in record["patches"]:
        for rel, digest in patch["files"].items():
            path = folder.parent / rel
            if not path.is_file() or sha256(path) != digest:
                check.record(
                    name,
                    False,
                    f"{path} differs from what {patch['name']} left (reinstalled or edited since?): "
                    "run patches/apply again",
                )
                return folder.parent
    check.record(name, True, f"{folder} carries {', '.join(n for n, _ in wanted)}")
    return folder.parent


def definitions(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> dict[str, Any]:
    """The module-level functions and assignments NAMES of the file PATH, compiled from its source and run in
    NAMESPACE (which supplies the globals they call): their behaviour without importing the module. Raises
    LookupError naming the ones PATH does not define."""
    tree = ast.parse(path.read_text(), str(path))
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            body.append(node)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in names for t in node.targets
        ):
            body.append(node)
    code = compile(
        ast.Module(body=body, type_ignores=[]),
        str(path),
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    exec(code, namespace)  # the installed package's own code, which the server runs anyway
    absent = [n for n in names if n not in namespace]
    if absent:
        raise LookupError(f"{path} defines no {', '.join(absent)}")
    return namespace


def calls_in(path: Path, qualname: str) -> list[str]:
    """The names of the functions that the function QUALNAME (`f`, `Class.method`) of the file PATH calls by their
    bare name; empty when PATH has no such function."""
    scope: list[ast.stmt] = ast.parse(path.read_text(), str(path)).body
    *classes, function = qualname.split(".")
    for name in classes:
        scope = next((n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == name), [])
    for node in scope:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == function:
            return [
                c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
            ]
    return []


SGLANG_MANAGER = "sglang/srt/managers/tokenizer_manager.py"
SGLANG_COMMON = "sglang/srt/utils/common.py"
SGLANG_HTTP = "sglang/srt/entrypoints/http_server.py"
VOCAB = 1000


def check_sglang_top_logprobs(check: Check, site: Path) -> None:
    name, path = "sglang-top-logprobs", site / SGLANG_MANAGER
    try:
        validate = definitions(path, ("validate_top_logprobs_num",), {})["validate_top_logprobs_num"]
    except (OSError, SyntaxError, LookupError) as err:
        check.record(name, False, f"{err}: run patches/apply")
        return
    wrong = []
    for value in (VOCAB + 1, -1, True, 2.0, None):
        try:
            validate(value, VOCAB)
            wrong.append(f"accepts {value!r}")
        except ValueError:
            pass
    for value in (0, 1, VOCAB):
        try:
            validate(value, VOCAB)
        except ValueError as err:
            wrong.append(f"refuses {value!r} ({err})")
    if "validate_top_logprobs_num" not in calls_in(path, "TokenizerManager._create_tokenized_object"):
        wrong.append("TokenizerManager._create_tokenized_object does not call it")
    detail = f"{path}: validate_top_logprobs_num(k, vocab_size={VOCAB}) "
    if wrong:
        check.record(name, False, detail + "; ".join(wrong) + ": run patches/apply again")
    else:
        check.record(
            name, True, detail + f"refuses {VOCAB + 1}, -1, True, 2.0 and None, accepts 0, 1 and {VOCAB}"
        )


def check_sglang_server_info(check: Check, site: Path) -> None:
    name, path = "sglang-server-info", site / SGLANG_COMMON
    names = (
        "SERVER_INFO_SECRET_FIELDS",
        "redact_server_info_secrets",
        "_redact_key_flags",
        "build_server_info",
    )
    try:
        found = definitions(path, names, {"describe_kv_events_publisher": lambda _args: None})
    except (OSError, SyntaxError, LookupError) as err:
        check.record(name, False, f"{err}: run patches/apply")
        return
    secrets = ("verify-key-1", "verify-key-2")
    args = SimpleNamespace(
        resolved_dict=lambda: {"api_key": secrets[0], "admin_api_key": None, "port": 30000},
        launch_command=f"sglang serve --api-key {secrets[0]} --admin-api-key={secrets[1]} --port 30000",
    )
    info = found["build_server_info"](args, {"max_total_num_tokens": 1})
    states = found["redact_server_info_secrets"]([{"api_key": secrets[0], "admin_api_key": secrets[1]}])
    shown = json.dumps([info, states])
    wrong = []
    if info.get("api_key") != "<redacted>" or info.get("admin_api_key", "") is not None:
        wrong.append(
            f"build_server_info() gave api_key={info.get('api_key')!r}, admin_api_key="
            + repr(info.get("admin_api_key", "absent"))
        )
    if any(s in shown for s in secrets) or "--port 30000" not in shown:
        wrong.append(f"a key left in {shown}")
    http = site / SGLANG_HTTP
    try:
        if "redact_server_info_secrets" not in calls_in(http, "server_info"):
            wrong.append(
                f"{http}: server_info() does not pass the internal states through redact_server_info_secrets()"
            )
    except (OSError, SyntaxError) as err:
        wrong.append(str(err))
    detail = f"{path}: build_server_info() and the internal states mask api_key and admin_api_key"
    if wrong:
        check.record(name, False, f"{path}: " + "; ".join(wrong) + ": run patches/apply again")
    else:
        check.record(name, True, f"{detail} (launch_command: {info.get('launch_command')!r})")


def check_sglang(check: Check, patches: list[Patch]) -> None:
    site = check_record(check, "sglang", patches)
    if site is not None:
        check_sglang_top_logprobs(check, site)
        check_sglang_server_info(check, site)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="patches/verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nvcc", help="nvcc to compare the override with (default: PATH, CUDA_HOME)")
    parser.add_argument("--skip-compile", action="store_true", help="skip the torch.compile check")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--package",
        action="append",
        metavar="NAME",
        help="check only this package's patches (again for more); default: every package the series names",
    )
    args = parser.parse_args(argv)
    check = Check()
    try:
        series = packages_of(read_series(HERE / "series"))
    except ApplyError as err:
        series = {}
        check.record("series", False, str(err))
    unknown = sorted(set(args.package or ()) - set(series))
    if unknown and series:
        parser.error(
            f"--package {', '.join(unknown)}: patches/series patches no such package ({', '.join(series)})"
        )
    chosen = {name: patches for name, patches in series.items() if not args.package or name in args.package}
    for package, patches in chosen.items():
        if package == "flashinfer":
            cpp_ext = check_patched_module(check)
            if cpp_ext is not None:
                if hasattr(cpp_ext, "parse_cuda_version_override"):
                    check_override(check, cpp_ext, args.nvcc)
                if not args.skip_compile:
                    check_compile(check, cpp_ext)
        elif package == "sglang":
            check_sglang(check, patches)
        else:
            check_record(check, package, patches)
    ok = all(r["ok"] for r in check.results)
    if args.json:
        print(json.dumps({"ok": ok, "checks": check.results}, indent=2))
    else:
        for r in check.results:
            print(f"patches/verify: {'ok  ' if r['ok'] else 'FAIL'} {r['check']}: {r['detail']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
