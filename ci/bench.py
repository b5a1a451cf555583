"""Measure GLM-5 serving throughput with SGLang's own bench_serving, one configuration or a sweep.

    ci/bench                          benchmark the running compose service (bench_serving runs inside it)
    ci/bench --url URL                benchmark a running server (bench_serving from --bench-python)
    ci/bench --sweep FILE             boot each variant in FILE in turn, benchmark it, compare
    ci/bench --shape NAME             one of the shapes alone (with any of the above)

The workload shapes are the [[shape]] tables of ci/sweep-sm120.toml (of the --sweep file when one is given), each
with its published comparison figure and that figure's source: 1K in / 8K out at 512 concurrent, 8K in / 1K out at
1024 (SGLang's cookbook), 1K/1K at 1024 (the seed's). By default every shape runs in turn; --concurrency,
--input-len or --output-len without --shape run one workload of those lengths instead (random token prompts,
random-ids, so no dataset download; the file's [workload] fills in the rest). Each run is written to RUN.json in
--out (RUN.SHAPE.json when several shapes run); a sweep also writes sweep.md (a table per shape, then the winner and
its settings for glm5.env) and sweep.png (plot). Each run reports output and total (input + output) tok/s, TTFT
and TPOT at p50, p90 and p99, and whether it was KV-bound, two ways ("kv"): how many requests of the workload's
lengths the server's KV pool holds at once (max_total_num_tokens from the server's own sizes line, as the kit's
exporter /ready reports it), and what the server did: SGLang's own gauges sglang:num_running_reqs and
sglang:num_queue_reqs sampled from its /metrics every --poll seconds of the run ("kv"."measured").
Exit codes (common/report.py): 0 ok, 1 a benchmark or a variant failed, 2 bad usage or sweep file,
3 an invalid setting. The URL, port and API key follow ci/readiness.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

try:  # the sweep's chart; a host Python without it still gets the table (sweep.md)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None

from ci import readiness
from common.report import INVALID_SETTING, SERVER_EXISTS, USAGE, Log, Problems
from configuration import admission, settings, state

ROOT = readiness.ROOT
BASELINE_TOK_S = 3028.0  # output tok/s, GLM-5-NVFP4 on 8x RTX PRO 6000 at 1024 concurrency
METRICS = (
    "output_throughput", "request_throughput", "total_throughput", "completed", "duration",
    "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
    "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
)  # fmt: skip
SHAPES_FILE = ROOT / "ci" / "sweep-sm120.toml"  # the shapes and their published figures: one place
SHAPE_KEYS = (
    "concurrency",
    "input_len",
    "output_len",
)  # what makes a shape: given alone, they make a custom one
VARIANT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,39}")


class BenchError(Exception):
    pass


@dataclass
class Workload:
    concurrency: int = 1024
    input_len: int = 1024
    output_len: int = 1024
    num_prompts: int = 4096
    dataset: str = "random-ids"
    range_ratio: float = 1.0
    dataset_path: str = ""  # random: a local ShareGPT JSON; empty: bench_serving downloads it from the Hub
    backend: str = (
        "sglang"  # bench_serving's: sglang (/generate); sglang-oai (/v1/completions) through the gateway
    )

    def validate(self) -> list[str]:
        errors = [
            f"{k}={v}: must be positive"
            for k, v in asdict(self).items()
            if isinstance(v, int | float) and v <= 0
        ]
        if self.backend not in ("sglang", "sglang-oai", "sglang-oai-chat"):
            errors.append(f"backend={self.backend!r}: use sglang, sglang-oai or sglang-oai-chat")
        if self.dataset_path and self.dataset != "random":
            errors.append(f"dataset_path={self.dataset_path!r}: only the random dataset reads one")
        if self.dataset not in ("random-ids", "random"):
            errors.append(f"dataset={self.dataset!r}: use random-ids (offline) or random (ShareGPT)")
        return errors


@dataclass
class Variant:
    name: str
    reason: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Shape:
    """A published workload: its lengths and concurrency, and the figure it is compared with, with its source."""

    name: str
    concurrency: int
    input_len: int
    output_len: int
    num_prompts: int
    published: str  # the comparison figure in words, with its source
    published_output_tok_s: float | None = (
        None  # the figure vs_baseline divides by (None: the file's baseline)
    )

    def workload(self, base: Workload) -> Workload:
        return replace(base, concurrency=self.concurrency, input_len=self.input_len,
                       output_len=self.output_len, num_prompts=self.num_prompts)  # fmt: skip


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise BenchError(f"--sweep {path}: {err}") from err


def shape_errors(i: int, raw: Mapping[str, Any]) -> list[str]:
    name = str(raw.get("name", ""))
    errors = (
        []
        if VARIANT_NAME.fullmatch(name)
        else [f"shape #{i + 1}: name {name!r} must be lowercase letters, digits, . _ -"]
    )
    errors += [
        f"shape {name!r}: unknown key {k!r}" for k in sorted(set(raw) - {f.name for f in fields(Shape)})
    ]
    errors += [f"shape {name!r}: {k} must be a positive integer" for k in (*SHAPE_KEYS, "num_prompts")
               if not isinstance(raw.get(k), int) or raw[k] <= 0]  # fmt: skip
    if not str(raw.get("published", "")).strip():
        errors.append(f"shape {name!r}: name its published comparison figure and source (published)")
    return errors


def load_shapes(path: Path) -> tuple[list[Shape], str]:
    """The [[shape]] tables of PATH, in order, and winner_shape (the shape a sweep's winner is judged at)."""
    data = read_toml(path)
    raws = data.get("shape", [])
    errors = [e for i, raw in enumerate(raws) for e in shape_errors(i, raw)]
    names = [str(raw.get("name", "")) for raw in raws]
    errors += [f"shape name {n!r} appears twice" for n in sorted({n for n in names if names.count(n) > 1})]
    winner = str(data.get("winner_shape", names[0] if names else ""))
    if names and winner not in names:
        errors.append(f"winner_shape {winner!r}: not one of the shapes {names}")
    if errors:
        raise BenchError(f"--sweep {path}:\n  " + "\n  ".join(errors))
    return [Shape(**raw) for raw in raws], winner


def bench_argv(
    python: list[str], url: str, w: Workload, tokenizer: str, model: str, output: str
) -> list[str]:
    """sglang's bench_serving command line for the workload."""
    return [
        *python, "-m", "sglang.bench_serving", "--backend", w.backend, "--base-url", url,
        "--dataset-name", w.dataset, "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
        "--random-range-ratio", str(w.range_ratio), "--num-prompts", str(w.num_prompts),
        "--max-concurrency", str(w.concurrency), "--tokenizer", tokenizer, "--model", model, "--output-file", output,
        *(["--dataset-path", w.dataset_path] if w.dataset_path else []),
    ]  # fmt: skip


def parse_result(jsonl: str) -> dict[str, Any]:
    """The last record bench_serving appended to its --output-file (one JSON object per line)."""
    lines = [ln for ln in jsonl.splitlines() if ln.strip()]
    if not lines:
        raise BenchError("bench_serving wrote no result line")
    record: dict[str, Any] = json.loads(lines[-1].replace("Infinity", "1e999"))
    missing = [k for k in METRICS if k not in record]
    if missing:
        raise BenchError(f"bench_serving result lacks {missing}: is this sglang's bench_serving output?")
    if not record["completed"]:
        raise BenchError("bench_serving completed no request")
    return {k: record[k] for k in METRICS}


def load_sweep(path: Path) -> tuple[Workload, list[Variant], float]:
    data = read_toml(path)
    workload = Workload(**data.get("workload", {}))
    errors = workload.validate()
    variants = []
    for i, raw in enumerate(data.get("variant", [])):
        name = str(raw.get("name", ""))
        if not VARIANT_NAME.fullmatch(name):
            errors.append(f"variant #{i + 1}: name {name!r} must be lowercase letters, digits, . _ -")
        if not str(raw.get("reason", "")).strip():
            errors.append(f"variant {name!r}: give a reason")
        env = raw.get("env", {})
        if not all(isinstance(v, str) for v in env.values()):
            errors.append(f"variant {name!r}: env values must be strings")
        variants.append(Variant(name, str(raw.get("reason", "")), {k: str(v) for k, v in env.items()}))
    if not variants:
        errors.append("no [[variant]] in the sweep file")
    names = [v.name for v in variants]
    errors += [f"variant name {n!r} appears twice" for n in sorted({n for n in names if names.count(n) > 1})]
    if errors:
        raise BenchError(f"--sweep {path}:\n  " + "\n  ".join(errors))
    return workload, variants, float(data.get("baseline_output_tok_s", BASELINE_TOK_S))


VERSIONS_PY = (
    "import json, importlib.metadata as m; "
    "print(json.dumps({p: m.version(p) for p in ('sglang', 'flashinfer-python', 'torch', 'supervisor')}))"
)


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def bench_env(conn: readiness.Connection, w: Workload) -> dict[str, str]:
    """bench_serving sends $OPENAI_API_KEY as the bearer key (sglang/benchmark/serving.py). random-ids needs no
    file: offline, so nothing is fetched by surprise; random samples ShareGPT (benchmark/datasets/random.py),
    downloaded from the Hub unless --dataset-path gives it: then offline too (online, the Hub lookups bench_serving
    makes anyway each wait out a timeout on a host that cannot reach it)."""
    offline = {"HF_HUB_OFFLINE": "1"} if w.dataset == "random-ids" or w.dataset_path else {}
    return offline | ({"OPENAI_API_KEY": conn.api_key} if conn.api_key else {})


def bench_in_container(target: readiness.Compose, w: Workload, model: str) -> str:
    """bench_serving inside the running container, against its own port and weights folder."""
    values = settings.resolve({})
    output = "/tmp/glm5-bench.jsonl"
    target.exec("rm", "-f", output)
    argv = bench_argv(
        ["python3"], f"http://127.0.0.1:{values['port']}", w, values["model_dir"], model, output
    )
    keys = [f"--env={k}" for k in bench_env(target.conn, w)]  # values come from this process's environment
    done = subprocess.run(
        ["docker", "compose", *target.files, "exec", "-T", *keys, readiness.SERVICE, *argv],
        cwd=readiness.ROOT, capture_output=True, text=True, env=os.environ | bench_env(target.conn, w), check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise BenchError(
            f"bench_serving in the container exited {done.returncode}: {done.stderr.strip()[-800:]}"
        )
    return target.exec("cat", output).stdout


def context(args: argparse.Namespace, target: readiness.Target | None) -> dict[str, Any]:
    if isinstance(target, readiness.Compose):
        state_dir = settings.resolve({})["state_dir"]
        versions = target.exec("python3", "-c", VERSIONS_PY).stdout
        launch = target.exec("cat", str(state.path(state_dir, state.LAUNCH))).stdout
        return {"versions": readiness.first_json(versions), "configuration": readiness.first_json(launch)}
    out = url_context(args.conn)
    if isinstance(target, readiness.Local):
        launch = state.read_launch(settings.resolve(target.env)["state_dir"])
        out["configuration"] = launch.as_json() if launch else None
    return out


SECRET_ARGS = ("api_key", "admin_api_key", "ssl_keyfile_password")


def url_context(conn: readiness.Connection) -> dict[str, Any]:
    """What a running server says of itself: /server_info (0.5.23: the resolved server args, the launch command
    and the version; behind the API key), less its secrets. The other packages' versions are not reported."""
    request = urllib.request.Request(f"{conn.url}/server_info")
    if conn.api_key:
        request.add_header("Authorization", f"Bearer {conn.api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            info = json.loads(r.read())
    except (OSError, ValueError) as err:
        return {"versions": None, "configuration": None, "context_error": f"/server_info: {err}"}
    if not isinstance(info, dict):
        return {"versions": None, "configuration": None, "context_error": "/server_info: not a JSON object"}
    configuration = {
        k: ("(redacted)" if k in SECRET_ARGS and v else v)
        for k, v in info.items()
        if k not in ("version", "internal_states", "launch_command")
    }
    return {
        "versions": {"sglang": info.get("version"), "others": "not reported by /server_info"},
        "configuration": configuration,
    }


def run_bench_locally(args: argparse.Namespace, w: Workload, model: str) -> str:
    output = args.out / f".bench-{os.getpid()}.jsonl"
    output.unlink(missing_ok=True)
    argv = bench_argv(args.bench_python, args.conn.url, w, args.tokenizer, model, str(output))
    log = args.out / f".bench-{os.getpid()}.log"
    with log.open("w") as fh:
        done = subprocess.run(
            argv, stdout=fh, stderr=subprocess.STDOUT, env=os.environ | bench_env(args.conn, w), check=False
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise BenchError(f"bench_serving exited {done.returncode}:\n{tail}")
    return read_text(output)


def exporter_ready(args: argparse.Namespace, target: readiness.Target | None) -> str:
    """The kit's exporter /ready beside the benchmarked server: its port from the target's settings."""
    if isinstance(target, readiness.Local):
        port = settings.resolve(target.env)["exporter_port"]
    else:
        port = settings.resolve(settings.host_environment(os.environ, ROOT), where="ci")["exporter_port"]
    host = urllib.parse.urlsplit(args.conn.url).hostname or "127.0.0.1"
    return f"http://{host}:{port}/ready"


def pool_tokens(url: str) -> float | None:
    """max_total_num_tokens from the server's sizes line, as the exporter's /ready reports it (its body also on 503)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as err:
        body = json.loads(err.read() or b"{}")
    except (OSError, ValueError):
        return None
    capacity = body.get("capacity") if isinstance(body, dict) else None
    found = capacity.get("max_total_num_tokens") if isinstance(capacity, dict) else None
    return float(found) if found else None


def kv_report(pool: float | None, w: Workload) -> dict[str, Any]:
    """How many requests of the workload's lengths the KV pool holds at once, against the concurrency offered."""
    if pool is None:
        return {"max_total_num_tokens": None, "requests_held": None, "kv_bound": None}
    held = admission.kv_requests(pool, w.input_len + w.output_len)
    return {"max_total_num_tokens": int(pool), "requests_held": held, "kv_bound": held < w.concurrency}


GAUGES = {"sglang:num_running_reqs": "running", "sglang:num_queue_reqs": "queued"}


GAUGE_LINE = re.compile(r"(sglang:num_running_reqs|sglang:num_queue_reqs)(?:\{[^}]*\})?\s+(\S+)")


def gauges(text: str) -> dict[str, float] | None:
    """Running and queued requests from SGLang's /metrics, summed over its series: 0.5.23 exports them from each
    data-parallel group's first attention rank (observability/metrics_collector.py, is_stats_logging_rank), so the
    sum counts a DP-attention server's requests once. None where neither gauge is there (not SGLang's /metrics)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = GAUGE_LINE.match(line)
        if m:
            key = GAUGES[m.group(1)]
            found[key] = found.get(key, 0.0) + float(m.group(2))
    return found or None


class Load:
    """Samples the server's running and queued requests from its /metrics every `every` seconds, in a thread, while
    the `with` block runs a benchmark."""

    def __init__(self, conn: readiness.Connection, every: float) -> None:
        self.conn, self.every = conn, every
        self.samples: list[dict[str, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=30)

    def read(self) -> dict[str, float] | None:
        request = urllib.request.Request(f"{self.conn.url}/metrics")
        if self.conn.api_key:
            request.add_header("Authorization", f"Bearer {self.conn.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=5) as r:
                return gauges(r.read().decode(errors="replace"))
        except (OSError, ValueError):
            return None

    def sample(self) -> None:
        while not self.done.is_set():
            found = self.read()
            if found:
                self.samples.append(found)
            self.done.wait(self.every)


def load_report(samples: list[dict[str, float]], w: Workload) -> dict[str, Any]:
    """What the server did over the run. KV-bound: requests waited in the server's queue while fewer than the
    concurrency (or the prompts, if fewer) ever ran at once. The peak, not each sample: while a run starts, requests
    queue for their prefill batch with room in the pool, then all of them run."""
    if not samples:
        return {"samples": 0, "running_max": None, "queued_max": None, "kv_bound": None}
    running = max(s.get("running", 0.0) for s in samples)
    queued = max(s.get("queued", 0.0) for s in samples)
    bound = queued > 0 and running < min(w.concurrency, w.num_prompts)
    return {
        "samples": len(samples),
        "running_max": int(running),
        "queued_max": int(queued),
        "kv_bound": bound,
    }


@dataclass
class Job:
    """One benchmark of a run: a shape (None: the command line's own lengths), its workload and its comparison."""

    shape: Shape | None
    workload: Workload
    baseline: float  # output tok/s: the shape's published figure, else the file's baseline

    @property
    def name(self) -> str:
        return self.shape.name if self.shape else "custom"


@dataclass
class Outcome:
    result: dict[str, Any] | None = None
    error: str | None = None
    samples: list[dict[str, float]] = field(default_factory=list)  # Load's: the server's gauges over the run


def plan(args: argparse.Namespace, base: Workload, shapes: list[Shape], baseline: float) -> list[Job]:
    """The benchmarks to run: --shape's, else every shape, else (no shapes, or lengths given without --shape) one
    workload from BASE and the command line, as before there were shapes."""
    if args.shape:
        chosen = [s for s in shapes if s.name == args.shape]
        if not chosen:
            raise BenchError(f"--shape {args.shape!r}: use one of {[s.name for s in shapes]}")
    elif shapes and all(getattr(args, k) is None for k in SHAPE_KEYS):
        chosen = shapes
    else:
        return [Job(None, override_workload(base, args), baseline)]
    return [
        Job(s, override_workload(s.workload(base), args), s.published_output_tok_s or baseline)
        for s in chosen
    ]


def stem(label: str, job: Job, jobs: list[Job]) -> str:
    """The run's file name: LABEL alone when it runs one benchmark, LABEL.SHAPE when several."""
    return label if len(jobs) == 1 else f"{label}.{job.name}"


def record_run(
    args: argparse.Namespace,
    label: str,
    job: Job,
    target: readiness.Target | None,
    outcome: Outcome,
    variant: Variant | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    found, w, result = context(args, target), job.workload, outcome.result
    kv = kv_report(pool_tokens(exporter_ready(args, target)), w) | {
        "measured": load_report(outcome.samples, w)
    }
    run = {
        "label": label,
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "shape": asdict(job.shape) if job.shape else None,
        "workload": asdict(w),
        "variant": asdict(variant) if variant else None,
        "baseline_output_tok_s": job.baseline,
        "result": result,
        "error": outcome.error,
        "vs_baseline": round(result["output_throughput"] / job.baseline, 3) if result else None,
        "kv": kv,
    } | found
    (args.out / f"{name or label}.json").write_text(json.dumps(run, indent=2) + "\n")
    return run


COLUMNS = (
    "| variant | output tok/s | vs baseline | req/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | status | KV pool holds "
    "| total tok/s | TTFT p90 (ms) | TPOT p50 / p90 / p99 (ms) | server's queue (/metrics) |\n"
    "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|"
)


def table(runs: list[dict[str, Any]], baseline: float, shape: Mapping[str, Any] | None = None) -> str:
    head = f"Baseline: {baseline:,.0f} output tok/s (GLM-5-NVFP4, 8x RTX PRO 6000, 1024 concurrent).\n\n"
    if shape:
        head = (f"### {shape['name']}: {shape['input_len']:,} in / {shape['output_len']:,} out at {shape['concurrency']:,} "
                f"concurrent\n\nPublished: {shape['published']}\n\n")  # fmt: skip
    return head + "\n".join([COLUMNS, *(row(run, baseline) for run in runs)]) + "\n"


def row(run: Mapping[str, Any], baseline: float) -> str:
    r = run["result"]
    if r is None:
        return (f"| {run['label']} | - | - | - | - | - | failed: {str(run['error']).splitlines()[0][:120]} | {held(run)} "
                f"| - | - | - | {measured(run)} |")  # fmt: skip
    return (
        f"| {run['label']} | {r['output_throughput']:,.0f} | {r['output_throughput'] / baseline:.2f}x | {r['request_throughput']:.2f} | "
        f"{r['median_ttft_ms']:,.0f} / {r['p99_ttft_ms']:,.0f} | {r['median_itl_ms']:.1f} / {r['p99_itl_ms']:.1f} | ok | {held(run)} "
        f"| {r['total_throughput']:,.0f} | {r['p90_ttft_ms']:,.0f} | {r['median_tpot_ms']:.1f} / {r['p90_tpot_ms']:.1f} / "
        f"{r['p99_tpot_ms']:.1f} | {measured(run)} |"
    )  # fmt: skip


def measured(run: Mapping[str, Any]) -> str:
    """The last column: what SGLang's gauges said over the run, and the verdict."""
    m = (run.get("kv") or {}).get("measured") or {}
    if not m.get("samples"):
        return "unknown (no sglang:num_running_reqs in /metrics)"
    verdict = "KV-bound" if m["kv_bound"] else "not KV-bound"
    return f"{verdict}: at most {m['running_max']:,} ran, {m['queued_max']:,} queued"


def held(run: Mapping[str, Any]) -> str:
    """The KV column: requests of the workload's lengths the pool holds, of the concurrency; KV-bound when fewer."""
    kv, w = run.get("kv") or {}, run.get("workload") or {}
    if not kv.get("requests_held"):
        return "unknown (no sizes line)"
    verdict = " (KV-bound)" if kv.get("kv_bound") else ""
    return f"{kv['requests_held']:,} of {w.get('concurrency', '?')}{verdict}, pool {kv['max_total_num_tokens']:,} tokens"


def plot(runs: list[dict[str, Any]], baseline: float, path: Path, shape: str = "") -> str:
    """Draw the sweep's chart at PATH; what was written, or why nothing was."""
    if plt is None:
        return f"no {path.name}: matplotlib is not installed in this Python (pip install matplotlib)"
    labels = [r["label"] for r in runs]
    ok = [r["result"] is not None for r in runs]
    tok = [r["result"]["output_throughput"] if r["result"] else 0 for r in runs]
    ttft = [r["result"]["p99_ttft_ms"] if r["result"] else 0 for r in runs]
    itl = [r["result"]["p99_itl_ms"] if r["result"] else 0 for r in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    bars = ax1.bar(labels, tok, color=["tab:blue" if good else "lightgray" for good in ok])
    ax1.axhline(baseline, color="tab:red", linestyle="--", label=f"baseline {baseline:,.0f} tok/s")
    for bar, good, value in zip(bars, ok, tok, strict=True):
        ax1.annotate(
            f"{value:,.0f}" if good else "failed to start",
            (bar.get_x() + bar.get_width() / 2, max(value, 0)),
            ha="center",
            va="bottom",
            fontsize=8,
            color="black" if good else "tab:red",
        )
    ax1.set_ylabel("output tokens/s")
    ax1.set_title("Throughput")
    ax1.legend()
    x = range(len(labels))
    ax2.bar([i - 0.2 for i in x], ttft, width=0.4, label="TTFT p99 (ms)")
    ax2.bar([i + 0.2 for i in x], itl, width=0.4, label="ITL p99 (ms)")
    ax2.set_xticks(list(x), labels)
    ax2.set_yscale("symlog")
    ax2.set_title("Latency (p99)")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(
        f"GLM-5-NVFP4 on 8x RTX PRO 6000: configuration variants{', shape ' + shape if shape else ''}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def run_target(args: argparse.Namespace, target: readiness.Target | None, w: Workload) -> dict[str, Any]:
    if isinstance(target, readiness.Compose):
        return parse_result(bench_in_container(target, w, args.model))
    return parse_result(run_bench_locally(args, w, args.model))


def run_job(args: argparse.Namespace, target: readiness.Target | None, job: Job) -> Outcome:
    """One benchmark, the server's gauges sampled meanwhile."""
    with Load(args.conn, args.poll) as load:
        try:
            return Outcome(run_target(args, target, job.workload), None, load.samples)
        except (BenchError, RuntimeError) as err:
            return Outcome(None, str(err), load.samples)


def make_target(args: argparse.Namespace) -> readiness.Target:
    if args.launcher == "local":
        return readiness.Local(args.conn, os.environ, args.out / "entrypoint.log", args.stop_timeout)
    return readiness.Compose(args.conn, args.out)


def boot(args: argparse.Namespace, target: readiness.Target, variant: Variant) -> None:
    since = readiness.now()
    target.boot(variant.env)
    waited = readiness.wait_until_ready(
        target, args.timeout, args.poll, since, readiness.say(f"ci/bench: [{variant.name}]")
    )
    if not waited.ready:
        raise BenchError(f"did not become healthy: {waited.reason}")


def sweep_variant(
    args: argparse.Namespace, target: readiness.Target, variant: Variant, jobs: list[Job]
) -> list[dict[str, Any]]:
    """Boot the variant, run every job against it; its runs (each job failed alike if it never became healthy)."""
    print(f"ci/bench: variant {variant.name}: {variant.reason}", flush=True)
    try:
        boot(args, target, variant)
        outcomes = [run_job(args, target, job) for job in jobs]
    except (BenchError, RuntimeError) as err:
        outcomes = [Outcome(None, str(err)) for _ in jobs]
    for job, outcome in zip(jobs, outcomes, strict=True):
        if outcome.error:
            print(f"ci/bench: variant {variant.name} FAILED ({job.name}): {outcome.error}", flush=True)
    runs = [record_run(args, variant.name, job, target, outcome, variant, stem(variant.name, job, jobs))
            for job, outcome in zip(jobs, outcomes, strict=True)]  # fmt: skip
    target.stop()
    return runs


def shape_name(run: Mapping[str, Any]) -> str:
    return str((run.get("shape") or {}).get("name", "custom"))


def winner(runs: list[dict[str, Any]], shape: str) -> str:
    """The sweep's last lines: the variant with the most output tok/s at SHAPE among those that passed the
    healthcheck and completed it, and its env as glm5.env lines."""
    ok = [r for r in runs if shape_name(r) == shape and r["result"]]
    if not ok:
        return f"Winner at {shape}: none (no variant passed the healthcheck and completed the benchmark).\n"
    best = max(ok, key=lambda r: float(r["result"]["output_throughput"]))
    env = (best.get("variant") or {}).get("env") or {}
    line = (f"Winner at {shape} (most output tok/s among the variants that passed the healthcheck): {best['label']}, "
            f"{best['result']['output_throughput']:,.0f} output tok/s; ")  # fmt: skip
    if not env:
        return line + "the shipped defaults: glm5.env needs no line.\n"
    return line + "to make it the default, put in glm5.env:\n" + "".join(f"{k}={v}\n" for k, v in env.items())


def report(runs: list[dict[str, Any]], jobs: list[Job], judged: str) -> str:
    """sweep.md: a table per shape, then the winner at JUDGED and its settings."""
    parts = [table([r for r in runs if shape_name(r) == job.name], job.baseline,
                   asdict(job.shape) if job.shape else None) for job in jobs]  # fmt: skip
    return "\n".join(parts) + "\n" + winner(runs, judged)


def sweep(args: argparse.Namespace) -> int:
    base, variants, baseline = load_sweep(args.sweep)
    shapes, winner_shape = load_shapes(args.sweep)
    jobs = plan(args, base, shapes, baseline)
    target = make_target(args)
    runs: list[dict[str, Any]] = []
    try:
        for variant in variants:
            runs += sweep_variant(args, target, variant, jobs)
    finally:
        target.stop()
    names = [job.name for job in jobs]
    judged = winner_shape if winner_shape in names else names[0]  # the winner's shape, if it ran
    text = report(runs, jobs, judged)
    (args.out / "sweep.md").write_text(text)
    judged_job = jobs[names.index(judged)]
    chart = plot(
        [r for r in runs if shape_name(r) == judged], judged_job.baseline, args.out / "sweep.png", judged
    )
    print(text)
    print(
        f"ci/bench: wrote {args.out / 'sweep.md'} and one JSON per variant and shape; chart ({judged}): {chart}"
    )
    return 1 if any(r["result"] is None for r in runs) else 0


# The workload's fields a command-line option overrides, each by the option of its name.
OVERRIDES = ("concurrency", "input_len", "output_len", "num_prompts", "dataset", "dataset_path", "backend")


def override_workload(w: Workload, args: argparse.Namespace) -> Workload:
    for key in OVERRIDES:
        value = getattr(args, key)
        if value is not None:
            setattr(w, key, value)
    errors = w.validate()
    if errors:
        raise BenchError("; ".join(errors))
    return w


def single(args: argparse.Namespace) -> int:
    shapes, _ = load_shapes(SHAPES_FILE)
    jobs = plan(args, Workload(), shapes, BASELINE_TOK_S)
    target = None if args.url_given else readiness.Compose(args.conn, args.out)
    failed = False
    for job in jobs:
        name = stem(args.label, job, jobs)
        outcome = run_job(args, target, job)
        run = record_run(args, args.label, job, target, outcome, None, name)
        if outcome.result is None:
            Log("ci/bench").error(f"{name} FAILED: {outcome.error}")
            failed = True
            continue
        print(summary(run, name, args.out / f"{name}.json"))
    return 1 if failed else 0


def summary(run: Mapping[str, Any], name: str, path: Path) -> str:
    r, base = run["result"], run["baseline_output_tok_s"]
    published = f"; published: {run['shape']['published']}" if run.get("shape") else ""
    return (f"ci/bench: {name}: {r['output_throughput']:,.1f} output tok/s ({run['vs_baseline']}x the {base:,.0f} baseline), "
            f"{r['total_throughput']:,.1f} total tok/s, {r['request_throughput']:.2f} req/s, TTFT p50/p90/p99 "
            f"{r['median_ttft_ms']:.0f}/{r['p90_ttft_ms']:.0f}/{r['p99_ttft_ms']:.0f} ms, TPOT p50/p90/p99 "
            f"{r['median_tpot_ms']:.1f}/{r['p90_tpot_ms']:.1f}/{r['p99_tpot_ms']:.1f} ms, ITL p50/p99 "
            f"{r['median_itl_ms']:.1f}/{r['p99_itl_ms']:.1f} ms, server's queue: {measured(run)} -> {path}{published}")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(prog="ci/bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="benchmark this server (default: the compose service)")
    p.add_argument("--sweep", type=Path, help="TOML file of variants to boot and benchmark in turn")
    p.add_argument(
        "--launcher", choices=["compose", "local"], default="compose", help="how --sweep boots a variant"
    )
    p.add_argument(
        "--label", default=datetime.datetime.now().strftime("run-%Y%m%d-%H%M%S"), help="name of this run"
    )
    p.add_argument("--out", type=Path, default=ROOT / "out" / "bench", help="where results go")
    p.add_argument("--model", default=None, help="served model name (default: glm5.toml's)")
    p.add_argument(
        "--tokenizer", default=None, help="tokenizer folder for --url runs (default: the model folder)"
    )
    p.add_argument(
        "--bench-python",
        default=None,
        help="python with sglang installed, for --url runs (default: GLM5_BENCH_PYTHON)",
    )
    p.add_argument("--shape", help="run this [[shape]] alone (default: every shape, in the file's order)")
    p.add_argument("--concurrency", type=int)
    p.add_argument("--input-len", type=int)
    p.add_argument("--output-len", type=int)
    p.add_argument("--num-prompts", type=int)
    p.add_argument("--dataset", choices=["random-ids", "random"])
    p.add_argument("--dataset-path", help="with --dataset random: a local ShareGPT JSON (else downloaded)")
    p.add_argument(
        "--backend",
        choices=["sglang", "sglang-oai", "sglang-oai-chat"],
        help="bench_serving's client: sglang (/generate, the default) or the OpenAI routes; through the gateway "
        "use sglang-oai-chat (smg routes /generate only with a model, which that client does not send, and refuses "
        "the completions client's best_of with streaming)",
    )
    p.add_argument("--timeout", type=float, default=3600, help="seconds for a variant to become healthy")
    p.add_argument(
        "--poll",
        type=float,
        default=10,
        help="seconds between polls: readiness, and the server's /metrics in a run",
    )
    p.add_argument("--stop-timeout", type=float, default=180)
    args = p.parse_args()
    try:
        values = settings.resolve(settings.host_environment(os.environ, readiness.ROOT), where="ci")
        args.conn = readiness.connection(os.environ, args.url)
    except Problems as err:
        return Log("ci/bench").problems(err.problems) or INVALID_SETTING
    args.url_given = args.url is not None
    args.model = args.model or values["served_model_name"]
    args.tokenizer = args.tokenizer or values["model_dir"]
    args.bench_python = shlex.split(args.bench_python) if args.bench_python else values["bench_python"]
    if not VARIANT_NAME.fullmatch(args.label.lower()):
        p.error(f"--label {args.label!r}: letters, digits, . _ - only")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        return sweep(args) if args.sweep else single(args)
    except BenchError as err:
        Log("ci/bench").error(str(err))
        return USAGE
    except readiness.ServerExists as err:
        Log("ci/bench").error(str(err))
        return SERVER_EXISTS


if __name__ == "__main__":
    sys.exit(main())
