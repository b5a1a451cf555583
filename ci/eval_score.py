"""How ci/eval judges sgl-eval's result: its headline, GLM-5's published figure and the bar (no sgl-eval import)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Published:
    score: float  # a fraction, as sgl-eval reports it
    name: str
    source: str


# GLM-5's model card (the BF16 model), https://huggingface.co/zai-org/GLM-5: GPQA-Diamond 86.0. sgl-eval's `gpqa` is
# GPQA Diamond (198 questions, 8 repeats by default, thinking on).
PUBLISHED = {"gpqa": Published(0.860, "GPQA-Diamond", "https://huggingface.co/zai-org/GLM-5")}
# The bar sits 3 points under the figure: NVFP4 weights in place of BF16, and the sampling noise of 8 repeats of
# 198 questions at temperature 1 (sgl-eval prints its SEM: about 1 point). A kernel fault of the kind the start's
# verification looks for costs far more.
ALLOWANCE = 0.03
# GLM-5's recommended sampling for most tasks (temperature 1.0, top-p 0.95: https://unsloth.ai/docs/models/tutorials/
# glm-5, after the model card); flags after `--` come later on sgl-eval's command line and win.
SAMPLING = ("--temperature", "1.0", "--top-p", "0.95")
# The run the figure is compared with: sgl-eval's `run` options (its own parser's names) as ci/eval sets them. Any
# other value (fewer examples or repeats, other sampling, thinking off, a bound on the answer, another prompt or set)
# asks another question, and the score is reported, not held to the figure.
PUBLISHED_RUN: dict[str, Any] = {
    "num_examples": None, "n_repeats": None, "max_tokens": None, "temperature": 1.0, "top_p": 0.95,
    "thinking": None, "reasoning_effort": None, "chat_template_kwarg": None, "prompt": None,
    "from_dataset": None, "preset": None, "load_preset_from_model_id": None,
}  # fmt: skip


def headline(metrics: dict[str, Any]) -> float:
    """sgl-eval's headline metric: pass@1 averaged over the repeats, else the single pass's score."""
    aggregate = metrics["aggregate"]
    if metrics.get("n_repeats", 1) > 1 and "pass@1" in aggregate:
        return float(aggregate["pass@1"])
    return float(aggregate["score"])


def differences(options: dict[str, Any]) -> list[str]:
    """The options (sgl-eval's parsed `run` namespace) that differ from the published run, as flags."""
    return [
        f"--{key.replace('_', '-')} {options.get(key)}"
        for key, value in PUBLISHED_RUN.items()
        if options.get(key) != value
    ]


def bar(
    benchmark: str, differs: list[str], partial: bool, min_score: float | None
) -> tuple[float | None, str]:
    """The least score that passes (None: report only) and why."""
    if min_score is not None:
        return min_score, "--min-score"
    figure = PUBLISHED.get(benchmark)
    if figure is None:
        return None, f"no published GLM-5 figure for {benchmark} (known: {', '.join(sorted(PUBLISHED))})"
    if partial:
        return None, "an interrupted run is not comparable to the published figure"
    if differs:
        return None, f"not the published run ({', '.join(differs)}): not comparable to the figure"
    return (
        figure.score - ALLOWANCE,
        f"{figure.name} {figure.score * 100:.1f} ({figure.source}) less {ALLOWANCE * 100:.0f} points",
    )


def newest_metrics(out_dir: Path, benchmark: str, since: float) -> dict[str, Any] | None:
    runs = [p for p in out_dir.glob(f"sgl_eval_{benchmark}_*/metrics.json") if p.stat().st_mtime >= since]
    if not runs:
        return None
    path = max(runs, key=lambda p: p.stat().st_mtime)
    return dict(json.loads(path.read_text())) | {"metrics_path": str(path)}
