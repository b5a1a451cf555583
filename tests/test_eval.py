"""ci/eval: the real sgl-eval (its own .venv-eval) against the server double, and how its score is judged."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from ci import eval_score
from conftest import ROOT
from helpers.container import Container, start

EVAL = ROOT / "ci" / "eval"
KEY = "eval-test-key-0123456789abcdef"


def dataset(path: Path, n: int = 6) -> Path:
    """sgl-eval's local set ({problem, expected_answer}, NeMo-Skills' shape), arithmetic the double works out."""
    rng = random.Random(7)
    rows = []
    for i in range(n):
        a, b, c, d = (rng.randint(2, 40) for _ in range(4))
        rows.append(
            {
                "id": f"q{i}",
                "problem": f"Compute ({a} + {b}) * {c} - {d}.",
                "expected_answer": str((a + b) * c - d),
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_eval(
    c: Container, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, object], list[str]]:
    """ci/eval against the container, the key in a file; the command lines seen while it ran that hold the key."""
    key_file = c.tmp / "key"
    key_file.write_text(KEY + "\n")
    report = c.tmp / "eval"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_")} | {
        "GLM5_API_KEY_FILE": str(key_file)
    }
    proc = subprocess.Popen(
        [str(EVAL), "--url", f"http://127.0.0.1:{c.port}", "--benchmark", "gsm8k", "--report-dir", str(report), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    leaked: list[str] = []
    while proc.poll() is None:
        for p in psutil.process_iter(["cmdline"]):
            line = " ".join(p.info["cmdline"] or [])
            if KEY in line:
                leaked.append(line)
        time.sleep(0.2)
    out = proc.stdout.read() if proc.stdout else ""
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
    summary = report / "eval.json"
    return done, (json.loads(summary.read_text()) if summary.exists() else {}), leaked


@pytest.mark.boots
def test_the_real_sgl_eval_scores_a_right_server_and_the_key_is_on_no_command_line(
    tmp_path: Path, containers: list[Container]
) -> None:
    c = start(tmp_path, GLM5_API_KEY=KEY)
    containers.append(c)
    c.wait_healthy()
    items = dataset(tmp_path / "arith.jsonl")
    done, summary, leaked = run_eval(
        c, "--min-score", "0.9", "--", "--from-dataset", str(items), "--num-threads", "3"
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert leaked == []
    assert summary["score"] == 1.0 and summary["passed"] is True and summary["examples"] == 6
    assert summary["comparable"] is False  # a local set: judged by --min-score only
    assert "ci/eval: PASS gsm8k 100.0 against 90.0 (--min-score)" in done.stdout
    assert KEY not in done.stdout and KEY not in Path(str(summary["metrics"])).read_text()


@pytest.mark.boots
def test_a_server_answering_wrongly_scores_zero_and_fails_the_bar(
    tmp_path: Path, containers: list[Container]
) -> None:
    c = start(tmp_path, "wrong-answer", GLM5_API_KEY=KEY, GLM5_VERIFY="off")
    containers.append(c)
    c.wait_healthy()
    items = dataset(tmp_path / "arith.jsonl", n=4)
    done, summary, _ = run_eval(c, "--min-score", "0.5", "--", "--from-dataset", str(items))
    assert done.returncode == 1, done.stdout[-3000:]
    assert summary["score"] == 0.0 and summary["passed"] is False
    assert "ci/eval: FAIL gsm8k 0.0 against 50.0" in done.stdout


def test_only_the_published_run_of_a_benchmark_with_a_figure_is_held_to_it() -> None:
    published = dict(eval_score.PUBLISHED_RUN) | {
        "seed": None,
        "num_threads": 16,
    }  # neither changes the question
    assert eval_score.differences(published) == []
    least, why = eval_score.bar("gpqa", [], partial=False, min_score=None)
    assert (
        least == pytest.approx(0.83) and "GPQA-Diamond 86.0" in why and "huggingface.co/zai-org/GLM-5" in why
    )
    for changed in ({"n_repeats": 1}, {"num_examples": 20}, {"temperature": 0.0}, {"thinking": False},
                    {"from_dataset": "x.jsonl"}, {"max_tokens": 4096}, {"prompt": "matharena-aime"}):  # fmt: skip
        differs = eval_score.differences(published | changed)
        flag = "--" + next(iter(changed)).replace("_", "-")
        assert len(differs) == 1 and differs[0].startswith(flag), differs
        least, why = eval_score.bar("gpqa", differs, partial=False, min_score=None)
        assert least is None and flag in why and "not comparable" in why
    assert eval_score.bar("gpqa", [], partial=True, min_score=None)[0] is None  # interrupted: reported only
    assert eval_score.bar("gsm8k", [], partial=False, min_score=None) == (
        None,
        "no published GLM-5 figure for gsm8k (known: gpqa)",
    )
    assert eval_score.bar("gsm8k", ["--from-dataset x"], partial=False, min_score=0.7) == (0.7, "--min-score")


def test_the_headline_is_sgl_evals_pass_at_1_over_repeats_else_the_score() -> None:
    repeated = {"n_repeats": 8, "aggregate": {"pass@1": 0.84, "pass@8": 0.95, "score": 0.9}}
    assert eval_score.headline(repeated) == 0.84
    assert eval_score.headline({"n_repeats": 1, "aggregate": {"score": 0.5}}) == 0.5


@pytest.mark.boots
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "--api-key", "x"], "pass the key as GLM5_API_KEY_FILE"),
        (["--", "--api", "x"], "pass the key as GLM5_API_KEY_FILE"),  # sgl-eval's parser takes abbreviations
        (["--", "--api-key=x"], "pass the key as GLM5_API_KEY_FILE"),
        (["--benchmark", "nope"], "Eval `nope` not found. Available: aime24"),
        (["--num-examples", "0"], "--num-examples 0: 1 or more"),
    ],
)
def test_bad_usage_is_refused_before_anything_runs(tmp_path: Path, args: list[str], message: str) -> None:
    done = subprocess.run([str(EVAL), "--url", "http://127.0.0.1:9", "--report-dir", str(tmp_path / "r"), *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "x" not in done.stdout and not (tmp_path / "r").exists()  # nothing printed, nothing run


def test_the_readme_states_the_figure_the_bar_and_the_evaluator_pinned_here() -> None:
    text = (ROOT / "README.md").read_text()
    figure = eval_score.PUBLISHED["gpqa"]
    pinned = next(line for line in (ROOT / "ci" / "requirements-eval.txt").read_text().splitlines()
                  if line.startswith("sgl-eval=="))  # fmt: skip
    said = next(line for line in text.splitlines() if line.startswith("| operators | `ci/eval"))
    assert f"passes at {(figure.score - eval_score.ALLOWANCE) * 100:.1f} or more" in said
    assert (
        f"gives {figure.score * 100:.1f}" in said and f"less {eval_score.ALLOWANCE * 100:.0f} points" in said
    )
    assert f"`sgl-eval` {pinned.split('==')[1]}" in said
