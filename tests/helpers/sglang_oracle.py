"""Ask the real sglang 0.5.23 (CPU, triton stubbed) about server argv lists; print JSON.

stdin: {"argvs": [[...], ...], "decode": [[argv, max_bs], ...]}
stdout: {"parse": [{"ok": bool, "error": str}], "decode": [[sizes...], ...]}
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes
from sglang.srt.server_args import prepare_server_args


def parse(argv: list[str]) -> dict[str, object]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            prepare_server_args(argv)
    except SystemExit as exc:
        return {"ok": False, "error": f"exit {exc.code}: {err.getvalue().strip().splitlines()[-1:]}"}
    return {"ok": True, "error": ""}


def main() -> None:
    request = json.load(sys.stdin)
    out = {
        "parse": [parse(argv) for argv in request.get("argvs", [])],
        "decode": [
            generate_decode_cuda_graph_batch_sizes(prepare_server_args(argv), max_bs)
            for argv, max_bs in request.get("decode", [])
        ],
    }
    print("ORACLE-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
