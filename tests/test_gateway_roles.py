"""One client harms only its own request (issue 50), through the real smg 1.13.0 started by gateway/launch: the
clients' key reaches /v1/* and nothing of smg's control plane, which the operator's key (GLM5_ADMIN_API_KEY) holds;
a request runs once, on one replica, whatever that replica answered; one client's failing requests close nothing to
the others; a timeout ends the request; a body past the context bound is refused at the gateway.

The replicas here are stand-ins (tests/helpers/stub_replica.py) where a replica must answer 500 or slowly on demand;
the real SGLang's side (its admin key, the request that killed it) is in tests/test_real_server.py."""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import launch
from helpers.gateway import ADMIN_KEY, KEY, Gateway, chat
from helpers.stub_replica import StubReplica

pytestmark = [pytest.mark.boots, pytest.mark.xdist_group("gateway_roles")]


def call(url: str, method: str, key: str | None, body: dict[str, Any] | None = None) -> int:
    request = urllib.request.Request(
        url, json.dumps(body).encode() if body is not None else None, method=method
    )
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def boot(tmp: Path, *smg_flags: str) -> tuple[Gateway, list[StubReplica]]:
    stubs = [StubReplica(KEY), StubReplica(KEY)]
    gw = Gateway(tmp, {"a": stubs[0], "b": stubs[1]}, smg_flags=smg_flags)  # type: ignore[dict-item]
    gw.wait_healthy(2)
    return gw, stubs


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, list[StubReplica]]]:
    gw, stubs = boot(tmp_path_factory.mktemp("roles"))
    try:
        yield gw, stubs
    finally:
        gw.stop()
        for stub in stubs:
            stub.stop()


def attempts(stubs: list[StubReplica], text: str) -> int:
    return sum(stub.attempts[text] for stub in stubs)


def test_the_clients_key_reaches_no_control_route_and_the_operators_does(
    fleet: tuple[Gateway, list[StubReplica]],
) -> None:
    """At ab3738d the client key got 200/202 on each of these (fleet audit F2: a DELETE loop failed every other
    client's requests for 10 s). smg's control routes: its own "SECURITY POSTURE" list (the smg 1.13.0 binary)."""
    gw, _ = fleet
    routes = [("GET", "/workers", None), ("POST", "/workers", {"url": "http://127.0.0.1:9"}),
              ("DELETE", "/workers/any", None), ("PATCH", "/workers/any", {"labels": {"max_running_requests": "1"}}),
              ("POST", "/flush_cache", None), ("GET", "/get_loads", None), ("POST", "/start_profile", {}),
              ("GET", "/v1/tokenizers", None)]  # fmt: skip
    for method, path, body in routes:
        assert call(gw.url + path, method, KEY, body) == 401, (method, path)
    # the operator's key reads what the rotation registered with it; the clients' key still serves them
    request = urllib.request.Request(gw.url + "/workers", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        workers = json.loads(r.read())["workers"]
    assert len(workers) == 2
    assert chat(gw.url, "hello")[0] == 200
    assert chat(gw.url, "hello", key=ADMIN_KEY)[0] == 401  # and the operator's key is no client's


def test_a_request_a_replica_answers_500_runs_once(fleet: tuple[Gateway, list[StubReplica]]) -> None:
    """At ab3738d smg re-sent it to the other replica (fleet audit F3: `attempts {'a': 1, 'b': 1}`; a request that
    kills its replica killed each in turn). The client gets the replica's own answer and retries if it wants."""
    gw, stubs = fleet
    code, body = chat(gw.url, "answer-500 once")
    assert code == 500, body
    assert attempts(stubs, "answer-500 once") == 1


def test_one_clients_failing_requests_close_nothing_to_the_others(
    fleet: tuple[Gateway, list[StubReplica]],
) -> None:
    """At ab3738d ten requests a replica answered 500 opened every replica's breaker: all clients 503 for 61 s while
    /readiness said 200 (fleet audit F4). Here 20 (twice smg's default threshold) change nothing for the others."""
    gw, stubs = fleet
    codes = [chat(gw.url, f"answer-500 burst {n}")[0] for n in range(20)]
    assert codes == [500] * 20
    assert sum(attempts(stubs, f"answer-500 burst {n}") for n in range(20)) == 20
    assert [chat(gw.url, f"after the burst {n}")[0] for n in range(6)] == [200] * 6
    assert gw.readiness().get("healthy_workers") == 2


def test_a_body_past_the_context_bound_is_refused_at_the_gateway(
    fleet: tuple[Gateway, list[StubReplica]],
) -> None:
    """smg's own bound was 512 MiB, ~4.6x held in memory, in a 4 GiB gateway (fleet audit F15)."""
    gw, stubs = fleet
    bound = launch.max_payload_bytes()
    assert bound == 202752 * 64  # GLM-5's whole window at 64 bytes a token (glm5.toml [gateway])
    body = json.dumps({"model": "glm-5", "messages": [{"role": "user", "content": "too big " + "x" * bound}]})
    # smg answers from the Content-Length and closes before the body is in, which urllib reports as a broken pipe
    with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        )
        with contextlib.suppress(OSError):
            sock.sendall(body.encode())
        answer = sock.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413 ") and "request_body_too_large" in answer, answer
    assert not any(text.startswith("too big") for stub in stubs for text in stub.attempts)
    code, _ = chat(gw.url, "long but within " + "x" * (bound // 2))
    assert code == 200


def test_a_timeout_ends_the_request_not_one_attempt(tmp_path: Path) -> None:
    """At ab3738d smg's per-attempt timeout was retried: 2 s against replicas answering in 4 s ran a request 5 times
    and answered 504 after 10.4 s (fleet audit F5). Now once, and the 504 comes at the timeout."""
    gw, stubs = boot(tmp_path, "--request-timeout-secs", "2")
    try:
        began = time.monotonic()
        code, _ = chat(gw.url, "slow-4 answer")
        took = time.monotonic() - began
        assert code == 504
        assert 1.5 < took < 3.5, took
        time.sleep(2.5)  # an attempt that was re-sent would have arrived by now
        assert attempts(stubs, "slow-4 answer") == 1
    finally:
        gw.stop()
        for stub in stubs:
            stub.stop()
