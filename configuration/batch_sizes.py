"""The CUDA graph batch sizes SGLang 0.5.23 captures, by the same rule as
sglang.srt.arg_groups.cuda_graph_hook (generate_{decode,prefill}_cuda_graph_batch_sizes).
tests/test_launch.py compares these with the real functions."""

from __future__ import annotations

SPECULATIVE_DEFAULT_MAX_RUNNING = 48  # sglang caps running requests at 48 with speculative decoding


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
