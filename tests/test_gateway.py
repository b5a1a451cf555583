"""The real SGLang Model Gateway (smg 1.13.0 from PyPI, started by gateway/launch) in front of SGLang server
doubles on loopback, each started through the real entrypoint and supervisord."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, stop_all
from helpers.container import POLL, Container, free_port, start
from helpers.gateway import KEY, Gateway, chat
from test_bench import needs_bench_venv, run_bench

pytestmark = pytest.mark.boots  # boots processes or runs real tools: not in ci/test --fast

PREFIX = "You are the support assistant of a large shipping company. " * 40  # ~2400 characters


def served(c: Container) -> float:
    """Prompt tokens this replica has processed (its /metrics): which replica took a request."""
    with urllib.request.urlopen(f"http://127.0.0.1:{c.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    # One series per is_streaming value (sglang 0.5.23 TokenizerMetricsCollector): their sum.
    return sum(float(v) for v in re.findall(r"^sglang:prompt_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


def boot_pair(tmp_path: Path, containers: list[Container]) -> Iterator[tuple[Gateway, list[Container]]]:
    """Two replicas (each the kit's container start) behind a gateway, both in its rotation."""
    replicas = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        c = start(tmp_path / name, GLM5_API_KEY=KEY)
        containers.append(c)
        replicas.append(c)
        c.wait_healthy()  # (it waits for a start after the call: one at a time)
    gw = Gateway(tmp_path, {"glm5-a": replicas[0], "glm5-b": replicas[1]})
    try:
        gw.wait_healthy(2)
        yield gw, replicas
    finally:
        gw.stop()


@pytest.fixture
def pair(tmp_path: Path, containers: list[Container]) -> Iterator[tuple[Gateway, list[Container]]]:
    """A pair of the test's own: for a test that stops, kills or adds replicas."""
    yield from boot_pair(tmp_path, containers)


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, list[Container]]]:
    """One pair for the tests that only send requests (each compares what it sent, not totals): booted once, on the
    one worker of the group SHARED."""
    made: list[Container] = []
    try:
        yield from boot_pair(tmp_path_factory.mktemp("pair"), made)
    finally:
        stop_all(made)


SHARED = pytest.mark.xdist_group("gateway_pair")


