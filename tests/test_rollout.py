"""Upgrades and overload behind the real SGLang Model Gateway (smg 1.13.0, started by gateway/launch with the kit's
rotation), each replica the kit's own container start (entrypoint.sh, the real supervisord, the server double):
a rolling replacement under load fails no request, and 4x the capacity fails nothing but the gateway's 429 and 503."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from helpers.container import Container
from helpers.gateway import KEY, Gateway, chat_request, p99, replace_each, two_replicas

pytestmark = [pytest.mark.boots, pytest.mark.xdist_group("rollout")]  # one at a time: they time requests

SYSTEM = (
    "You are the support assistant of a large shipping company. " * 40
)  # shared by every client, as in chat


def ask(url: str, text: str, timeout: float = 60) -> tuple[int, float, dict[str, str]]:
    """One chat request: its status, seconds and headers (0: no HTTP answer at all)."""
    body = {"model": "glm-5", "max_tokens": 16,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]}  # fmt: skip
    request = chat_request(url, body)
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            return r.status, time.monotonic() - began, {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as err:
        err.read()
        return err.code, time.monotonic() - began, {k.lower(): v for k, v in err.headers.items()}
    except OSError:
        return 0, time.monotonic() - began, {}


def test_a_rolling_replacement_under_load_fails_no_request(
    tmp_path: Path, containers: list[Container]
) -> None:
    env = {"GLM5_API_KEY": KEY, "GLM5_DRAIN_SECONDS": "10", "SGLANG_DOUBLE_SERVE_SECONDS": "0.2"}
    replicas = two_replicas(tmp_path, containers, env)
    gw = Gateway(tmp_path, {f"glm5-{n}": c for n, c in replicas.items()})
    try:
        gw.wait_healthy(2)
        results: list[tuple[int, float]] = []
        codes: Counter[str] = Counter()  # smg's x-smg-error-code of what failed
        stop = threading.Event()

        def client(i: int) -> None:
            turn = 0
            while not stop.is_set():
                status, seconds, headers = ask(gw.url, f"[client {i}] turn {turn}: where is my parcel?")
                results.append((status, seconds))
                if status != 200:
                    codes[headers.get("x-smg-error-code", str(status))] += 1
                turn += 1
                time.sleep(0.05)

        clients = [threading.Thread(target=client, args=(i,)) for i in range(24)]  # twice the 12
        for t in clients:
            t.start()
        time.sleep(2)
        replaced = replace_each(gw, replicas, containers, env)
        time.sleep(2)
        stop.set()
        for t in clients:
            t.join(timeout=90)
        log = (tmp_path / "gateway.out").read_text()
    finally:
        gw.stop()
    statuses = Counter(s for s, _ in results)
    figures = (
        f"{len(results)} requests, {statuses}, p99 {p99([s for _, s in results]):.2f} s, failed as {codes}"
    )
    print(f"\nrolling replacement: {figures}")
    assert len(results) > 200 and statuses == {200: len(results)}, figures
    # Each stopped replica left the rotation and each replacement joined it, once verified.
    assert (
        log.count("glm5-a is out of the rotation (draining)") + log.count("glm5-a is out of the rotation (no")
        >= 1
    )
    assert log.count("glm5-a joins the rotation") >= 2 and log.count("glm5-b joins the rotation") >= 2, log[
        -3000:
    ]
    for new in replaced.values():
        assert "verified, 57/57 right" in new.entrypoint_output.read_text()


def test_four_times_the_capacity_fails_nothing_but_the_gateways_429_and_503(
    tmp_path: Path, containers: list[Container]
) -> None:
    capacity = 4  # each replica runs 4 at once (its scheduler line says so); a request takes 3 s on it
    env = {"GLM5_API_KEY": KEY, "GLM5_CUDA_GRAPH_MAX_BS_DECODE": str(capacity), "GLM5_VERIFY": "off",
           "SGLANG_DOUBLE_MAX_RUNNING_REQUESTS": str(capacity), "SGLANG_DOUBLE_SERVE_SECONDS": "3"}  # fmt: skip
    replicas = two_replicas(tmp_path, containers, env)
    # Sized by gateway/launch from the replicas: 2 x 4 running, a queue as long; the queue timeout shortened.
    gw = Gateway(tmp_path, {f"glm5-{n}": c for n, c in replicas.items()}, smg_flags=("--queue-timeout-secs", "2"),
                 GLM5_CUDA_GRAPH_MAX_BS_DECODE=str(capacity))  # fmt: skip
    try:
        gw.wait_healthy(2)
        assert "--max-concurrent-requests 0 --queue-size 8" in " ".join(gw.argv())
        results: list[tuple[int, float, dict[str, str]]] = []
        for wave in range(2):
            threads = [
                threading.Thread(
                    target=lambda i=i, w=wave: results.append(ask(gw.url, f"wave {w} request {i}"))
                )
                for i in range(4 * 2 * capacity)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
    finally:
        gw.stop()
    statuses = Counter(s for s, _, _ in results)
    figures = f"{len(results)} requests, {statuses}, p99 {p99([s for _, s, _ in results]):.2f} s"
    print(f"\noverload: {figures}")
    assert set(statuses) == {200, 429, 503} and statuses[200] >= 2 * 2 * capacity, figures
    for status, seconds, headers in results:
        if status == 429:  # the queue is full: at once
            assert headers.get("retry-after") == "2" and seconds < 1.5, (seconds, headers)
        elif status == 503:  # queued past the timeout
            assert headers.get("retry-after") == "2" and 1.9 < seconds < 3.5, (seconds, headers)
    held = {n: int((c.tmp / "peak-requests").read_text()) for n, c in replicas.items()}
    print(f"most requests each replica held at once (running and queued in it): {held}")
    # Each replica held at most its capacity and the spill margin (1 here: gateway/launch.py): the rest waited in the
    # gateway, where a shared prefix (cache_aware) would otherwise pile them all onto one replica.
    assert all(h <= capacity + 1 for h in held.values()), held
