"""The kit around the REAL SGLang 0.5.23 server on the CPU (tests/helpers/real_server.py): a tiny random Llama,
started through entrypoint.sh, the real supervisord and entrypoint/launch, as the container runs it.

Budget: four real starts per run, two alive at once (one xdist group, so one worker): `shared`, started by the
first test that boots so its imports overlap the others', serves every read-only check and is the replica that
stays when the other of a pair behind the real smg is replaced under load; the stop while loading, that stopped
replica and its replacement (started once it is gone) get their own. The server program's flag classification is
checked without a start.
"""

from __future__ import annotations

import http.client
import inspect
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from configuration import config, state
from conftest import healthcheck_json
from healthcheck import logscan
from helpers import real_server, sglang_cpu_server
from helpers.container import exporter_samples
from helpers.gateway import Gateway, chat_request
from helpers.real_server import RealContainer
from test_monitoring import base_name, used_series

KEY = "real-server-key-0123456789abcdef"
ADMIN_KEY = "real-server-operator-key-fedcba9876"  # GLM5_ADMIN_API_KEY: SGLang's admin endpoints
# Series the kit's alerts, dashboard or KEDA query use that the real server exports only after an event: its
# multiprocess collector writes a series once it has a sample (the double shows them at 0 from the start).
AFTER_AN_EVENT = {"sglang:num_retracted_requests_total": "a retraction (the KV pool full while decoding)"}


# --- the server program's flags, without a start ---------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [{}, {"GLM5_MAX_RUNNING_REQUESTS": "64", "GLM5_KV_CACHE_DTYPE": "bf16"}, {"GLM5_API_KEY": KEY}],
)
def test_every_flag_the_kit_renders_is_classified_for_the_cpu_server(
    env: dict[str, str], tmp_path: Path
) -> None:
    effective = config.resolve(env | {"GLM5_STATE_DIR": str(tmp_path)})
    if effective.secret_options:  # the file the kit writes before the start: its keys are classified too
        state.write_server_config(tmp_path, effective.secret_options)
    out = sglang_cpu_server.classify(effective.argv[len(config.SERVER_PROGRAM) :], "/tiny")
    pairs = dict(zip(out, [*out[1:], ""], strict=True))
    assert pairs["--model-path"] == "/tiny" and pairs["--host"] == "127.0.0.1"
    assert pairs["--attention-backend"] == "torch_native" and "--sleep-on-idle" in out
    assert "--max-total-tokens" in out and "--device" in out
    for dropped in ("--tp-size", "--quantization", "--kv-cache-dtype", "--cuda-graph-max-bs-decode"):
        assert dropped not in out
    assert out.count("--attention-backend") == 1
    assert "--config" in out  # the operator's key at least: random when GLM5_ADMIN_API_KEY is unset
    if env.get("GLM5_API_KEY"):
        assert KEY not in out


