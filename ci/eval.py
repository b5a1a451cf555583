"""Score a running GLM-5 server with SGLang's maintained evaluator (sgl-eval) and hold it to GLM-5's published figure.

    ci/eval [--url URL] [--benchmark gpqa] [--num-examples N] [--min-score S] [-- SGL-EVAL-FLAGS...]

For a box with the internet: sgl-eval fetches its datasets from Hugging Face (`--from-dataset FILE` after `--`
scores a local set instead). The URL and key follow ci/readiness.py as ci/smoke's do (GLM5_HOST_PORT, GLM5_API_KEY
or GLM5_API_KEY_FILE): sgl-eval takes the key only as its `--api-key` argument, so it runs in this process
(sgl_eval.cli.main) with the key added there, and no command line (ps, /proc/PID/cmdline) holds it.

The headline is sgl-eval's own (pass@1 averaged over the repeats, or the score of a single pass), from its
metrics.json. A run of a benchmark with a published GLM-5 figure, with the options that figure was measured with
(eval_score.PUBLISHED_RUN, read through sgl-eval's own parser), passes at that figure less ALLOWANCE; any other run
(a subset, fewer repeats, other sampling, a local set, an interrupted run) is reported, not compared, unless
--min-score sets the bar. The summary goes to --report-dir/eval.json beside sgl-eval's run folder.
Exit codes (common/report.py): 0 passed or reported, 1 below the bar, 2 bad usage (a key on the command line, an
unknown benchmark), 3 an invalid setting; sgl-eval's own otherwise (130 when interrupted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sgl_eval import cli, registry

from ci import readiness
from ci.eval_score import PUBLISHED, SAMPLING, bar, differences, headline, newest_metrics
from common.report import FAILED, INVALID_SETTING, OK, Log, Problems
from configuration import settings

ROOT = Path(__file__).resolve().parent.parent
PROG = "ci/eval"
LOG = Log(PROG)


def sgl_eval_argv(args: argparse.Namespace, url: str, model: str, out_dir: Path) -> list[str]:
    """sgl-eval's arguments, without the key."""
    argv = ["run", args.benchmark, "--base-url", url + "/v1", "--model", model, "--out-dir", str(out_dir)]
    if args.num_examples is not None:
        argv += ["--num-examples", str(args.num_examples)]
    if args.benchmark in PUBLISHED:
        argv += SAMPLING
    return argv + args.sgl_eval_flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="the server (default: this host's published port, GLM5_HOST_PORT)")
    parser.add_argument(
        "--benchmark", default="gpqa", help="an sgl-eval benchmark (default gpqa: GPQA Diamond)"
    )
    parser.add_argument(
        "--num-examples", type=int, help="only the first N examples (not comparable to the figure)"
    )
    parser.add_argument("--min-score", type=float, help="the least headline that passes, a fraction (0-1)")
    parser.add_argument("--model", help="served model name (default: glm5.toml's)")
    parser.add_argument("--report-dir", type=Path, default=ROOT / "out" / "eval")
    parser.add_argument("sgl_eval_flags", nargs="*", help="more sgl-eval run flags, after --")
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.min_score is not None and not 0 <= args.min_score <= 1:
        parser.error(f"--min-score {args.min_score}: a fraction from 0 to 1 (0.82 for 82%%)")
    if args.num_examples is not None and args.num_examples < 1:
        parser.error(f"--num-examples {args.num_examples}: 1 or more (leave it out for the whole set)")
    try:
        registry.get(args.benchmark)
    except KeyError as err:
        parser.error(f"--benchmark {args.benchmark}: {err.args[0]}")
    return args


def sgl_eval_options(parser: argparse.ArgumentParser, public: list[str]) -> dict[str, Any]:
    """sgl-eval's own reading of its arguments (abbreviations included), before anything runs; no key among them."""
    options = dict(vars(cli.build_parser().parse_args(public)))
    if options["api_key"] != "EMPTY":
        parser.error(
            "--api-key: pass the key as GLM5_API_KEY_FILE (or GLM5_API_KEY), never on a command line"
        )
    return options


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, sys.argv[1:] if argv is None else argv)
    try:
        conn = readiness.connection(os.environ, args.url)
        model = args.model or settings.resolve({})["served_model_name"]
    except Problems as err:
        return LOG.problems(err.problems) or INVALID_SETTING
    public = sgl_eval_argv(args, conn.url, model, args.report_dir)
    differs = differences(sgl_eval_options(parser, public))
    args.report_dir.mkdir(parents=True, exist_ok=True)
    shown = "--api-key (redacted)" if conn.api_key else "(no key: GLM5_API_KEY_FILE or GLM5_API_KEY sets one)"
    print(f"{PROG}: sgl-eval {' '.join(public)} {shown}", flush=True)
    began = time.time()
    code = cli.main(public + ["--api-key", conn.api_key or "EMPTY"])
    metrics = newest_metrics(args.report_dir, args.benchmark, began)
    if metrics is None:
        LOG.error(f"sgl-eval wrote no metrics.json under {args.report_dir} (its exit code {code})")
        return code or FAILED
    score = headline(metrics)
    partial = bool(metrics.get("partial"))
    least, why = bar(args.benchmark, differs, partial, args.min_score)
    passed = least is None or score >= least
    summary = {"benchmark": args.benchmark, "score": score, "examples": metrics.get("num_examples"),
               "repeats": metrics.get("n_repeats"), "bar": least, "why": why, "passed": passed,
               "comparable": not differs and not partial, "seconds": round(time.time() - began, 1),
               "metrics": metrics["metrics_path"]}  # fmt: skip
    (args.report_dir / "eval.json").write_text(json.dumps(summary, indent=2) + "\n")
    verdict = "reported" if least is None else ("PASS" if passed else "FAIL")
    against = "" if least is None else f" against {least * 100:.1f}"
    print(f"{PROG}: {verdict} {args.benchmark} {score * 100:.1f}{against} ({why})")
    if code:
        return code
    return OK if passed else FAILED


if __name__ == "__main__":
    sys.exit(main())
