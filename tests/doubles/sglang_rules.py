"""SGLang 0.5.23's CUDA graph capture sizes, restated for the server test double.

Read from sglang 0.5.23, ``sglang/srt/arg_groups/cuda_graph_hook.py``:

- ``generate_decode_cuda_graph_batch_sizes(server_args, max_bs)``: the decode batch sizes. Without
  speculative decoding: 1, 2, 4, 8, 12, then 16..256 by 8, 272..496 by 16, 512..max_bs by 32. With a
  ``speculative_algorithm``: 1..8 by 1, 10..32 by 2, 40..64 by 4, 72..256 by 8, 272..max_bs by 16.
  Sizes above max_bs are dropped and max_bs itself is appended when it is not already there.
  (``disable_cuda_graph_padding`` gives 1..max_bs; the double never uses it, so it is not modelled.)
- ``generate_prefill_cuda_graph_batch_sizes(max_bs)``: the prefill token counts, 4..32 by 4,
  48..256 by 16, 288..512 by 32, 576..1024 by 64, 1280..4096 by 256, 4608..max by 512, keeping
  those <= max. Unlike decode, the maximum itself is not appended.

Their caller, ``memory_hook.py`` (``_handle_gpu_memory_settings``), picks the maxima: decode max_bs
is ``--cuda-graph-max-bs-decode`` or a GPU-memory default, lowered to ``max_running_requests`` only
when it was defaulted (speculative decoding sets max_running_requests to 48 unless given); prefill
max is ``--cuda-graph-max-bs-prefill`` or chunked_prefill_size, capped at 8192 for MLA models.

This copy is deliberately independent of the kit (``configuration/batch_sizes.py``), so a mistake in
the kit's rule cannot hide behind the double. tests/test_double.py checks it against SGLang itself.
"""

from __future__ import annotations

# (first, last, step) runs; last=None means "up to the maximum".
Run = tuple[int, int | None, int]

_DECODE_RUNS: tuple[Run, ...] = (
    (1, 2, 1),
    (4, 12, 4),
    (16, 256, 8),
    (272, 496, 16),
    (512, None, 32),
)
_SPECULATIVE_DECODE_RUNS: tuple[Run, ...] = (
    (1, 8, 1),
    (10, 32, 2),
    (40, 64, 4),
    (72, 256, 8),
    (272, None, 16),
)
_PREFILL_RUNS: tuple[Run, ...] = (
    (4, 32, 4),
    (48, 256, 16),
    (288, 512, 32),
    (576, 1024, 64),
    (1280, 4096, 256),
    (4608, None, 512),
)


def _expand(runs: tuple[Run, ...], maximum: int) -> list[int]:
    """Every value of the runs that is at most ``maximum``, in ascending order."""
    sizes: list[int] = []
    for first, last, step in runs:
        end = maximum if last is None else min(last, maximum)
        sizes.extend(range(first, end + 1, step))
    return sizes


def decode_batch_sizes(max_bs: int, speculative: bool = False) -> list[int]:
    """Decode batch sizes SGLang 0.5.23 captures for this max_bs (ascending, max_bs last)."""
    sizes = _expand(_SPECULATIVE_DECODE_RUNS if speculative else _DECODE_RUNS, max_bs)
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def prefill_token_sizes(max_tokens: int) -> list[int]:
    """Prefill token counts SGLang 0.5.23 captures for this maximum (ascending; may stop below it)."""
    return _expand(_PREFILL_RUNS, max_tokens)
