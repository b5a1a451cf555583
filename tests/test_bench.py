"""ci/bench: the command line, bench_serving's real output, sweep files, the table and plot, and end-to-end
runs of the real sglang 0.5.23 bench_serving against the server test double."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from ci import bench, readiness
from configuration import config
from conftest import ROOT
from helpers.container import Container, environment, free_port, start

pytestmark = pytest.mark.boots  # boots processes or runs real tools: not in ci/test --fast

BENCH = ROOT / "ci" / "bench"
BENCH_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
FIXTURES = ROOT / "tests" / "fixtures" / "bench"


def test_bench_serving_command_line() -> None:
    argv = bench.bench_argv(
        ["python3"],
        "http://127.0.0.1:30000",
        bench.Workload(),
        "/models/GLM-5-NVFP4",
        "glm-5",
        "/tmp/o.jsonl",
    )
    assert argv[:3] == ["python3", "-m", "sglang.bench_serving"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs["--max-concurrency"] == "1024" and pairs["--num-prompts"] == "4096"
    assert pairs["--random-input-len"] == "1024" and pairs["--random-output-len"] == "1024"
    assert pairs["--dataset-name"] == "random-ids" and pairs["--backend"] == "sglang"


def test_parses_bench_servings_real_output() -> None:
    result = bench.parse_result((FIXTURES / "bench_serving-0.5.23-against-double.jsonl").read_text())
    stdout = (FIXTURES / "bench_serving-0.5.23-against-double.stdout").read_text()
    # The JSON record and the printed summary of the same run agree.
    assert f"Output token throughput (tok/s):         {result['output_throughput']:.2f}" in stdout
    assert f"Median TTFT (ms):                        {result['median_ttft_ms']:.2f}" in stdout
    assert result["completed"] == 20


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "no result line"), ('{"completed": 3}\n', "lacks"), ("not json\n", "Expecting value")],
)
def test_bad_bench_output_is_refused(text: str, message: str) -> None:
    with pytest.raises((bench.BenchError, ValueError), match=message):
        bench.parse_result(text)


def test_zero_completed_requests_is_a_failure() -> None:
    record = json.loads(
        (FIXTURES / "bench_serving-0.5.23-against-double.jsonl").read_text().replace("Infinity", "1e999")
    )
    record["completed"] = 0
    with pytest.raises(bench.BenchError, match="completed no request"):
        bench.parse_result(json.dumps(record))


def test_shipped_sweep_variants_are_valid_configurations() -> None:
    """Every variant is a configuration the entrypoint accepts (GLM5_PROFILE, GLM5_ATTN_DP_SIZE and GLM5_ALLREDUCE
    are declared in entrypoint/glm5.toml: until they are, the layout variants fail here)."""
    workload, variants, baseline = bench.load_sweep(ROOT / "ci" / "sweep-sm120.toml")
    assert baseline == 3028 and workload.concurrency == 1024
    assert [v.name for v in variants[:5]] == LAYOUTS and "baked" in [v.name for v in variants]
    for variant in variants:
        assert len(variant.reason) > 20
        effective = config.resolve(variant.env)  # the entrypoint would accept it
        assert effective.argv
    expected = {v.name: len(config.resolve(v.env).decode_sizes) for v in variants}
    assert (
        expected["baked"] == 52
        and expected["decode-max-bs-256"] == 36
        and expected["decode-max-bs-768"] == 60
    )


LAYOUTS = ["tp-attention", "tp-attention-ipc", "dp-attention-2", "dp-attention-4", "dp-attention-8"]


def test_the_sweep_tries_each_attention_layout_with_its_all_reduce_and_accepts_no_partial_capture() -> None:
    """The layouts x all-reduce first; DP attention on NCCL, as GLM5_ALLREDUCE=auto keeps it there, and once with the
    kernels forced on its DP gathers, each at its memory fraction; no variant is called ready with fewer graphs than
    it asked for."""
    text = (ROOT / "ci" / "sweep-sm120.toml").read_text()
    assert "GLM5_ACCEPT_PARTIAL_CAPTURE" not in text
    _, variants, _ = bench.load_sweep(ROOT / "ci" / "sweep-sm120.toml")
    env = {v.name: v.env for v in variants}
    assert not {"dp-attention", "pcie-ipc-allreduce"} & set(env)
    assert env["tp-attention"] == {"GLM5_PROFILE": "latency", "GLM5_ALLREDUCE": "nccl"}
    assert env["tp-attention-ipc"] == {"GLM5_PROFILE": "latency", "GLM5_ALLREDUCE": "auto"}
    for size, fraction in (("2", "0.80"), ("4", "0.80"), ("8", "0.90")):
        assert env[f"dp-attention-{size}"] == {"GLM5_PROFILE": "throughput", "GLM5_ATTN_DP_SIZE": size,
                                               "GLM5_ALLREDUCE": "nccl", "GLM5_MEM_FRACTION_STATIC": fraction}  # fmt: skip
    reasons = {v.name: v.reason for v in variants}
    assert env["dp-attention-4-ipc"] == env["dp-attention-4"] | {"GLM5_ALLREDUCE": "pcie_ipc"}
    assert "_ELIGIBLE_GROUP_NAMES" in reasons["dp-attention-2"] and "SUM_LEN" in reasons["dp-attention-2"]
    assert "attention weights whole" in reasons["dp-attention-8"]


def test_the_published_shapes_in_order_each_with_its_figure_and_source() -> None:
    shapes, judged = bench.load_shapes(ROOT / "ci" / "sweep-sm120.toml")
    lengths = [(s.name, s.input_len, s.output_len, s.concurrency) for s in shapes]
    assert lengths == [("1k-8k-c512", 1024, 8192, 512), ("8k-1k-c1024", 8192, 1024, 1024),
                       ("1k-1k-c1024", 1024, 1024, 1024)]  # fmt: skip
    assert judged == "1k-1k-c1024"
    published = {s.name: (s.published_output_tok_s, s.published) for s in shapes}
    assert (
        published["1k-8k-c512"][0] == 1490.31 and "2,675 output / 3,012 total" in published["1k-8k-c512"][1]
    )
    assert "cookbook" in published["8k-1k-c1024"][1] and "#28437" in published["8k-1k-c1024"][1]
    assert (
        published["1k-1k-c1024"][0] == 3028 and "did not say output or total" in published["1k-1k-c1024"][1]
    )


def args_for(**given: Any) -> Any:
    return type("Args", (), {k: given.get(k) for k in ("shape", *bench.OVERRIDES)})()


def test_every_shape_runs_by_default_one_with_shape_and_given_lengths_make_one_of_their_own() -> None:
    shapes, _ = bench.load_shapes(ROOT / "ci" / "sweep-sm120.toml")
    every = bench.plan(args_for(), bench.Workload(), shapes, 3028)
    assert [(j.name, j.workload.input_len, j.workload.output_len, j.baseline) for j in every] == [
        ("1k-8k-c512", 1024, 8192, 1490.31), ("8k-1k-c1024", 8192, 1024, 1472), ("1k-1k-c1024", 1024, 1024, 3028)]  # fmt: skip
    assert [bench.stem("baked", j, every) for j in every] == [
        "baked.1k-8k-c512",
        "baked.8k-1k-c1024",
        "baked.1k-1k-c1024",
    ]
    one = bench.plan(args_for(shape="8k-1k-c1024", num_prompts=8), bench.Workload(), shapes, 3028)
    assert [(j.name, j.workload.concurrency, j.workload.num_prompts) for j in one] == [
        ("8k-1k-c1024", 1024, 8)
    ]
    assert bench.stem("baked", one[0], one) == "baked"  # one run: the file name it always had
    own = bench.plan(args_for(concurrency=4), bench.Workload(), shapes, 3028)
    assert [(j.name, j.shape, j.workload.concurrency, j.workload.input_len, j.baseline) for j in own] == [
        ("custom", None, 4, 1024, 3028)]  # fmt: skip
    with pytest.raises(bench.BenchError, match="--shape 'nope': use one of"):
        bench.plan(args_for(shape="nope"), bench.Workload(), shapes, 3028)


METRICS_TEXT = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="glm-5",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="glm-5",moe_ep_rank="0",pp_rank="0",tp_rank="4"} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="glm-5",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 7.0
sglang:num_running_reqs_offline_batch{engine_type="unified"} 9.0
"""


