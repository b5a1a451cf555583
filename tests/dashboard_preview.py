"""A picture of the dashboard's panels without Grafana: the real Prometheus scrapes a start of the SGLang server test
double (real supervisord, the kit's exporter) behind the real gateway under a changing load, then every panel's
queries run over that time and are plotted, one plot per panel, in the dashboard's order.

    .venv/bin/python tests/dashboard_preview.py OUT.png [--load-seconds 150]

The numbers are the double's (tests/doubles/sglang_metrics_double.py), not GLM-5's: the picture shows that each
query finds its series and what it draws, not how fast the server is.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]

from helpers.container import free_port, start  # noqa: E402
from helpers.gateway import KEY, Gateway, chat  # noqa: E402
from helpers.prometheus import Prometheus  # noqa: E402
from monitoring import dashboard  # noqa: E402

RATE_WINDOW = "10s"


def drive(url: str, seconds: float) -> None:
    """Concurrency 1, 4, 8, 12, 16, then 2: past the double's 4 graph sizes and its 8 running requests."""
    steps = (1, 4, 8, 12, 16, 2)
    for streams in steps:
        end = time.monotonic() + seconds / len(steps)
        with ThreadPoolExecutor(streams) as pool:
            while time.monotonic() < end:
                list(pool.map(lambda i: chat(url, f"What is 2+{i}?", stream=bool(i % 2)), range(streams)))


def legend(fmt: str, labels: dict[str, str]) -> str:
    for key, value in labels.items():
        fmt = fmt.replace("{{" + key + "}}", value)
    return fmt


def plot(prom: Prometheus, began: float, ended: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = json.loads(dashboard.json_text())
    panels = [p for p in model["panels"] if p["type"] != "row"]
    cols = 4
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.2, rows * 3.2), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", RATE_WINDOW)
            data = prom.api("query_range", query=expr, start=str(began), end=str(ended), step="2")
            for series in data["result"]:
                xs = [float(t) - began for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, label=legend(target.get("legendFormat", ""), series["metric"]))
        ax.set_title(f"{panel['title']} [{panel['fieldConfig']['defaults'].get('unit', '')}]", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("seconds", fontsize=7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="best")
        else:
            ax.text(0.5, 0.5, "no series", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        "glm5-serve dashboard panels: their queries on a real Prometheus (SGLang server test double behind smg)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--load-seconds", type=float, default=150)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "c").mkdir()
        exporter_port = free_port()
        began = time.time()
        # A slow start (0.3 s per step of the double's log) so that the start and its capture show.
        c = start(
            tmp / "c", GLM5_API_KEY=KEY, GLM5_EXPORTER_PORT=str(exporter_port), SGLANG_DOUBLE_TICK="0.3"
        )
        gw = Gateway(tmp, {"glm5-a": c})
        prom = Prometheus(
            tmp,
            {"glm5": f"127.0.0.1:{c.port}", "glm5-exporter": f"127.0.0.1:{exporter_port}",
             "glm5-gateway": f"127.0.0.1:{gw.metrics}", "glm5-rotation": f"127.0.0.1:{gw.rotation_metrics}"},
        )  # fmt: skip
        try:
            c.wait_healthy(timeout=300)
            gw.wait_healthy(1, timeout=120)
            drive(gw.url, args.load_seconds)
            time.sleep(15)
            plot(prom, began, time.time(), args.out)
        finally:
            prom.stop()
            gw.stop()
            c.proc.send_signal(signal.SIGTERM)
            c.proc.wait(timeout=30)
            for p in c.leftovers():
                p.kill()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
