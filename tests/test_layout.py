"""GLM5_PROFILE: the attention layout, the memory arithmetic that picks the attention-DP size, and its refusals."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from common.report import Problems
from configuration import admission, config, layout, settings
from configuration.batch_sizes import rank_decode_sizes
from conftest import ROOT, kit_env
from gateway import launch

FIXTURE = ROOT / "tests/fixtures/glm5-config"
THROUGHPUT = {"GLM5_PROFILE": "throughput"}


def test_the_recorded_dimensions_are_the_checkpoints() -> None:
    """glm5.toml [layout].model stands in for config.json away from the weights: it must say what the checkpoint
    says, the BF16 attention included (hf_quant_config.json leaves self_attn out of NVFP4)."""
    recorded = settings.load_config()["layout"]["model"]
    read = layout.model_of(str(FIXTURE), recorded)
    assert read.source.endswith("config.json")
    found = json.loads((FIXTURE / "config.json").read_text())
    assert {k: found[k] for k in layout.DIMENSIONS} == {k: recorded[k] for k in layout.DIMENSIONS}
    assert read.attention_bf16 is recorded["attention_bf16"] is True


def test_attention_weights_and_the_cache_a_token_from_the_config() -> None:
    model = layout.model_of(str(FIXTURE), settings.load_config()["layout"]["model"])
    assert model.attention_params() == 13_602_521_088  # ~13.6B: 27.2 GB in BF16, 3.4 GB a GPU at TP8
    # fp8: 656 B of MLA (512 + 4 x 4 scales + 64 x 2 rope) and 132 B of indexer key a layer, 78 layers
    assert model.kv_bytes_per_token("fp8_e4m3") == (656 + 132) * 78 == 61_464


def test_throughput_picks_the_size_whose_groups_hold_the_most_requests() -> None:
    """Each GPU of an attention-DP group holds 1/(8/D) of the BF16 attention weights and of the input embedding
    (0.5.23 splits it over the attention-TP group): the cache a GPU keeps shrinks by 1/8 of them per step of D. Without
    them in the arithmetic every D would keep the same pool and D=8 would look 8 times better."""
    pinned = config.resolve(THROUGHPUT | {"GLM5_MEM_FRACTION_STATIC": "0.80"}).layout
    by_size = {o.attn_dp_size: o for o in pinned.options}
    step = by_size[1].kv_gib_per_gpu - by_size[2].kv_gib_per_gpu
    assert step == pytest.approx((25.34 + 1.77) / 8, abs=0.01)  # attention and embedding's 1/8, in GiB
    assert by_size[8].kv_gib_per_gpu == pytest.approx(by_size[1].kv_gib_per_gpu - 7 * step)
    assert {o.mem_fraction for o in pinned.options} == {0.80}  # set by the operator: every size runs with it


def test_each_dp_size_gives_back_what_its_decode_graphs_reserve() -> None:
    """Issue 52: under DP attention each rank's decode graphs gather every group's rows, and 0.5.23's own reserve
    for graphs grows by D x max_bs x 4.5 MB above 300 (srt/arg_groups/memory_hook.py reserve_for_graph_mb: 11,776 MB
    at D=4 against 2,560 at D=1); the throughput profile kept 0.80 and spent that room on KV. Unless the operator sets
    GLM5_MEM_FRACTION_STATIC, each size now runs with 0.80 less it, and the choice follows (estimates)."""
    assert layout.graph_reserve_mib(4, 512) == 11_776 - 2_560 and layout.graph_reserve_mib(1, 512) == 0
    chosen = config.resolve(THROUGHPUT).layout
    by_size = {o.attn_dp_size: o for o in chosen.options}
    assert [by_size[d].mem_fraction for d in (1, 2, 4, 8)] == [0.80, 0.75, 0.70, 0.61]
    assert [by_size[d].requests for d in (1, 2, 4, 8)] == [26, 34, 20, 0]  # of 16k tokens: estimates
    assert chosen.attn_dp_size == 2
    argv = config.resolve(THROUGHPUT).argv
    assert argv[argv.index("--attn-dp-size") + 1] == "2"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.75"
    latency = config.resolve({}).argv
    assert latency[latency.index("--mem-fraction-static") + 1] == "0.8"  # the setting, as given
    with pytest.raises(Problems) as err:
        config.resolve(THROUGHPUT | {"GLM5_ATTN_DP_SIZE": "8"})
    assert "GLM5_ATTN_DP_SIZE: 8 leaves no KV cache by the estimate: at a static share of 0.61" in str(
        err.value
    )


def test_a_pinned_size_wins_and_latency_runs_tp_attention() -> None:
    pinned = config.resolve(THROUGHPUT | {"GLM5_ATTN_DP_SIZE": "4"})
    assert pinned.layout.attn_dp_size == 4 and pinned.layout.how == "GLM5_ATTN_DP_SIZE"
    latency = config.resolve({})
    assert "--attn-dp-size" not in latency.argv and latency.state({})["attn_dp_size"] == 1


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"GLM5_ATTN_DP_SIZE": "4"}, "GLM5_ATTN_DP_SIZE: 4 applies to DP attention only"),
        (
            {"GLM5_PROFILE": "fast"},
            "GLM5_PROFILE: 'fast' is not a choice; fix: use one of latency, throughput",
        ),
        (
            {"GLM5_EXTRA_ARGS": "--enable-dp-attention --dp-size 8"},
            "fix: DP attention is GLM5_PROFILE=throughput",
        ),
        ({"GLM5_EXTRA_ARGS": "--data-parallel-size 8"}, "fix: DP attention is GLM5_PROFILE=throughput"),
        (
            {"GLM5_EXTRA_ARGS": "--attn-dp-size 8"},
            "--attn-dp-size is set by the configuration; fix: use GLM5_PROFILE",
        ),
        (
            {"GLM5_EXTRA_ARGS": "--attention-data-parallel-size 2"},
            "sglang's other name of --attn-dp-size, is set by the configuration; fix: use GLM5_PROFILE",
        ),
    ],
)
def test_dp_attention_anywhere_else_is_refused_with_the_setting(env: dict[str, str], said: str) -> None:
    with pytest.raises(Problems) as err:
        config.resolve(env)
    assert said in str(err.value)


def test_the_dry_run_shows_the_arithmetic_that_chose_the_size() -> None:
    done = subprocess.run(
        [str(ROOT / "entrypoint/launch"), "--dry-run"],
        capture_output=True,
        text=True,
        env=kit_env(GLM5_PROFILE="throughput", GLM5_MODEL_DIR=str(FIXTURE)),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert " --attn-dp-size 2" in done.stdout.splitlines()[0]
    assert " --mem-fraction-static 0.75" in done.stdout.splitlines()[0]
    assert f"estimates from {FIXTURE}/config.json" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("#   ")]
    assert [r[1] for r in rows[1:]] == ["1", "2", "4", "8"] and rows[2][-2:] == ["<-", "runs"]
    assert [r[2] for r in rows[1:]] == ["0.80", "0.75", "0.70", "0.61"]  # each size's static share
    # SGLang divides the chunk by the 2 groups and clamps the prefill shapes to it (tests/test_launch.py RESOLVED)
    assert "# decode graphs expected 50 a rank (4..512), prefill shapes 50" in done.stdout


def test_a_replicas_kv_pool_is_one_figure_the_layouts() -> None:
    """Issue 53 (G): glm5.toml's [gateway].kv_tokens (412,160: 25 requests of 16k) beside the layout's TP-attention
    pool (427,550: 26). One figure now, the layout's estimate at the defaults: glm5.toml writes none, the gateway counts
    it for a replica that has not said its own pool, and docs/reference.md's sizing and layout tables both show it."""
    cfg = settings.load_config()
    pool, context = layout.default_pool(cfg), cfg["gateway"]["context_tokens"]
    assert "kv_tokens" not in cfg["gateway"], "a hand-written pool beside the layout's arithmetic"
    values = settings.resolve({})
    share = admission.per_replica(rank_decode_sizes(values, 1)[-1], pool, context)
    assert launch.slots(values)(None) == share  # the gateway's bound before a replica answers
    text = (ROOT / "docs/reference.md").read_text()
    sizing = re.search(r"\(fp8 KV cache, ([\d,]+) tokens\)", text)
    tp = re.search(r"^\| TP \(`latency`\) \| [^|]+\| [^|]+\| ([\d,]+) \|((?: \d+ \|)+)$", text, re.M)
    held = re.search(rf"^\| {context:,} \(the gateway's `context_tokens`\) \| (\d+) \|", text, re.M)
    assert sizing and tp and held, "docs/reference.md's sizing or layouts table changed shape"
    assert int(sizing[1].replace(",", "")) == int(tp[1].replace(",", "")) == pool
    head = text[: tp.start()].rsplit("\n| attention |", 1)[1].split("\n", 1)[0]
    column = [c.strip() for c in head.split("|")[3:-1]].index(f"requests of {context:,}")
    assert int(held[1]) == int(tp[2].split("|")[column]) == share
