"""The kit's reliability claims in the box's world (the server double's mode box, tests/doubles/sglang_box.py: a KV
pool in tokens, decode rates falling with concurrency, answers of thousands of tokens), behind the real smg started
by gateway/launch, each replica the kit's own container start. Time runs SCALE times the box's: the kit's bounds are
set by the same factor (GLM5_DRAIN_SECONDS, smg's flags after `--`)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from conftest import ROOT
from helpers.container import Container, free_port, start
from helpers.gateway import KEY, Gateway, chat_request, in_rotation, replace_each, two_replicas, wait_for

pytestmark = [pytest.mark.boots]

CONFIG = tomllib.loads((ROOT / "entrypoint" / "glm5.toml").read_text())


def stream(url: str, prompt: str, max_tokens: int, timeout: float = 60) -> tuple[int, bool, float]:
    """One streamed chat: its status, whether it ended as SGLang ends a whole answer ([DONE] after a finish), seconds."""
    body = {"model": "glm-5", "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
    request = chat_request(url, body)
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            lines = [line.strip() for line in r]
            finished = any(b'"finish_reason": "stop"' in line for line in lines)
            return r.status, finished and lines[-2:].count(b"data: [DONE]") == 1, time.monotonic() - began
    except urllib.error.HTTPError as err:
        err.read()
        return err.code, False, time.monotonic() - began
    except OSError:
        return 0, False, time.monotonic() - began


ROLLOUT = pytest.mark.xdist_group("rollout")  # one at a time: they time requests


@ROLLOUT
def test_a_rolling_replacement_cuts_no_answer_longer_than_yesterdays_drain(
    tmp_path: Path, containers: list[Container]
) -> None:
    """Streamed answers of 6,000 tokens (about 150 s of the box at 8 streams a replica: past the 120 s drain bound the
    kit had) through a replacement of each replica: the drain, glm5.toml's drain_seconds scaled, cuts none."""
    scale = 0.01
    drain = round(CONFIG["deployment"]["drain_seconds"] * scale)
    timeout = round(CONFIG["gateway"]["request_timeout_seconds"] * scale)
    env = {"GLM5_API_KEY": KEY, "GLM5_VERIFY": "off", "GLM5_DRAIN_SECONDS": str(drain),
           "SGLANG_DOUBLE_TIME_SCALE": str(scale), "SGLANG_DOUBLE_ANSWER_TOKENS": "6000"}  # fmt: skip
    replicas = two_replicas(tmp_path, containers, env | {"SGLANG_DOUBLE_MODE": "box"})
    gw = Gateway(tmp_path, {f"glm5-{n}": c for n, c in replicas.items()},
                 smg_flags=("--request-timeout-secs", str(timeout)))  # fmt: skip
    results: list[tuple[int, bool, float]] = []
    try:
        gw.wait_healthy(2)
        stop = threading.Event()

        def client(i: int) -> None:
            while not stop.is_set():
                results.append(stream(gw.url, f"[client {i}] think it through: where is my parcel?", 6000))

        clients = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in clients:
            t.start()
        time.sleep(1)
        replace_each(gw, replicas, containers, env, "box", stop_timeout=drain + 20)  # answers in flight
        stop.set()
        for t in clients:
            t.join(timeout=drain + 30)
    finally:
        gw.stop()
    cut = [r for r in results if not (r[0] == 200 and r[1])]
    longest = max(s for _, _, s in results)
    figures = (
        f"{len(results)} answers, {len(cut)} cut ({Counter(s for s, _, _ in cut)}), longest {longest:.1f} s"
    )
    print(f"\nrolling replacement, box answers at scale {scale}, drain {drain} s: {figures}")
    assert longest > 120 * scale, f"no answer outlasted the old 120 s bound: {figures}"
    assert len(results) >= 8 and not cut, figures


@dataclass
class Absent:
    """A replica the workers file lists that never started: its ports answer nothing."""

    port: int
    exporter_port: int


