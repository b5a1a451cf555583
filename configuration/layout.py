"""The attention layout a replica runs (GLM5_PROFILE) and the memory arithmetic that picks the attention-DP size.

latency: TP attention over every GPU (attention-DP size 1): each GPU holds every request's MLA cache, one latent row
a token a layer (sglang 0.5.23 mem_cache/kv_cache_configurator.py: not split by heads). throughput: attention
data-parallel over D groups of tp/D GPUs: a group holds only its own requests' cache, but each of its GPUs holds
1/(tp/D) of the attention weights instead of 1/tp, and of the input embedding, which 0.5.23 splits over the
attention-TP group (srt/layers/vocab_parallel_embedding.py, use_attn_tp_group). Per GPU, after the weights, the KV
pool is
    budget - other weights - (attention + embedding) x D / tp,    budget = mem_fraction_static x the GPU's memory,
and the replica holds D pools. Under DP attention each rank's decode graphs gather every group's rows, and 0.5.23's
own reserve for graphs grows by D x max_bs x 3 MB (and x 1.5 more above 300: srt/arg_groups/memory_hook.py
reserve_for_graph_mb): unless GLM5_MEM_FRACTION_STATIC is set, a throughput start gives that much of the static share
back (`mem_fraction`), so the graphs keep the room the latency profile measured for them. `auto` takes the D whose
pools hold the most requests of [gateway].context_tokens.
`pool_tokens` at TP attention and the settings' defaults (`default_pool`) is a replica's pool wherever its own is not
read: the gateway's admission before a replica publishes its own, ci/render's checks and docs/reference.md's sizing
and layout tables (one figure, this arithmetic's: glm5.toml writes none).
The figures are glm5.toml [layout]'s and the checkpoint's dimensions (its config.json when readable): ESTIMATES, to
be measured on the box (ci/bench --sweep).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.report import Problem
from configuration import settings
from configuration.batch_sizes import rank_decode_sizes

GIB = 2**30
MIB = 2**20
DIMENSIONS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
              "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim",
              "vocab_size")  # fmt: skip
ATTENTION_EXCLUDED = "model.layers.*.self_attn*"  # hf_quant_config.json: attention left out of NVFP4 (BF16)
NVFP4_BYTES = 0.5 + 1 / 16  # 4 bits a weight and an 8-bit scale per 16 (group_size 16)


@dataclass(frozen=True)
class Model:
    """The checkpoint's dimensions that the arithmetic reads, and where they came from."""

    dims: Mapping[str, int]
    attention_bf16: bool
    source: str

    def attention_params(self) -> int:
        """Attention weights of every layer (GLM-5's MLA with the DSA indexer), from the config's dimensions: q_a,
        q_b, kv_a (latent and rope), kv_b, o, and the indexer's wq_b, wk and head weights (norms are negligible)."""
        d = self.dims
        heads, hidden, q_rank, kv_rank = (
            d["num_attention_heads"],
            d["hidden_size"],
            d["q_lora_rank"],
            d["kv_lora_rank"],
        )
        qk = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
        layer = (
            hidden * q_rank
            + q_rank * heads * qk
            + hidden * (kv_rank + d["qk_rope_head_dim"])
            + kv_rank * heads * (d["qk_nope_head_dim"] + d["v_head_dim"])
            + heads * d["v_head_dim"] * hidden
            + q_rank * d["index_n_heads"] * d["index_head_dim"]
            + hidden * d["index_head_dim"]
            + hidden * d["index_n_heads"]
        )
        return layer * d["num_hidden_layers"]

    def attention_bytes(self) -> float:
        return self.attention_params() * (2 if self.attention_bf16 else NVFP4_BYTES)

    def embedding_bytes(self) -> float:
        """The input embedding, vocab_size x hidden_size in BF16 (left out of NVFP4)."""
        return 2.0 * self.dims["vocab_size"] * self.dims["hidden_size"]

    def kv_bytes_per_token(self, kv_cache_dtype: str) -> int:
        """One token's cache over every layer: the MLA row (fp8: the latent in fp8 with a 4-byte scale per 128, the
        rope part in bf16, sglang mem_cache/kv_cache_configurator.py; bf16: both in bf16) and the indexer's key
        (fp8 with a 4-byte scale, memory_pool.py)."""
        d = self.dims
        latent, rope = d["kv_lora_rank"], d["qk_rope_head_dim"]
        mla = latent + 4 * (latent // 128) + 2 * rope if kv_cache_dtype == "fp8_e4m3" else 2 * (latent + rope)
        return (mla + d["index_head_dim"] + 4) * d["num_hidden_layers"]


@dataclass(frozen=True)
class Option:
    """One attention-DP size and what it leaves for the KV cache."""

    attn_dp_size: int
    mem_fraction: float  # the static share this size runs with (--mem-fraction-static)
    attention_gib_per_gpu: float
    kv_gib_per_gpu: float
    pool_tokens: int  # one group's pool (every GPU of a group holds the same cache)
    requests: int  # of context_tokens, over the replica's groups

    @property
    def replica_tokens(self) -> int:
        return self.pool_tokens * self.attn_dp_size


@dataclass(frozen=True)
class Layout:
    """The chosen layout: the attention-DP size (1: TP attention) and the arithmetic shown in the dry run."""

    profile: str
    attn_dp_size: int
    options: tuple[Option, ...]
    model_source: str
    how: str  # "auto" or "GLM5_ATTN_DP_SIZE"

    def flags(self) -> list[str]:
        return ["--attn-dp-size", str(self.attn_dp_size)] if self.attn_dp_size > 1 else []

    @property
    def mem_fraction(self) -> float | None:
        """The static share the chosen size runs with; None: the setting's, unchanged (latency)."""
        chosen = [o for o in self.options if o.attn_dp_size == self.attn_dp_size]
        return chosen[0].mem_fraction if chosen and self.attn_dp_size > 1 else None

    def explain(self, context_tokens: int) -> list[str]:
        """The dry run's lines: what each size leaves and which one runs."""
        if self.profile == "latency":
            return [
                "GLM5_PROFILE=latency: TP attention (attention-DP 1); GLM5_PROFILE=throughput runs attention-DP"
            ]
        lines = [
            f"GLM5_PROFILE=throughput: --attn-dp-size {self.attn_dp_size} "
            + (
                "(GLM5_ATTN_DP_SIZE)"
                if self.how != "auto"
                else f"(auto: the most requests of {context_tokens} tokens)"
            )
            + f"; estimates from {self.model_source} and glm5.toml [layout]",
            "  D  static share  attention GiB/GPU  KV GiB/GPU  tokens a group  tokens a replica  requests",
        ]
        for o in self.options:
            mark = "  <- runs" if o.attn_dp_size == self.attn_dp_size else ""
            lines.append(
                f"  {o.attn_dp_size}  {o.mem_fraction:12.2f}  {o.attention_gib_per_gpu:17.2f}  "
                f"{o.kv_gib_per_gpu:10.2f}  {o.pool_tokens:14d}  {o.replica_tokens:16d}  {o.requests:8d}{mark}"
            )
        return lines


def model_of(model_dir: str, recorded: Mapping[str, Any]) -> Model:
    """The checkpoint's dimensions: its config.json (and hf_quant_config.json) when readable, else glm5.toml's."""
    folder = Path(model_dir)
    try:
        found = json.loads((folder / "config.json").read_text())
        dims = {k: int(found[k]) for k in DIMENSIONS}
    except (OSError, ValueError, KeyError, TypeError):
        dims = {k: int(recorded[k]) for k in DIMENSIONS}
        return Model(dims, bool(recorded["attention_bf16"]), "glm5.toml [layout].model (no config.json read)")
    try:
        quant = json.loads((folder / "hf_quant_config.json").read_text())
        excluded = quant["quantization"]["exclude_modules"]
    except (OSError, ValueError, KeyError, TypeError):
        excluded = [ATTENTION_EXCLUDED] if recorded["attention_bf16"] else []
    return Model(dims, ATTENTION_EXCLUDED in excluded, f"{folder / 'config.json'}")


def graph_reserve_mib(size: int, max_bs: int) -> float:
    """What 0.5.23's own reserve for the decode graphs adds under DP attention over `size` groups, in MiB
    (srt/arg_groups/memory_hook.py reserve_for_graph_mb: max_bs x D x 3, and x 1.5 more when max_bs > 300); 0 at D=1."""
    if size <= 1:
        return 0.0
    return max_bs * size * 3 + (max_bs * size * 1.5 if max_bs > 300 else 0.0)


def fraction_for(size: int, values: Mapping[str, Any], layout: Mapping[str, Any], pinned: bool) -> float:
    """The static share a size runs with: GLM5_MEM_FRACTION_STATIC as set, else its default less what the DP
    graphs reserve beyond the latency profile's (rounded down to a hundredth)."""
    base = float(values["mem_fraction_static"])
    if pinned or size <= 1:
        return base
    max_bs = rank_decode_sizes(values, size)[-1]
    return math.floor((base - graph_reserve_mib(size, max_bs) / layout["gpu_memory_mib"]) * 100) / 100


def option(
    model: Model, size: int, values: Mapping[str, Any], layout: Mapping[str, Any], pinned: bool = False
) -> Option:
    fraction = fraction_for(size, values, layout, pinned)
    budget = fraction * layout["gpu_memory_mib"] * MIB
    tp = int(values["gpu_count"])
    split = (model.attention_bytes() + model.embedding_bytes()) / tp  # both split tp ways at D=1
    others = layout["weights_gib_per_gpu"] * GIB - split
    attention = model.attention_bytes() * size / tp
    kv = max(0.0, budget - others - attention - model.embedding_bytes() * size / tp)
    pool = int(kv // model.kv_bytes_per_token(values["kv_cache_dtype"]))
    requests = size * (pool // max(1, int(values["context_tokens"])))  # 0 is refused by admission.drift
    return Option(size, fraction, attention / GIB, kv / GIB, pool, requests)


def pool_tokens(
    values: Mapping[str, Any], config: Mapping[str, Any], size: int = 1, pinned: bool = False
) -> int:
    """One attention group's KV pool in tokens by the estimate (`option`) under the resolved settings `values`, at
    attention-DP `size` (1: TP attention, the replica's whole pool); `pinned`: GLM5_MEM_FRACTION_STATIC was set."""
    model = model_of(values["model_dir"], config["layout"]["model"])
    context = {"context_tokens": config["gateway"]["context_tokens"]}
    return option(model, size, {**values, **context}, config["layout"], pinned).pool_tokens


def default_pool(config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> int:
    """A replica's KV pool at TP attention (the default profile) under the settings' defaults (or `environ`'s):
    docs/reference.md's sizing table, and what ci/render checks [gateway].context_tokens and KEDA's unit against."""
    return pool_tokens(settings.resolve(environ or {}, config, where="ci"), config)


def resolve(values: Mapping[str, Any], config: Mapping[str, Any], fraction_pinned: bool = False) -> Layout:
    """The layout under the resolved settings (`values`: GLM5_PROFILE, GLM5_ATTN_DP_SIZE, the memory fraction, the
    KV dtype and [gateway].context_tokens; `fraction_pinned`: GLM5_MEM_FRACTION_STATIC was set, and every size runs
    with it); raises a Problem naming the setting when they disagree."""
    layout = config["layout"]
    profile, pinned = values["profile"], values["attn_dp_choice"]
    if profile == "latency":
        if pinned != "auto":
            raise Problem(
                "GLM5_ATTN_DP_SIZE",
                f"{pinned} applies to DP attention only, and GLM5_PROFILE is latency",
                "set GLM5_PROFILE=throughput, or unset GLM5_ATTN_DP_SIZE",
            )
        return Layout(profile, 1, (), "", "latency")
    model = model_of(values["model_dir"], layout["model"])
    context = {"context_tokens": config["gateway"]["context_tokens"]}
    tp = int(values["gpu_count"])
    sizes = [1, *(int(size) for size in layout["attn_dp_sizes"] if tp % int(size) == 0 and int(size) <= tp)]
    if pinned != "auto" and int(pinned) not in sizes:
        raise Problem(
            "GLM5_ATTN_DP_SIZE",
            f"{pinned} does not divide the {tp} GPUs into attention groups",
            f"use one of {', '.join(str(s) for s in sizes[1:]) or 'none: GLM5_PROFILE=latency'}, or auto",
        )
    options = tuple(option(model, size, {**values, **context}, layout, fraction_pinned) for size in sizes)
    if pinned != "auto":
        runs = next(o for o in options if o.attn_dp_size == int(pinned))
        if runs.pool_tokens <= 0:
            raise Problem(
                "GLM5_ATTN_DP_SIZE",
                f"{pinned} leaves no KV cache by the estimate: at a static share of {runs.mem_fraction:.2f} its "
                f"attention, embedding and other weights take all of it (`entrypoint/launch --dry-run` shows each size)",
                "choose a smaller size (or auto), or set GLM5_MEM_FRACTION_STATIC yourself",
            )
        return Layout(profile, int(pinned), options, model.source, "GLM5_ATTN_DP_SIZE")
    best = max(options[1:], key=lambda o: (o.requests, -o.attn_dp_size))
    return Layout(profile, best.attn_dp_size, options, model.source, "auto")
