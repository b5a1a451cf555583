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


def headline(metrics: dict[str, Any]) -> float:
    """sgl-eval's headline metric: pass@1 averaged over the repeats, else the single pass's score."""
    aggregate = metrics["aggregate"]
    if metrics.get("n_repeats", 1) > 1 and "pass@1" in aggregate:
        return float(aggregate["pass@1"])
    return float(aggregate["score"])


def bar(benchmark: str, comparable: bool, min_score: float | None) -> tuple[float | None, str]:
    """The least score that passes (None: report only) and why."""
    if min_score is not None:
        return min_score, "--min-score"
    figure = PUBLISHED.get(benchmark)
    if figure is None:
        return None, f"no published GLM-5 figure for {benchmark} (known: {', '.join(sorted(PUBLISHED))})"
    if not comparable:
        return None, "a subset or a local set is not comparable to the published figure"
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