@SHARED
def test_the_key_is_enforced_at_the_gateway_and_in_no_argv(
    shared_pair: tuple[Gateway, list[Container]],
) -> None:
    gw, _ = shared_pair
    # smg's own answers (the replicas answer 401 with {"error": "Unauthorized"}): the gateway refused them itself.
    assert chat(gw.url, "hello", key=None) == (401, {"body": chat(gw.url, "hello", key=None)[1]["body"]})
    assert "Missing API key" in chat(gw.url, "hello", key=None)[1]["body"]
    assert "Invalid API key" in chat(gw.url, "hello", key="wrong-key-0123456789")[1]["body"]
    code, body = chat(gw.url, "What is the capital of France?")
    assert code == 200 and "Paris" in body["choices"][0]["message"]["content"]
    cmdline = Path(f"/proc/{gw.proc.pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline and KEY not in gw.output.read_text()


@SHARED
def test_requests_spread_and_a_shared_prefix_stays_on_one_replica(
    shared_pair: tuple[Gateway, list[Container]],
) -> None:
    gw, (a, b) = shared_pair
    before = served(a), served(b)
    topics = ["tides", "volcanoes", "bread", "chess", "orbits", "violins", "glaciers", "bees", "ink", "radar",
              "coral", "steam"]  # fmt: skip
    for i, topic in enumerate(topics):  # nothing shared: no prefix to stick to
        assert chat(gw.url, f"{topic}: {i * 7919} explain briefly")[0] == 200
    spread = served(a) - before[0], served(b) - before[1]
    assert spread[0] > 0 and spread[1] > 0, spread  # both replicas took some
    for group in range(3):
        before = served(a), served(b)
        for i in range(6):
            assert chat(gw.url, f"{PREFIX} [conversation {group}] turn {i}")[0] == 200
        took = served(a) - before[0], served(b) - before[1]
        assert 0 in took, f"a shared prefix was split over both replicas: {took}"  # cache-aware affinity


def test_a_replica_not_ready_or_dead_gets_no_traffic_and_one_that_turns_ready_does(
    tmp_path: Path, pair: tuple[Gateway, list[Container]], containers: list[Container]
) -> None:
    gw, (a, b) = pair
    (tmp_path / "c").mkdir()
    late = start(tmp_path / "c", "never-ready", GLM5_API_KEY=KEY)  # capturing forever: /health 503
    containers.append(late)
    gw.write({"glm5-a": a, "glm5-b": b, "glm5-c": late})
    time.sleep(3)
    assert gw.readiness()["healthy_workers"] == 2
    for i in range(8):
        assert chat(gw.url, f"question {i} for a replica that is not ready")[0] == 200
    for process in b.leftovers():  # the whole container of replica b dies at once (as on a lost node)
        process.kill()
    died = time.monotonic()
    # Its exporter silent for rotation.MISSED_PASSES passes, the rotation takes it out; until then a request smg
    # sends it fails (the gateway runs a request once: README, Security), after it none does.
    while f"http://127.0.0.1:{b.port}" in gw.registered():
        assert time.monotonic() - died < 10, gw.output.read_text()[-2000:]
        time.sleep(0.1)
    for i in range(10):
        assert chat(gw.url, f"question {i} after a replica died")[0] == 200  # all on the live one
    gw.wait_healthy(1)
    (tmp_path / "d").mkdir()
    fresh = start(tmp_path / "d", GLM5_API_KEY=KEY)
    containers.append(fresh)
    fresh.wait_healthy()
    gw.write({"glm5-a": a, "glm5-b": b, "glm5-c": late, "glm5-d": fresh})
    gw.wait_healthy(2)
    before = served(fresh)
    for i, topic in enumerate(
        ["maps", "clocks", "salt", "kites", "moss", "dunes", "owls", "jade", "rust", "fog"]
    ):
        assert chat(gw.url, f"{topic}? {i * 104729}")[0] == 200
    assert served(fresh) > before  # a replica that turned ready takes traffic
    assert served(late) == 0  # never reached (no request: no prompt_tokens_total series at all, as in SGLang)


@SHARED
def test_ci_smoke_passes_through_the_gateway(
    shared_pair: tuple[Gateway, list[Container]], tmp_path: Path
) -> None:
    """Streaming, tool calls and reasoning pass through unchanged (ci/smoke's own checks)."""
    gw, (a, _) = shared_pair
    report = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_")} | {"GLM5_API_KEY": KEY}
    done = subprocess.run(
        [str(ROOT / "ci" / "smoke"), "--url", gw.url, "--metrics-url", f"http://127.0.0.1:{a.port}",
         "--timeout", "60", "--poll", str(POLL), "--report-dir", str(report)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    checks = {c["name"]: c["passed"] for c in json.loads((report / "smoke.json").read_text())["checks"]}
    assert all(checks.values()) and {"chat_stream", "tool_call", "reasoning"} <= set(checks)


def test_the_compose_profile_command_starts_the_real_gateway(
    tmp_path: Path, containers: list[Container]
) -> None:
    """The gateway service's command from `docker compose --profile gateway config`, run by the image's
    entrypoint, with the workers file where compose mounts it replaced by a path here."""
    import yaml

    compose = subprocess.run(
        [str(Path(sys.executable).parent / "docker-compose"), "-f", str(ROOT / "docker-compose.yml"),
         "--profile", "gateway", "config"], capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    service = yaml.safe_load(compose.stdout)["services"]["gateway"]
    command, probe = service["command"], service["healthcheck"]["test"]
    (tmp_path / "a").mkdir()
    replica = start(tmp_path / "a", GLM5_API_KEY=KEY)
    containers.append(replica)
    replica.wait_healthy()
    workers = tmp_path / "workers.json"
    workers.write_text(
        json.dumps(
            {
                "version": 1,
                "workers": [
                    {
                        "id": "this-host",
                        "url": f"http://127.0.0.1:{replica.port}",
                        "ready_url": f"http://127.0.0.1:{replica.exporter_port}/ready",
                    }
                ],
            }
        )
    )
    port = free_port()
    argv = [str(workers) if part.endswith("workers.json") else part for part in command]
    argv += ["--rotation-file", str(tmp_path / "rotation" / "workers.json")]  # not the image's /tmp here
    rotation_port = free_port()  # not the image's fixed port: other tests listen here
    argv += ["--rotation-metrics-port", str(rotation_port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_")} | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "GLM5_API_KEY": KEY, "GLM5_HOME": str(ROOT),
    }  # fmt: skip
    proc = subprocess.Popen(
        [str(ROOT / "entrypoint" / "entrypoint.sh"), *argv, "--", "--host", "127.0.0.1", "--port", str(port),
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--health-check-port",
         str(free_port()), "--worker-startup-check-interval", "1"],
        env=env, stdout=(tmp_path / "gateway.out").open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while chat(f"http://127.0.0.1:{port}", "What is the capital of France?")[0] != 200:
            said = (tmp_path / "gateway.out").read_text()[-3000:]
            assert proc.poll() is None and time.monotonic() < deadline, said
            time.sleep(0.5)
        # compose's healthcheck, as the service runs it (the kit's /ready on the rotation's port)
        assert probe[0] == "CMD" and ":29001/ready" in probe[-1], probe
        healthy = subprocess.run(
            [sys.executable, *probe[2:-1], probe[-1].replace(":29001/", f":{rotation_port}/")],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert healthy.returncode == 0, healthy.stderr
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@SHARED
@needs_bench_venv
def test_ci_bench_measures_the_replicas_through_the_gateway(
    shared_pair: tuple[Gateway, list[Container]], tmp_path: Path
) -> None:
    gw, (a, b) = shared_pair
    before = served(a), served(b)
    # smg's discovery mode routes /generate only with a model, which bench_serving's sglang client does not send:
    # the OpenAI chat client through the gateway (its completions client sends best_of, which smg refuses with stream).
    done = run_bench(
        tmp_path,
        "--url",
        gw.url,
        "--label",
        "gateway",
        "--backend",
        "sglang-oai-chat",
        env={"GLM5_API_KEY": KEY},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "out" / "gateway.json").read_text())
    assert record["result"]["completed"] == 12
    assert served(a) + served(b) > sum(before)  # the requests reached the replicas through it