def run_program(*args: str, model: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SGLANG_CPU_MODEL": model}
    return subprocess.run(
        [sys.executable, sglang_cpu_server.__file__, *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=30,
    )


def test_the_cpu_server_program_refuses_a_flag_it_has_not_classified(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    done = run_program("--port", "30000", "--enable-some-new-thing", model=str(tmp_path))
    assert done.returncode == 2
    assert "--enable-some-new-thing: not classified for the CPU server" in done.stderr
    # GLM5_SPECULATIVE=mtp: MTP needs GLM-5's own layer, which no CPU server runs
    mtp = config.resolve({"GLM5_SPECULATIVE": "mtp"}).argv[len(config.SERVER_PROGRAM) :]
    done = run_program(*mtp, model=str(tmp_path))
    assert done.returncode == 2 and "--speculative-algorithm: not classified" in done.stderr
    (tmp_path / "server.yaml").write_text('api-key: "k"\nadmin-api-key: "k2"\nenable-some-new-thing: true\n')
    done = run_program("--config", str(tmp_path / "server.yaml"), model=str(tmp_path))
    assert done.returncode == 2 and "option 'enable-some-new-thing' is not classified" in done.stderr
    done = run_program("--port", "30000", model=str(tmp_path / "none"))
    assert done.returncode == 2 and "SGLANG_CPU_MODEL" in done.stderr


# --- real starts ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_server.make_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def shared(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path) -> Iterator[RealContainer]:
    """One real server for every read-only check, with an API key; booted at once, waited for when first used."""
    c = real_server.start(
        tmp_path_factory.mktemp("shared"), tiny_llama, GLM5_API_KEY=KEY, GLM5_ADMIN_API_KEY=ADMIN_KEY
    )
    yield c
    c.target.stop()


@pytest.fixture
def real_starts() -> Iterator[list[RealContainer]]:
    """The real starts a test makes, stopped after it whether it passed or not (a test that failed midway left a
    whole real server running, 1.8 GiB, to the end of the run), with whatever they left behind."""
    made: list[RealContainer] = []
    yield made
    for c in made:
        c.target.stop()
        for process in c.leftovers():
            process.kill()


@pytest.fixture
def ready(shared: RealContainer) -> RealContainer:
    if not shared.was_ready:
        shared.wait_ready()
    return shared


def call(c: RealContainer, path: str, body: dict[str, Any] | None = None, key: str | None = None) -> Any:
    """(status, parsed JSON or text) of one request to the server itself."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{c.port}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as err:
        text, status = err.read().decode(), err.code
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def chat(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "glm-5",
        "messages": [{"role": "user", "content": "Hello world! How are you today?"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    } | ({"stream_options": {"include_usage": True}} if stream else {})


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_a_stop_while_the_server_loads_leaves_no_process(
    shared: RealContainer, tiny_llama: Path, tmp_path: Path, real_starts: list[RealContainer]
) -> None:
    """SGLang's spawned processes arm die-with-parent only after their imports (scheduler.py, detokenizer_manager.py
    kill_itself_when_parent_died): a SIGTERM to the server while they import leaves them orphaned. The kit's launch
    kills what the server left in its process group. (`shared` is asked for only so its start overlaps this one.)"""
    c = real_server.start(tmp_path, tiny_llama, stop_timeout=120)
    real_starts.append(c)
    deadline = time.monotonic() + real_server.START_TIMEOUT
    while time.monotonic() < deadline:  # the server's spawned children exist: it is loading
        titles = (
            c.commands()
        )  # (a process that exits while it is read is skipped: it was a zombie once, in CI)
        if sum("multiprocessing" in t or "sglang::" in t for t in titles) >= 2:
            break
        assert c.target.exited() is None, c.target.log_tail()
        time.sleep(0.2)
    assert "ready to roll" not in c.output()
    c.target.stop()
    assert not c.commands(), f"left running after the stop: {c.commands()}"
    assert "process(es) it left behind" in c.output(), (
        "the kit killed nothing: were the children still loading?"
    )


def stream_lines(c: RealContainer, body: dict[str, Any], lines: list[tuple[float, str]]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", c.port, timeout=300)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    response = connection.getresponse()
    for raw in response:
        if raw.strip():
            lines.append((time.monotonic(), raw.decode().strip()))


def whole_stream(url: str, body: dict[str, Any]) -> tuple[int, int | None]:
    """One streamed chat through URL: its status and, when it ended as SGLang ends a whole answer (the usage chunk,
    then [DONE]: 0.5.23 srt/entrypoints/openai/serving_chat.py, lines 2767 and 2805), its completion tokens (None:
    cut)."""
    try:
        with urllib.request.urlopen(chat_request(url, body, KEY), timeout=300) as response:
            events = [line.strip() for line in response if line.strip()]
            status = response.status
    except urllib.error.HTTPError as err:
        err.read()
        return err.code, None
    except OSError:
        return 0, None
    if len(events) < 2 or events[-1] != b"data: [DONE]":
        return status, None
    return status, json.loads(events[-2].removeprefix(b"data: "))["usage"]["completion_tokens"]


def chat_requests(c: RealContainer) -> float:
    """The chat requests a real server has taken: SGLang's own `sglang:http_requests_total` for the route."""
    return route_requests(c, "/v1/chat/completions")


def generate_requests(c: RealContainer) -> float:
    return route_requests(c, "/generate")


def route_requests(c: RealContainer, route: str) -> float:
    status, text = call(c, "/metrics")
    assert status == 200, text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sglang:http_requests_total" and sample.labels.get("endpoint") == route
    )


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_a_replica_replaced_under_load_behind_the_real_gateway_fails_nothing(
    ready: RealContainer, tiny_llama: Path, tmp_path: Path, real_starts: list[RealContainer]
) -> None:
    """One step of a rolling replacement over real servers behind the real smg (gateway/launch, its rotation),
    clients streaming through it: one replica is stopped as docker stop or a pod deletion stops it (a stream in
    flight on it runs to its end inside its drain, it leaves the rotation), then its replacement starts at a new
    address under the same worker id, joins, and takes streams; no client's stream fails or is cut throughout."""
    (tmp_path / "b").mkdir()
    c = real_server.start(
        tmp_path / "b", tiny_llama, stop_timeout=180, GLM5_DRAIN_SECONDS="120", GLM5_API_KEY=KEY
    )
    real_starts.append(c)
    c.wait_ready()
    gw = Gateway(tmp_path, {"real-a": ready, "real-b": c}, GLM5_API_KEY=KEY)
    results: list[tuple[float, int, int | None]] = []  # (began, status, completion tokens)
    stop = threading.Event()

    def client(i: int) -> None:
        turn = 0
        while not stop.is_set():
            # Each a new conversation, sharing no prefix with another (as different users' do): smg's cache_aware
            # sends such a one to the replica with the least cached, so a replica that joins takes its share; one
            # prefix would stay on the replica that has it until the loads differ by more than the spill margin
            # (gateway/launch), which two clients never reach.
            text = f"{uuid.uuid4().hex} client {i}, turn {turn}"
            body = chat(200, stream=True) | {"messages": [{"role": "user", "content": text}]}
            results.append((time.monotonic(), *whole_stream(gw.url, body)))
            turn += 1

    try:
        gw.wait_healthy(2)
        # As many clients as the gateway admits at once with both serving (the shares the rotation registered, from
        # the replicas' own KV pools: 1 each here); while one is out the other client waits in the gateway's queue.
        admitted = sum(w["slots"] for w in json.loads(gw.rotation.read_text())["workers"])
        assert admitted == 2, gw.rotation.read_text()
        clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(admitted)]
        for t in clients:
            t.start()
        lines: list[tuple[float, str]] = []  # one stream sure to be on the replica that stops
        reader = threading.Thread(target=stream_lines, args=(c, chat(300, stream=True), lines), daemon=True)
        reader.start()
        while len(lines) < 3 and reader.is_alive():
            time.sleep(0.05)
        c.proc.send_signal(
            signal.SIGTERM
        )  # the container's stop: entrypoint.sh, supervisord, launch, the server
        while "SIGTERM received" not in c.output() and reader.is_alive():
            time.sleep(0.05)
        signalled = time.monotonic()
        reader.join(timeout=240)
        code = c.proc.wait(timeout=240)  # type: ignore[attr-defined]
        gone = time.monotonic()
        while not [r for r in results if r[0] > gone] and time.monotonic() < gone + 120:
            time.sleep(0.2)  # clients go on after the replica is gone: one stream begun then, answered
        (tmp_path / "b2").mkdir()  # its replacement: a new pod's address, the same worker id in the file
        fresh = real_server.start(tmp_path / "b2", tiny_llama, GLM5_API_KEY=KEY)
        real_starts.append(fresh)
        gw.write({"real-a": ready, "real-b": fresh})
        fresh.wait_ready()
        gw.wait_healthy(2, timeout=120)
        joined = time.monotonic()
        while chat_requests(fresh) < 2 and time.monotonic() < joined + 120:
            time.sleep(0.5)  # the gateway routes clients' streams to it
        taken = chat_requests(fresh)
        stop.set()
        for t in clients:
            t.join(timeout=120)
        log = gw.output.read_text()
    finally:
        gw.stop()
    assert lines and lines[-1][1] == "data: [DONE]", lines[-3:]
    assert json.loads(lines[-2][1].removeprefix("data: "))["usage"]["completion_tokens"] == 300
    assert sum(1 for at, _ in lines if at > signalled) > 1, (
        "the stream ended before the SIGTERM: nothing drained"
    )
    assert code == 0 and not c.commands()
    assert "Draining requests and shutting down" in c.output()
    assert "real-b is out of the rotation" in log, log[-2000:]
    assert log.count("real-b joins the rotation") == 2, log[-2000:]
    outcomes = Counter((status, tokens) for _, status, tokens in results)
    after = sum(1 for began, _, _ in results if gone < began < joined)
    figures = (
        f"{admitted} clients, {len(results)} streams through the gateway ({after} begun while one replica served, "
        f"{taken:.0f} taken by the replacement), {outcomes}"
    )
    print(f"\nreal servers, one replaced under load: {figures}")
    assert after >= 1 and taken >= 2 and set(outcomes) == {(200, 200)}, figures


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_the_api_key_is_in_no_command_line_or_log_and_the_server_requires_it(ready: RealContainer) -> None:
    assert call(ready, "/v1/models")[0] == 401
    assert call(ready, "/v1/models", key="wrong-key-0123456789")[0] == 401
    status, models = call(ready, "/v1/models", key=KEY)
    assert status == 200 and models["data"][0]["id"] == "glm-5"
    commands = ready.commands()
    assert any("sglang.launch_server" in c for c in commands), commands
    assert not [c for c in commands if KEY in c]
    assert KEY not in ready.output() and KEY not in ready.entrypoint_output.read_text()


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_a_top_logprobs_above_the_vocabulary_is_refused_and_the_server_serves_on(
    ready: RealContainer, tiny_llama: Path
) -> None:
    """SGLang 0.5.23 sends such a request on to the scheduler, whose torch.topk raises, and that ends the whole server
    (sglang issue 40076; reproduced on this CPU server before the patch). patches/0002 refuses it in the
    TokenizerManager: a 400 on each route, batch forms too (the list's second item here), naming the field; the bound
    itself, the whole vocabulary, is served."""
    vocab = json.loads((tiny_llama / "config.json").read_text())["vocab_size"]
    k = 1000
    assert k > vocab
    logprobs = {"sampling_params": {"max_new_tokens": 2, "ignore_eos": True}, "return_logprob": True}
    texts = ["Hello world", "The server"]
    completion = {"model": "glm-5", "max_tokens": 2, "logprobs": k}
    refused = [
        ("/generate", {"text": texts[0], "top_logprobs_num": k} | logprobs, "top_logprobs_num"),
        ("/generate", {"text": texts, "top_logprobs_num": [1, k]} | logprobs, "top_logprobs_num"),
        ("/v1/completions", completion | {"prompt": texts[0]}, "/v1/completions: logprobs"),
        ("/v1/completions", completion | {"prompt": texts}, "/v1/completions: logprobs"),
        (
            "/v1/chat/completions",
            chat(2) | {"logprobs": True, "top_logprobs": k},
            "/v1/chat/completions: top_logprobs",
        ),
    ]
    for path, body, field in refused:
        status, answer = call(ready, path, body, key=KEY)
        message = json.dumps(answer)
        assert status == 400, (path, body, status, answer)
        assert field in message and f"from 0 to {vocab}" in message and f"got {k}" in message, (path, message)
    status, answer = call(
        ready, "/generate", {"text": texts[0], "top_logprobs_num": vocab} | logprobs, key=KEY
    )
    assert status == 200, answer
    assert [len(top) for top in answer["meta_info"]["output_top_logprobs"]] == [vocab, vocab]
    status, answer = call(ready, "/v1/chat/completions", chat(2), key=KEY)
    assert status == 200 and answer["usage"]["completion_tokens"] == 2


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_the_clients_key_opens_no_admin_endpoint_and_the_operators_does(ready: RealContainer) -> None:
    """SGLang 0.5.23 guards its admin endpoints with --admin-api-key, and with the ordinary key when that is unset
    (srt/utils/auth.py): the kit always sets it (GLM5_ADMIN_API_KEY, or a random one), inside --config. The client's
    key may not turn on the logging of every prompt nor flush the cache; the operator's may, and serves no client."""
    logging = {"log_requests": True, "log_requests_level": 3}
    for path, body in (("/configure_logging", logging), ("/flush_cache", {})):
        status, answer = call(ready, path, body, key=KEY)
        assert status == 401, (path, status, answer)
    assert call(ready, "/flush_cache", {}, key=ADMIN_KEY)[0] == 200
    assert call(ready, "/v1/models", key=KEY)[0] == 200
    assert ADMIN_KEY not in ready.output() and not [c for c in ready.commands() if ADMIN_KEY in c]


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_the_crash_request_through_the_gateway_is_refused_once_and_the_replica_serves_on(
    ready: RealContainer, tmp_path: Path
) -> None:
    """Through the kit's gateway (the real smg, gateway/launch): smg passes /generate through unchecked, and
    retried a request whose replica died onto the next one; the patched replica answers 400, smg hands it on as it
    is, and the replica serves the next request."""
    gw = Gateway(tmp_path, {"real-a": ready}, GLM5_API_KEY=KEY)
    try:
        gw.wait_healthy(1)
        before = generate_requests(ready)
        body = {"text": "Hello", "top_logprobs_num": 100000, "return_logprob": True,
                "sampling_params": {"max_new_tokens": 2}}  # fmt: skip
        status, answer = gw_call(gw.url, "/generate", body)
        assert status == 400 and "top_logprobs_num" in json.dumps(answer), (status, answer)
        assert generate_requests(ready) - before == 1, "the gateway sent the refused request more than once"
        status, answer = gw_call(gw.url, "/v1/chat/completions", chat(2))
        assert status == 200 and answer["usage"]["completion_tokens"] == 2, answer
    finally:
        gw.stop()