def test_running_and_queued_requests_come_from_sglangs_gauges_summed_over_dp_groups() -> None:
    assert bench.gauges(METRICS_TEXT) == {"running": 5.0, "queued": 7.0}
    assert bench.gauges("smg_http_requests_total 3\n") is None  # a gateway's /metrics: not SGLang's


def test_kv_bound_when_requests_queued_while_the_running_never_reached_the_concurrency() -> None:
    w = bench.Workload(concurrency=4, num_prompts=12)
    bound = bench.load_report(
        [{"running": 0, "queued": 0}, {"running": 2, "queued": 2}, {"running": 2, "queued": 1}], w
    )
    assert bound == {"samples": 3, "running_max": 2, "queued_max": 2, "kv_bound": True}
    # a start queues requests for their prefill batch, then all of them run: not KV-bound
    ramp = [{"running": 1, "queued": 3}, {"running": 4, "queued": 0}]
    assert bench.load_report(ramp, w)["kv_bound"] is False
    assert bench.load_report([{"running": 2, "queued": 0}], w)["kv_bound"] is False
    assert bench.load_report([], w)["kv_bound"] is None


def test_the_sweep_report_ends_with_the_winner_at_its_shape_and_its_settings() -> None:
    shapes, _ = bench.load_shapes(ROOT / "ci" / "sweep-sm120.toml")
    jobs = bench.plan(args_for(), bench.Workload(), shapes, 3028)

    def run(label: str, tok: float | None, shape: bench.Shape, env: dict[str, str]) -> dict[str, Any]:
        return fake_run(label, tok) | {"shape": asdict(shape), "variant": {"name": label, "env": env}}

    dp4 = {"GLM5_PROFILE": "throughput", "GLM5_ATTN_DP_SIZE": "4"}
    runs = [run("baked", 1700.0, shapes[0], {}), run("dp-attention-4", 1500.0, shapes[0], dp4),
            run("baked", 2900.0, shapes[2], {}), run("dp-attention-4", 3100.0, shapes[2], dp4),
            run("mem-0.85", None, shapes[2], {"GLM5_MEM_FRACTION_STATIC": "0.85"})]  # fmt: skip
    text = bench.report(runs, jobs, "1k-1k-c1024")
    assert text.index("### 1k-8k-c512") < text.index("### 8k-1k-c1024") < text.index("### 1k-1k-c1024")
    assert "Published: on this box: GLM-5.1-NVFP4 TP8+MTP 1,490 output" in text
    assert "| baked | 1,700 | 1.14x |" in text  # against the shape's published 1,490
    lines = text.rstrip("\n").splitlines()
    assert lines[-3].startswith("Winner at 1k-1k-c1024 (most output tok/s among the variants that passed")
    assert "dp-attention-4, 3,100 output tok/s" in lines[-3]
    assert lines[-2:] == ["GLM5_PROFILE=throughput", "GLM5_ATTN_DP_SIZE=4"]
    assert bench.winner(runs, "1k-8k-c512").endswith(
        "baked, 1,700 output tok/s; the shipped defaults: glm5.env needs no line.\n"
    )
    assert "none" in bench.winner(runs, "8k-1k-c1024")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[variant]]\nname = "Bad Name"\nreason = "x"\n', "must be lowercase"),
        ('[[variant]]\nname = "a"\nreason = ""\n', "give a reason"),
        ('[[variant]]\nname = "a"\nreason = "r"\n[[variant]]\nname = "a"\nreason = "r"\n', "appears twice"),
        ('[workload]\nconcurrency = 0\n[[variant]]\nname = "a"\nreason = "r"\n', "must be positive"),
        ('[[variant]]\nname = "a"\nreason = "r"\nenv = { X = 1 }\n', "must be strings"),
        ("", r"no \[\[variant\]\]"),
        ("[[variant]\n", "--sweep"),
    ],
)
def test_bad_sweep_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    with pytest.raises(bench.BenchError, match=message):
        bench.load_sweep(path)