@pytest.mark.xdist_group(
    "missing_replica"
)  # beside the rollout group: no request waits in a server here at all
def test_a_missing_replicas_share_leaves_with_it(tmp_path: Path, containers: list[Container]) -> None:
    """Two replicas behind a gateway sized for four (the autoscaling overlay at its minimum: the workers file lists
    four, two never start), then one stopped as an upgrade stops it while streams run, then one failed (every process
    of its container killed), each time under 16 streams of the context bound, 4x what one replica's pool holds: none
    waits inside a server past the gateway's queue timeout; the excess is refused at once (429) or at the queue
    timeout (503), while the survivors run what their pools hold."""
    scale, answer, queue_timeout = 0.05, 1000, 2
    pool = 4 * CONFIG["gateway"]["context_tokens"]  # 4 requests of the context bound a replica
    env = {"GLM5_API_KEY": KEY, "GLM5_VERIFY": "off", "SGLANG_DOUBLE_TIME_SCALE": str(scale),
           "SGLANG_DOUBLE_ANSWER_TOKENS": str(answer), "SGLANG_DOUBLE_MAX_TOTAL_TOKENS": str(pool)}  # fmt: skip
    replicas = two_replicas(tmp_path, containers, env | {"SGLANG_DOUBLE_MODE": "box"})
    never = {
        f"absent-{n}": Absent(free_port(), free_port()) for n in (1, 2)
    }  # nothing listens on their ports
    gw = Gateway(tmp_path, {f"glm5-{n}": c for n, c in replicas.items()} | never,  # type: ignore[arg-type]
                 smg_flags=("--queue-timeout-secs", str(queue_timeout)))  # fmt: skip
    prompt = "word " * (
        (CONFIG["gateway"]["context_tokens"] - answer) * 4 // 5 - 40
    )  # the double's 4 chars a token
    figures: list[str] = []

    def wave(name: str, during: Callable[[], None] = lambda: None) -> None:
        results: list[tuple[int, bool, float]] = []
        threads = [
            threading.Thread(target=lambda: results.append(stream(gw.url, prompt, answer))) for _ in range(16)
        ]
        for t in threads:
            t.start()
        during()
        for t in threads:
            t.join(timeout=60)
        waited = {n: float((c.tmp / "kv-wait-seconds").read_text()) for n, c in replicas.items()
                  if (c.tmp / "kv-wait-seconds").exists()}  # fmt: skip
        statuses = Counter(s for s, _, _ in results)
        refused = [s for status, _, s in results if status != 200]
        figures.append(f"{name}: {statuses[200]} admitted, {len(refused)} refused ({dict(statuses)}, the slowest "
                       f"refusal {max(refused, default=0):.2f} s), longest wait inside a server {waited}")  # fmt: skip
        print(f"\nmissing replica, {figures[-1]}")
        assert set(statuses) <= {200, 429, 503} and statuses[200] >= 4 * len(replicas), (
            figures
        )  # each its share
        # at the queue timeout; on a loaded 2-core CI machine the 503 came up to 1.9 s late (3.86 s at 2 s): the
        # bound is the gateway's, and what waited inside a server is held to the timeout itself below
        assert all(s < queue_timeout + 2.5 for s in refused), figures
        assert all(w < queue_timeout for w in waited.values()), figures

    try:
        gw.wait_healthy(2)
        assert "--priority-scheduler-enabled" in gw.argv()
        # each replica registered with what its own pool holds (its /ready, from its server's sizes line): smg admits 8
        assert [w["slots"] for w in json.loads(gw.rotation.read_text())["workers"]] == [4, 4]
        wave("autoscaling at its minimum (sized for 4, 2 serve)")  # every replica that runs serves: as before
        upgrade = replicas["b"]
        wave(
            "b stopped as an upgrade stops it",
            lambda: (time.sleep(0.3), upgrade.proc.send_signal(signal.SIGTERM)),
        )
        assert upgrade.proc.wait(timeout=60) == 0
        (tmp_path / "b2").mkdir()
        replicas["b"] = start(tmp_path / "b2", port=upgrade.port, GLM5_EXPORTER_PORT=str(upgrade.exporter_port),
                              **env | {"SGLANG_DOUBLE_MODE": "box"})  # fmt: skip
        containers.append(replicas["b"])
        wait_for(lambda: in_rotation(gw, replicas["b"]), 90)
        gw.wait_healthy(2)  # smg routes to it (the rotation's record alone does not say so)
        failed = replicas.pop("a")
        for process in [*failed.leftovers(), psutil.Process(failed.proc.pid)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        wait_for(lambda: not in_rotation(gw, failed), 30)
        wave("a failed (its processes killed)")
    finally:
        gw.stop()
    print("\n" + "\n".join(figures))
