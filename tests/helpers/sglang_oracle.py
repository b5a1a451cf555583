"""Ask the real sglang 0.5.23 (CPU, triton stubbed) about server argv lists; print JSON.

stdin: {"argvs": [[...], ...], "decode": [[argv, max_bs], ...], "dsa": [[kv_cache_dtype, prefill, decode], ...],
        "capture": [[argv, max_bs, token_capacity, prefill_tokens], ...]}
stdout: {"parse": [{"ok": bool, "error": str}], "decode": [[sizes...], ...], "dsa": ["ok" or the refusal, ...],
         "capture": [{"decode": [sizes...], "prefill": [shapes...], "pool": int}, ...]}
"dsa": 0.5.23's own DSA backend rule (srt/arg_groups/overrides.py _check_dsa_backend_constraints) on an SM120 device.
"capture": what a rank captures at run time, by 0.5.23's own functions read from its installed source and run with
its run-time context (get_exec, get_parallel, get_schedule, ...) stood in from the parsed arguments: the request pool
(mem_cache/kv_cache_configurator.py resolve_max_num_reqs, for a rank's `token_capacity`), the decode list clamped and
aligned (model_executor/runner/base_cuda_graph_runner.py get_batch_sizes_to_capture, utils/common.py
get_cuda_graph_batch_size_alignment, require_mlp_tp_gather, require_attn_tp_gather) and the prefill shapes aligned
(prefill_cuda_graph_runner.py get_prefill_num_tokens_to_capture). Importing those modules needs a GPU stack; their
functions alone do not.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import functools
import io
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sglang
import torch
from sglang.srt.arg_groups.cuda_graph_hook import (
    generate_decode_cuda_graph_batch_sizes,
    generate_prefill_cuda_graph_batch_sizes,
)
from sglang.srt.arg_groups.overrides import _check_dsa_backend_constraints
from sglang.srt.server_args import prepare_server_args


def parse(argv: list[str]) -> dict[str, object]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            prepare_server_args(argv)
    except SystemExit as exc:
        return {"ok": False, "error": f"exit {exc.code}: {err.getvalue().strip().splitlines()[-1:]}"}
    return {"ok": True, "error": ""}


def dsa(kv_cache_dtype: str, prefill: str, decode: str) -> str:
    try:
        _check_dsa_backend_constraints(kv_cache_dtype, prefill, decode, hip=False)
    except ValueError as err:
        return str(err)
    return "ok"


SRT = Path(sglang.__file__).parent / "srt"


@functools.cache
def parsed(path: str) -> ast.Module:
    return ast.parse((SRT / path).read_text())


def real(path: str, name: str, namespace: dict[str, Any], within: str | None = None) -> Any:
    """The function `name` (a method of class `within`) from sglang's installed source, compiled alone into
    `namespace`: its own code, with the names it reads taken from `namespace`."""
    body = parsed(path).body
    if within is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == within).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    module = ast.Module(
        body=[node], type_ignores=[]
    )  # its annotations stay unevaluated, as in its own module
    exec(compile(module, str(SRT / path), "exec", flags=__future__.annotations.compiler_flag), namespace)
    return namespace[name]


def capture(
    argv: list[str], max_bs: int, token_capacity: int, prefill_tokens: int | list[int]
) -> dict[str, Any]:
    """`prefill_tokens`: the largest prefill shape (the list 0.5.23 generates for it), or a list SGLang's resolution
    settled (sglang_resolution_oracle.py)."""
    args = prepare_server_args(argv)
    dp = int(args.attn_dp_size or 1)
    parallel = SimpleNamespace(
        attn_dp_enabled=dp > 1, num_dp_ranks=dp, tp_size=args.tp_size, attn_tp_size=args.tp_size // dp,
        attn_cp_size=1, moe_dense_tp_size=args.moe_dense_tp_size, enable_dp_lm_head=args.enable_dp_lm_head,
        disable_attn_tp_gather=False,
    )  # fmt: skip
    no_a2a = SimpleNamespace(is_none=lambda: True, is_flashinfer=lambda: False, is_mori_epv2=lambda: False,
                             is_flashinfer_megamoe=lambda: False, is_mori=lambda: False)  # fmt: skip
    decode_bs = generate_decode_cuda_graph_batch_sizes(args, max_bs)
    # With speculative decoding and no --max-running-requests, 0.5.23 sets 48 (arg_groups/speculative_hook.py:440-446,
    # a hook that needs the model's files, so it does not run here).
    running = args.max_running_requests or (48 if args.speculative_algorithm else None)
    execution = SimpleNamespace(
        overlap=SimpleNamespace(enable_two_batch_overlap=False),
        moe=SimpleNamespace(elastic_ep_backend=None),
        graph=SimpleNamespace(cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(bs=decode_bs)),
                              torch_compile_max_bs=32),
    )  # fmt: skip
    ns: dict[str, Any] = {
        "logger": logging,
        "get_parallel": lambda: parallel, "get_exec": lambda: execution, "is_hip": lambda: False,
        "get_schedule": lambda: SimpleNamespace(max_running_requests=running),
        "get_flags": lambda: SimpleNamespace(capture=SimpleNamespace(enable_torch_compile=False)),
        "DllmConfig": SimpleNamespace(from_server_args=lambda _a: None), "envs": None,
        "ceil_div": lambda a, b: -(-a // b), "MoeA2ABackend": lambda _b: no_a2a,
    }  # fmt: skip
    ns["ceil_align"] = real("utils/common.py", "ceil_align", ns)
    for name in ("require_mlp_tp_gather", "require_attn_tp_gather", "require_gathered_buffer",
                 "get_cuda_graph_batch_size_alignment", "get_cuda_graph_max_batch_size"):  # fmt: skip
        real("utils/common.py", name, ns)
    # The MoE all-to-all backend: none (the kit's flashinfer_cutlass runner); both functions import it by name.
    sys.modules.setdefault("sglang.srt.layers.moe.utils", SimpleNamespace(MoeA2ABackend=ns["MoeA2ABackend"],
                           get_moe_a2a_backend=lambda: no_a2a))  # type: ignore[arg-type]  # fmt: skip
    configurator = SimpleNamespace(
        attn_dp_size=dp, mambaish_config=None, model_config=SimpleNamespace(context_len=202752)
    )
    pool = real("mem_cache/kv_cache_configurator.py", "resolve_max_num_reqs", ns, "KVCacheConfigurator")(
        configurator, token_capacity
    )
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(size=pool), server_args=args)
    decode, _ = real("model_executor/runner/base_cuda_graph_runner.py", "get_batch_sizes_to_capture", ns)(
        runner
    )
    prefill = real(
        "model_executor/runner/prefill_cuda_graph_runner.py", "get_prefill_num_tokens_to_capture", ns
    )(
        prefill_tokens
        if isinstance(prefill_tokens, list)
        else generate_prefill_cuda_graph_batch_sizes(prefill_tokens)
    )
    return {"decode": decode, "prefill": prefill, "pool": pool}


def main() -> None:
    request = json.load(sys.stdin)
    torch.cuda.get_device_capability = lambda *_a: (
        12,
        0,
    )  # the box's SM120, for the DSA rule's TileLang check
    out = {
        "parse": [parse(argv) for argv in request.get("argvs", [])],
        "decode": [
            generate_decode_cuda_graph_batch_sizes(prepare_server_args(argv), max_bs)
            for argv, max_bs in request.get("decode", [])
        ],
        "dsa": [dsa(*case) for case in request.get("dsa", [])],
        "capture": [capture(*case) for case in request.get("capture", [])],
    }
    print("ORACLE-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
