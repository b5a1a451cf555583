"""Resolve server argv lists with the real SGLang 0.5.23's own pipeline and print what it settled (JSON).

Run by .venv-sglang-cpu's python (SGLang's full dependencies) with tests/stubs/sglang_cpu on PYTHONPATH and
SGLANG_USE_CPU_ENGINE=1 (tests/helpers/oracles.py ask_resolved). Each argv's `--model-path` is replaced by a folder
holding the checkpoint's config.json and hf_quant_config.json (tests/fixtures/glm5-config), so the pipeline reaches
the handlers that need the model (srt/arg_groups/pipeline.py: the DSA backends, handle_data_parallelism); the GPU is
the box's SM120 (torch.cuda.get_device_capability). Then `prepare_server_args(argv)` and `ServerArgs.resolve_once()`,
as the launcher runs them, and from the resolved record (`resolving_view`): the chunk and the prefill capture list,
and that list as each rank captures it (aligned to its attention-TP size: sglang_oracle.capture, 0.5.23's own
functions). On a CPU the resolved decode list is the CPU's, not the box's: the decode list stays with sglang_oracle.

stdin: {"model": FOLDER, "resolve": [[argv, max_bs, token_capacity], ...]}
stdout: ORACLE-JSON {"resolve": [{"chunk": int, "prefill_listed": [...], "prefill": [...], "decode": [...]}, ...]}
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

import sglang_oracle  # the capture functions: beside this script, the first folder on its path
import torch
from sglang.srt.arg_groups.model_override_base import resolving_view
from sglang.srt.server_args import prepare_server_args


def resolve(argv: list[str], model: str, max_bs: int, token_capacity: int) -> dict[str, object]:
    argv = list(argv)
    argv[argv.index("--model-path") + 1] = model
    args = prepare_server_args(argv)
    with contextlib.redirect_stderr(io.StringIO()):
        args.resolve_once()
    view = resolving_view(args)
    listed = list(view.cuda_graph_config.prefill.bs)
    ranked = sglang_oracle.capture(argv, max_bs, token_capacity, listed)
    return {"chunk": view.chunked_prefill_size, "prefill_listed": listed} | ranked


def main() -> None:
    request = json.load(sys.stdin)
    torch.cuda.get_device_capability = lambda *_a: (12, 0)  # the box's SM120
    out = {"resolve": [resolve(argv, request["model"], *rest) for argv, *rest in request["resolve"]]}
    print("ORACLE-JSON " + json.dumps(out))


if __name__ == "__main__":
    main()
