"""The CUDA graph batch sizes SGLang 0.5.23 captures, by the same rule as
sglang.srt.arg_groups.cuda_graph_hook (generate_{decode,prefill}_cuda_graph_batch_sizes), then, under DP attention,
clamped to each rank's request pool and aligned to its attention-TP size as the runners do
(model_executor/runner/base_cuda_graph_runner.py get_batch_sizes_to_capture, prefill_cuda_graph_runner.py
get_prefill_num_tokens_to_capture). tests/test_launch.py compares these with the real functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SPECULATIVE_DEFAULT_MAX_RUNNING = 48  # sglang caps running requests at 48 with speculative decoding
# A rank's request pool when max_running_requests is unset: at least 2048 (mem_cache/kv_cache_configurator.py
# resolve_max_num_reqs: max(min(tokens / context_len x 512, 4096), 2048), under half its token capacity), above any
# decode batch the kit captures (GLM5_CUDA_GRAPH_MAX_BS_DECODE <= 1024): no clamp.
POOL_FLOOR = 2048


def decode_batch_sizes(max_bs: int, speculative: bool = False) -> list[int]:
    if speculative:
        sizes = (
            list(range(1, 9))
            + list(range(10, 33, 2))
            + list(range(40, 65, 4))
            + list(range(72, 257, 8))
            + list(range(272, max_bs + 1, 16))
        )
    else:
        sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
        sizes += list(range(512, max_bs + 1, 32))
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def prefill_token_sizes(max_tokens: int) -> list[int]:
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in sizes if s <= max_tokens]


def effective_decode_max_bs(max_bs: int, speculative: bool, max_running_requests: int | None) -> int:
    """The largest decode batch that can be captured: running requests cap it."""
    cap = max_running_requests
    if cap is None and speculative:
        cap = SPECULATIVE_DEFAULT_MAX_RUNNING
    return min(max_bs, cap) if cap else max_bs


def rank_pool(max_running_requests: int | None, speculative: bool, attn_dp_size: int) -> int:
    """One rank's request pool: the running requests split over the attention-DP groups
    (kv_cache_configurator.py resolve_max_num_reqs: max_running_requests // attn_dp_size), else the floor."""
    running = max_running_requests or (SPECULATIVE_DEFAULT_MAX_RUNNING if speculative else None)
    return max(1, running // attn_dp_size) if running else POOL_FLOOR


def alignment(tp_size: int, attn_dp_size: int) -> int:
    """Decode batches and prefill shapes are multiples of the attention-TP size under DP attention (the MLP input is
    gathered: utils/common.py require_mlp_tp_gather, get_cuda_graph_batch_size_alignment); 1 under TP attention."""
    return tp_size // attn_dp_size if attn_dp_size > 1 else 1


def ceil_align(n: int, base: int) -> int:
    return -(-n // base) * base


def decode_capture_sizes(
    max_bs: int, speculative: bool, max_running_requests: int | None, attn_dp_size: int = 1, tp_size: int = 8
) -> list[int]:
    """The decode batch sizes every rank captures."""
    listed = decode_batch_sizes(
        effective_decode_max_bs(max_bs, speculative, max_running_requests), speculative
    )
    if attn_dp_size == 1:
        return listed
    base = alignment(tp_size, attn_dp_size)
    top = ceil_align(rank_pool(max_running_requests, speculative, attn_dp_size), base)
    found = listed + ([top] if max(listed) > top else [])
    return sorted({bs for bs in found if bs % base == 0 and bs <= top})


def rank_decode_sizes(values: Mapping[str, Any], attn_dp_size: int = 1) -> list[int]:
    """decode_capture_sizes under resolved settings (configuration/settings.py values): the graph cap, speculative
    decoding, the running-request cap and the GPU count, for `attn_dp_size` groups."""
    return decode_capture_sizes(
        values["cuda_graph_max_bs_decode"], values["speculative"] != "off", values["max_running_requests"],
        attn_dp_size, int(values["gpu_count"]),
    )  # fmt: skip


def prefill_capture_sizes(max_tokens: int, attn_dp_size: int = 1, tp_size: int = 8) -> list[int]:
    """The prefill token shapes every rank captures: each aligned up to the attention-TP size."""
    base = alignment(tp_size, attn_dp_size)
    return sorted({ceil_align(n, base) for n in prefill_token_sizes(max_tokens)})