def gw_call(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        text = err.read().decode()
        try:
            return err.code, json.loads(text)
        except json.JSONDecodeError:
            return err.code, text


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_server_info_masks_the_keys(ready: RealContainer) -> None:
    """SGLang 0.5.23 returns every server argument from /server_info (and /get_server_info), once at the top and again
    in each scheduler's internal state, the keys among them, to any holder of the client key; patches/0002 masks
    them ("<redacted>" when set, null when unset)."""
    for path in ("/server_info", "/get_server_info"):
        status, info = call(ready, path, key=KEY)
        assert status == 200, info
        assert KEY not in json.dumps(info), f"{path} shows the API key"
        for where in (info, *info["internal_states"]):
            assert where["api_key"] == "<redacted>", (path, where["api_key"])
            assert where["admin_api_key"] in (None, "<redacted>"), path


def sample_names(text: str) -> dict[str, list[dict[str, str]]]:
    names: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            names.setdefault(s.name, []).append(s.labels)
    return names


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_the_series_the_alerts_dashboard_and_keda_use_are_on_the_real_metrics(ready: RealContainer) -> None:
    status, answer = call(ready, "/v1/chat/completions", chat(8), key=KEY)  # a decode, whatever came before
    assert status == 200 and answer["usage"]["completion_tokens"] == 8
    status, streamed = call(ready, "/v1/chat/completions", chat(8, stream=True), key=KEY)
    assert status == 200 and streamed.endswith("data: [DONE]\n\n")  # inter-token latency is a stream's
    status, text = call(ready, "/metrics")
    assert status == 200
    exposed = sample_names(text)
    names = {base_name(n) for n in exposed} | set(exposed)
    used = used_series()["sglang:"]
    missing = sorted(n for n in used - names if n not in AFTER_AN_EVENT)
    assert not missing, f"the kit uses series the real server does not export: {missing}"
    assert not set(AFTER_AN_EVENT) & names, "now exported before its event: move it out of AFTER_AN_EVENT"
    modes = {labels.get("mode") for labels in exposed["sglang:cuda_graph_passes_total"]}
    assert "decode_none" in modes, modes  # GLM5DecodeWithoutCudaGraphs divides by the decode_* modes


# --- the healthcheck and the exporter on the real log and /metrics -----------------------------------------------


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_the_healthcheck_reads_the_real_start_ready_with_its_capacity(ready: RealContainer) -> None:
    code, found = healthcheck_json(ready.target.env)
    assert code == 0 and found["phase"] == "ready", found
    assert found["capacity"]["max_total_num_tokens"] == 4096, found
    assert found["capacity"]["context_len"] == 4096 and found["capacity"]["available_gpu_mem_gb"] > 0


@pytest.mark.boots
@pytest.mark.xdist_group("real_sglang")
def test_the_exporter_reports_the_real_start_ready_with_its_capacity(ready: RealContainer) -> None:
    samples = exporter_samples(ready.exporter_port)
    assert samples['glm5_start_phase{phase="ready"}'] == 1
    assert samples["glm5_server_alive{}"] == 1
    assert samples["glm5_capacity_max_running_requests{}"] > 0
    assert samples["glm5_capacity_available_gpu_memory_bytes{}"] > 0


def test_the_capacity_line_the_cpu_scheduler_prints_is_read() -> None:
    """SGLang 0.5.23's scheduler on the CPU names the memory left available_cpu_mem (scheduler.py:1274): the line
    as a real CPU start printed it (--max-total-tokens 4096, --chunked-prefill-size left at its default)."""
    line = (
        b"[2026-12-03 09:07:28] max_total_num_tokens=4096, chunked_prefill_size=4096, max_prefill_tokens=16384, "
        b"max_running_requests=2048, context_len=4096, available_cpu_mem=21.51 GB\n"
    )
    assert logscan.scan(line).capacity == {
        "max_total_num_tokens": 4096,
        "chunked_prefill_size": 4096,
        "max_prefill_tokens": 16384,
        "max_running_requests": 2048,
        "context_len": 4096,
        "available_gpu_mem_gb": 21.51,
    }


def test_every_test_that_starts_a_real_server_runs_in_the_one_group() -> None:
    """The budget's two alive at once holds only while every test that starts or uses a real server is in the
    `real_sglang` group: outside it, a worker of its own starts a second `shared` server (a session fixture is per
    worker), seen once when a helper put between a test and its marks took them."""
    starters = {"shared", "ready", "real_starts"}
    found = {}
    for name, fn in globals().items():
        if name.startswith("test_") and starters & set(inspect.signature(fn).parameters):
            marks = getattr(fn, "pytestmark", [])
            found[name] = {(m.name, m.args) for m in marks} >= {
                ("boots", ()),
                ("xdist_group", ("real_sglang",)),
            }
    assert len(found) >= 6 and all(found.values()), found
