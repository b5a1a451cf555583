"""Ask the real sglang 0.5.23 (CPU, triton stubbed) about server argv lists; print JSON.

stdin: {"argvs": [[...], ...], "decode": [[argv, max_bs], ...], "dsa": [[kv_cache_dtype, prefill, decode], ...]}
stdout: {"parse": [{"ok": bool, "error": str}], "decode": [[sizes...], ...], "dsa": ["ok" or the refusal, ...]}
"dsa": 0.5.23's own DSA backend rule (srt/arg_groups/overrides.py _check_dsa_backend_constraints) on an SM120 device.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

import torch
from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes
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
    }
    print("ORACLE-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