def fake_run(label: str, tok: float | None) -> dict[str, Any]:
    result = None
    if tok is not None:
        result = {k: 1.0 for k in bench.METRICS} | {
            "output_throughput": tok,
            "p99_ttft_ms": 900.0,
            "p99_itl_ms": 45.0,
        }
    return {
        "label": label,
        "result": result,
        "error": None if tok else "did not become healthy: out of memory",
    }


def test_table_and_plot(tmp_path: Path) -> None:
    runs = [fake_run("baked", 3100.0), fake_run("mem-0.85", 3350.5), fake_run("decode-max-bs-768", None)]
    text = bench.table(runs, 3028)
    assert "| baked | 3,100 | 1.02x |" in text
    assert "| mem-0.85 | 3,350 | 1.11x |" in text or "| mem-0.85 | 3,351 | 1.11x |" in text
    assert "| decode-max-bs-768 | - | - | - | - | - | failed: did not become healthy: out of memory |" in text
    png = tmp_path / "sweep.png"
    assert bench.plot(runs, 3028, png) == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_sweep_without_matplotlib_keeps_its_table_and_says_why_there_is_no_chart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host Python without matplotlib crashed at the end of a sweep of hours; now the chart alone is left out."""
    monkeypatch.setattr(bench, "plt", None)
    said = bench.plot([fake_run("baked", 3100.0)], 3028, tmp_path / "sweep.png")
    assert "matplotlib is not installed" in said and not (tmp_path / "sweep.png").exists()


needs_bench_venv = pytest.mark.skipif(
    not BENCH_PYTHON.exists() and os.environ.get("CI") != "true",
    reason=".venv-bench missing: run ci/setup-test-env",
)


SMALL = ("--concurrency", "4", "--input-len", "32", "--output-len", "8", "--num-prompts", "12")


def run_bench(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, small: tuple[str, ...] = SMALL
) -> subprocess.CompletedProcess[str]:
    tokenizer = tmp_path / "tokenizer"  # written with .venv-bench's tokenizers, which bench_serving loads
    subprocess.run(
        [str(BENCH_PYTHON), str(ROOT / "tests/helpers/tiny_tokenizer.py"), str(tokenizer)],
        check=True,
        capture_output=True,
    )
    full = os.environ | {"GLM5_BENCH_PYTHON": str(BENCH_PYTHON)} | (env or {})
    return subprocess.run(
        [str(BENCH), "--out", str(tmp_path / "out"), "--tokenizer", str(tokenizer), *small, *args],
        capture_output=True, text=True, env=full, check=False, timeout=600,
    )  # fmt: skip


@needs_bench_venv
def test_bench_url_end_to_end_with_a_local_sharegpt_file(tmp_path: Path, containers: list[Container]) -> None:
    """The real bench_serving against a server it did not start, with its key, on `--dataset random` sampled from a
    local ShareGPT file: no download at all (with the file given, nothing is fetched: offline; online, each Hub
    lookup waited out its timeout, 50 s here). One run for both (each boots a server and imports bench_serving);
    the default dataset runs end to end in the sweep below."""
    (tmp_path / "server").mkdir()
    key = "bench-key-0123456789abcdef"
    c = start(
        tmp_path / "server", GLM5_API_KEY=key, GLM5_VERIFY="off"
    )  # (no verification: not what is tested)
    containers.append(c)
    c.wait_healthy()
    sharegpt = tmp_path / "sharegpt.json"
    turns = [
        {"from": "human", "value": "tell me about the sea " * 8},
        {"from": "gpt", "value": "the sea " * 8},
    ]
    sharegpt.write_text(json.dumps([{"id": str(i), "conversations": turns} for i in range(40)]))
    url = f"http://127.0.0.1:{c.port}"
    done = run_bench(
        tmp_path,
        *("--url", url, "--dataset", "random", "--dataset-path", str(sharegpt), "--label", "double"),
        env={"GLM5_API_KEY": key},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = (tmp_path / "out" / "double.json").read_text()
    record = json.loads(text)
    # The configuration of a server it did not start: /server_info, fetched with the key, its secrets redacted.
    assert record["configuration"]["tp_size"] == 8 and record["configuration"]["api_key"] == "(redacted)"
    assert key not in text
    assert record["result"]["completed"] == 12 and record["result"]["output_throughput"] > 0
    assert record["workload"]["concurrency"] == 4 and record["baseline_output_tok_s"] == 3028
    assert record["workload"]["dataset"] == "random"
    # /server_info of the double, not a real server
    assert record["versions"]["sglang"] == "sglang-server-double"
    assert "output tok/s" in done.stdout
    conn = readiness.Connection(url, None)
    assert "HF_HUB_OFFLINE" in bench.bench_env(conn, bench.Workload())
    assert "HF_HUB_OFFLINE" not in bench.bench_env(conn, bench.Workload(dataset="random"))
    local = bench.Workload(dataset="random", dataset_path=str(sharegpt))
    assert bench.bench_env(conn, local)["HF_HUB_OFFLINE"] == "1"


SWEEP = """
[[shape]]
name = "tiny"
concurrency = 4
input_len = 32
output_len = 16
num_prompts = 12
published_output_tok_s = 50
published = "a figure of this test's"
[[variant]]
name = "mem-0.85"
reason = "more KV cache"
env = { GLM5_MEM_FRACTION_STATIC = "0.85" }
[[variant]]
name = "oom"
reason = "runs out of memory in capture"
env = { SGLANG_DOUBLE_MODE = "oom-capture", GLM5_START_RETRIES = "0" }
"""


@needs_bench_venv
def test_sweep_end_to_end_on_the_box_double_names_the_kv_bound_and_the_winner(tmp_path: Path) -> None:
    """On the box's figures (the server double's mode box) with a KV pool of 130 tokens, which holds two of the
    four concurrent requests (the double counts 4 characters a token): the rest queue inside the server, and its
    /metrics gauges say so. The winner is the variant that passed the healthcheck; one that never became healthy
    is no candidate (which of several wins: test_the_sweep_report_ends_with_the_winner_at_its_shape_and_its_settings;
    each healthy variant boots a server and runs bench_serving, about 20 s here: one is enough)."""
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP)
    port = free_port()
    box = {"SGLANG_DOUBLE_MODE": "box", "SGLANG_DOUBLE_MAX_TOTAL_TOKENS": "130", "GLM5_VERIFY": "off"}
    env = environment(tmp_path, port) | box  # (verification's long prompts would take the box's time)
    url = f"http://127.0.0.1:{port}"
    done = run_bench(tmp_path, "--sweep", str(sweep), "--launcher", "local", "--url", url, "--timeout", "60",
                     "--poll", "0.2", env=env, small=())  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    out = tmp_path / "out"
    table = (out / "sweep.md").read_text()
    assert table.startswith(
        "### tiny: 32 in / 16 out at 4 concurrent\n\nPublished: a figure of this test's\n"
    )
    assert (
        "| oom | - |" in table
        and "failed: did not become healthy: traceback: torch.OutOfMemoryError" in table
    )
    run = json.loads((out / "mem-0.85.json").read_text())
    assert run["kv"]["requests_held"] == 2 and run["kv"]["kv_bound"] is True  # the sizes line's pool
    # SGLang's gauges read every poll: the peak of 2 queued can fall between two reads on a loaded machine (1 was
    # read once in a clean clone's run); any queued read with the pool full is the KV-bound reading.
    measured = run["kv"]["measured"]
    assert (measured["running_max"], measured["kv_bound"]) == (2, True) and measured["queued_max"] in (1, 2)
    assert f"| KV-bound: at most 2 ran, {measured['queued_max']} queued |" in table
    assert run["result"]["total_throughput"] > run["result"]["output_throughput"] > 0
    assert run["shape"]["name"] == "tiny" and run["baseline_output_tok_s"] == 50
    assert run["configuration"]["argv"].count("0.85") == 1
    lines = table.rstrip("\n").splitlines()
    assert lines[-2].startswith("Winner at tiny (most output tok/s among the variants that passed the healthcheck): "
                                "mem-0.85, ")  # fmt: skip
    assert lines[-1] == "GLM5_MEM_FRACTION_STATIC=0.85"
    assert (out / "sweep.png").stat().st_size > 10_000


def test_the_report_says_how_many_requests_of_the_workload_the_kv_pool_holds() -> None:
    """From the server's own max_total_num_tokens: 412,160 tokens hold 201 requests of 1k in + 1k out, short of the
    1,024 the default workload offers (KV-bound); a pool that holds them all is not."""
    w = bench.Workload()
    tight = bench.kv_report(412160, w)
    assert tight == {"max_total_num_tokens": 412160, "requests_held": 201, "kv_bound": True}
    assert bench.kv_report(4_200_000, w)["kv_bound"] is False
    assert bench.kv_report(None, w)["requests_held"] is None
    run = fake_run("baked", 3100.0) | {"kv": tight, "workload": {"concurrency": 1024}}
    assert "| ok | 201 of 1024 (KV-bound), pool 412,160 tokens |" in bench.table([run], 3028)
    assert "| unknown (no sizes line) |" in bench.table([fake_run("baked", 3100.0)], 3028)
