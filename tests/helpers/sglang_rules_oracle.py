"""Ask the real sglang 0.5.23 (CPU, triton stubbed) for its CUDA graph capture sizes; print JSON.

stdin: {"decode": [[max_bs, speculative], ...], "prefill": [max_tokens, ...]}
stdout: ORACLE-JSON {"version": "0.5.23", "decode": [[sizes...], ...], "prefill": [[sizes...], ...]}

Decode sizes come from generate_decode_cuda_graph_batch_sizes on real ServerArgs (parsed from a
minimal command line, with --speculative-algorithm EAGLE when speculative), prefill sizes from
generate_prefill_cuda_graph_batch_sizes.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

from sglang.srt.arg_groups.cuda_graph_hook import (
    generate_decode_cuda_graph_batch_sizes,
    generate_prefill_cuda_graph_batch_sizes,
)
from sglang.srt.server_args import prepare_server_args

BASE = ["--model-path", "/nonexistent/sglang-rules-oracle"]
SPECULATIVE = ["--speculative-algorithm", "EAGLE"]


def main() -> None:
    request = json.load(sys.stdin)
    plain = prepare_server_args(BASE)
    speculative = prepare_server_args(BASE + SPECULATIVE)
    assert plain.speculative_algorithm is None, plain.speculative_algorithm
    assert speculative.speculative_algorithm is not None
    out = {
        "version": importlib.metadata.version("sglang"),
        "decode": [
            generate_decode_cuda_graph_batch_sizes(speculative if spec else plain, max_bs)
            for max_bs, spec in request.get("decode", [])
        ],
        "prefill": [generate_prefill_cuda_graph_batch_sizes(n) for n in request.get("prefill", [])],
    }
    print("ORACLE-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
