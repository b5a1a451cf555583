"""SGLang 0.5.23's own argument resolution of the server command line, run before the weights load, and what it settles
for a rank's CUDA graph captures.

    python3 entrypoint/resolve_flags.py [--kv-tokens N] SERVER-ARGS...   (run by entrypoint/resolution.py with the
                                                                          server's Python and environment)

prepare_server_args (argparse), then ServerArgs.resolve_once (srt/server_args.py: the resolution pipeline
launch_server.py runs: model config from config.json and hf_quant_config.json, KV cache, DSA backends,
CUDA graph sizes, speculative and parallel settings) and check_server_args (engine.py's checks). A wrong
combination fails here in seconds instead of after a 10-minute load.

Then what a rank will capture, read as the scheduler of rank 0 reads it: the resolved record published as its process
configuration (runtime_context.publish, then layers/moe/utils.py initialize_moe_config, as managers/scheduler.py does)
and 0.5.23's own functions run on it: the prefill chunk (get_schedule().chunked_prefill_size), the prefill shapes
(prefill_cuda_graph_runner.py get_prefill_num_tokens_to_capture on cuda_graph_config.prefill.bs) and the decode
batches (base_cuda_graph_runner.py get_batch_sizes_to_capture, clamped to the request pool that
kv_cache_configurator.py resolve_max_num_reqs gives a rank whose KV cache holds N tokens: the box's figure is measured
only after the load, so the caller states it). Printed as one line on stdout: `RESOLVED {"chunk": ..., "prefill":
[...], "decode": [...], "pool": ...}`.

Exit 0 resolved (the line printed), 1 refused (the reason on stderr), 2 argparse's own refusal, 3 resolved but what it
settled could not be read (the reason on stderr).

Where no CUDA device is present (tests, a CPU machine), the box's GPU is stated instead of queried:
compute capability 12.0 (torch.cuda.get_device_capability, read raw by the DSA hooks) and SGLang's own
override_platform for SM120; `--device cuda` skips its accelerator probe. Stand-alone: imports only
torch and sglang, never the kit. Run with HF_HUB_OFFLINE=1: a local model path needs no network.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.moe.utils import initialize_moe_config
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator, mambaish_config
from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import get_prefill_num_tokens_to_capture
from sglang.srt.runtime_context import (
    SpawnRanks,
    get_exec,
    get_parallel,
    get_schedule,
    override_platform,
    publish,
)
from sglang.srt.server_args import prepare_server_args

RESOLVED = "RESOLVED "  # the line's prefix on stdout
KV_TOKENS = "--kv-tokens"  # this script's own option, before the server's
REFUSED, UNREADABLE = 1, 3


def state_the_box() -> list[str]:
    if torch.cuda.is_available():
        return []
    torch.cuda.get_device_capability = lambda device=None: (12, 0)
    override_platform(
        is_cuda=True,
        is_hip=False,
        is_sm90=False,
        is_sm100=False,
        is_sm100_or_sm110=False,
        is_sm110=False,
        is_sm120=True,
        is_blackwell=True,
        device_sm=120,
        device_capability=(12, 0),
        has_flashinfer=True,
    ).install()
    return ["--device", "cuda"]


def captures(args: Any, kv_tokens: int) -> dict[str, Any]:
    """What rank 0 captures under the resolved `args`, by 0.5.23's own functions on its published configuration."""
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    initialize_moe_config()
    model_config = ModelConfig.from_server_args(args)
    configurator = SimpleNamespace(  # the fields resolve_max_num_reqs reads of the KV cache configurator
        attn_dp_size=get_parallel().attn_dp_size,
        model_config=model_config,
        mambaish_config=mambaish_config(model_config),
    )
    pool = KVCacheConfigurator.resolve_max_num_reqs(configurator, kv_tokens)
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(size=pool), server_args=args)
    decode, _ = get_batch_sizes_to_capture(runner)
    prefill = get_prefill_num_tokens_to_capture(list(get_exec().graph.cuda_graph_config.prefill.bs))
    return {
        "chunk": get_schedule().chunked_prefill_size,
        "prefill": list(prefill),
        "decode": list(decode),
        "pool": pool,
    }


def main(argv: list[str]) -> int:
    kv_tokens = 4096
    if argv[:1] == [KV_TOKENS]:
        kv_tokens, argv = int(argv[1]), argv[2:]
    args = prepare_server_args(argv + state_the_box())  # argparse: exits 2 with its message
    try:
        args.resolve_once()
        args.check_server_args()
    except (AssertionError, ValueError, OSError, RuntimeError) as err:
        print(f"{type(err).__name__}: {str(err) or '(an assertion without a message)'}", file=sys.stderr)
        return REFUSED
    try:
        found = captures(args, kv_tokens)
    except Exception as err:  # noqa: BLE001 -- any failure here is reported, with its type, as unreadable
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return UNREADABLE
    print(RESOLVED + json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
