"""Measure GLM-5 serving throughput with SGLang's own bench_serving, one configuration or a sweep.

    ci/bench                          benchmark the running compose service (bench_serving runs inside it)
    ci/bench --url URL                benchmark a running server (bench_serving from --bench-python)
    ci/bench --sweep FILE             boot each variant in FILE in turn, benchmark it, compare

Default workload (the known baseline's): 1024 concurrent requests, random token prompts of 1024 tokens
in and 1024 out (random-ids, so no dataset download), 4096 prompts. Each run is written to
RUN.json in --out; a sweep also writes sweep.md (table) and sweep.png (plot) against the baseline.
Each run also says how many requests of the workload's lengths (input + output tokens) the server's KV pool holds at
once ("kv": max_total_num_tokens from the server's own sizes line, as the kit's exporter /ready reports it): a
variant that holds fewer than the concurrency is KV-bound, the rest queue inside SGLang.
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
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
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
)  # fmt: skip
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
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise BenchError(f"--sweep {path}: {err}") from err
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
        out["configuration"] = state.read_launch(settings.resolve(target.env)["state_dir"])
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


def record_run(
    args: argparse.Namespace,
    label: str,
    w: Workload,
    target: readiness.Target | None,
    result: dict[str, Any] | None,
    error: str | None,
    variant: Variant | None = None,
) -> dict[str, Any]:
    found = context(args, target)
    run = {
        "label": label,
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "workload": asdict(w),
        "variant": asdict(variant) if variant else None,
        "baseline_output_tok_s": args.baseline,
        "result": result,
        "error": error,
        "vs_baseline": round(result["output_throughput"] / args.baseline, 3) if result else None,
        "kv": kv_report(pool_tokens(exporter_ready(args, target)), w),
    } | found
    (args.out / f"{label}.json").write_text(json.dumps(run, indent=2) + "\n")
    return run


def table(runs: list[dict[str, Any]], baseline: float) -> str:
    head = f"Baseline: {baseline:,.0f} output tok/s (GLM-5-NVFP4, 8x RTX PRO 6000, 1024 concurrent).\n\n"
    rows = [
        "| variant | output tok/s | vs baseline | req/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | status | KV pool holds |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for run in runs:
        r = run["result"]
        if r is None:
            rows.append(
                f"| {run['label']} | - | - | - | - | - | failed: {str(run['error']).splitlines()[0][:120]} | {held(run)} |"
            )
            continue
        rows.append(
            f"| {run['label']} | {r['output_throughput']:,.0f} | {r['output_throughput'] / baseline:.2f}x | {r['request_throughput']:.2f} | "
            f"{r['median_ttft_ms']:,.0f} / {r['p99_ttft_ms']:,.0f} | {r['median_itl_ms']:.1f} / {r['p99_itl_ms']:.1f} | ok | {held(run)} |"
        )
    return head + "\n".join(rows) + "\n"


def held(run: Mapping[str, Any]) -> str:
    """The KV column: requests of the workload's lengths the pool holds, of the concurrency; KV-bound when fewer."""
    kv, w = run.get("kv") or {}, run.get("workload") or {}
    if not kv.get("requests_held"):
        return "unknown (no sizes line)"
    verdict = " (KV-bound)" if kv.get("kv_bound") else ""
    return f"{kv['requests_held']:,} of {w.get('concurrency', '?')}{verdict}, pool {kv['max_total_num_tokens']:,} tokens"


def plot(runs: list[dict[str, Any]], baseline: float, path: Path) -> str:
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
    fig.suptitle("GLM-5-NVFP4 on 8x RTX PRO 6000: configuration variants")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def run_target(args: argparse.Namespace, target: readiness.Target, w: Workload) -> dict[str, Any]:
    if isinstance(target, readiness.Compose):
        return parse_result(bench_in_container(target, w, args.model))
    return parse_result(run_bench_locally(args, w, args.model))


def make_target(args: argparse.Namespace) -> readiness.Target:
    if args.launcher == "local":
        return readiness.Local(args.conn, os.environ, args.out / "entrypoint.log", args.stop_timeout)
    return readiness.Compose(args.conn, args.out)


def sweep(args: argparse.Namespace) -> int:
    workload, variants, baseline = load_sweep(args.sweep)
    workload = override_workload(workload, args)
    args.baseline = baseline
    target = make_target(args)
    runs = []
    try:
        for variant in variants:
            print(f"ci/bench: variant {variant.name}: {variant.reason}", flush=True)
            result, error = None, None
            try:
                since = readiness.now()
                target.boot(variant.env)
                waited = readiness.wait_until_ready(
                    target, args.timeout, args.poll, since, readiness.say(f"ci/bench: [{variant.name}]")
                )
                if not waited.ready:
                    raise BenchError(f"did not become healthy: {waited.reason}")
                result = run_target(args, target, workload)
            except (BenchError, RuntimeError) as err:
                error = str(err)
                print(f"ci/bench: variant {variant.name} FAILED: {error}", flush=True)
            runs.append(record_run(args, variant.name, workload, target, result, error, variant))
            target.stop()
    finally:
        target.stop()
    (args.out / "sweep.md").write_text(table(runs, baseline))
    chart = plot(runs, baseline, args.out / "sweep.png")
    print(table(runs, baseline))
    print(f"ci/bench: wrote {args.out / 'sweep.md'} and one JSON per variant; chart: {chart}")
    return 1 if any(r["result"] is None for r in runs) else 0


def override_workload(w: Workload, args: argparse.Namespace) -> Workload:
    for key in (
        "concurrency",
        "input_len",
        "output_len",
        "num_prompts",
        "dataset",
        "dataset_path",
        "backend",
    ):
        value = getattr(args, key)
        if value is not None:
            setattr(w, key, value)
    errors = w.validate()
    if errors:
        raise BenchError("; ".join(errors))
    return w


def single(args: argparse.Namespace) -> int:
    workload = override_workload(Workload(), args)
    target = None if args.url_given else readiness.Compose(args.conn, args.out)
    try:
        result = (
            run_target(args, target, workload)
            if target
            else parse_result(run_bench_locally(args, workload, args.model))
        )
        error = None
    except BenchError as err:
        result, error = None, str(err)
    run = record_run(args, args.label, workload, target, result, error)
    if result is None:
        Log("ci/bench").error(f"FAILED: {error}")
        return 1
    print(f"ci/bench: {args.label}: {result['output_throughput']:,.1f} output tok/s ({run['vs_baseline']}x the {args.baseline:,.0f} baseline), "
          f"{result['request_throughput']:.2f} req/s, TTFT p50/p99 {result['median_ttft_ms']:.0f}/{result['p99_ttft_ms']:.0f} ms, "
          f"ITL p50/p99 {result['median_itl_ms']:.1f}/{result['p99_itl_ms']:.1f} ms -> {args.out / (args.label + '.json')}")  # fmt: skip
    return 0


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
    p.add_argument("--poll", type=float, default=10)
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
    args.baseline = BASELINE_TOK_S
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
