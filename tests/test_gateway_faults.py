"""The gateway under its own faults (issue 51), through the real smg 1.13.0 started by gateway/launch: no 404 while
no replica is registered yet, a one-pass blip keeps a replica while its own word removes it, and the kit's probes
(gateway/probes.py) on the rotation's port. The replicas are stand-ins (tests/helpers/stub_replica.py): their
exporter must fall silent or say a phase on demand."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from gateway import rotation
from helpers.gateway import KEY, Gateway, chat
from helpers.stub_replica import StubReplica

pytestmark = [pytest.mark.boots, pytest.mark.xdist_group("gateway_faults")]


def get(url: str, key: str | None = None) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status), parsed(r.read())
    except urllib.error.HTTPError as err:
        return int(err.code), parsed(err.read())
    except OSError:
        return 0, {}


def parsed(body: bytes) -> dict[str, object]:
    """A JSON object's fields, else the text as `body` (smg's /liveness answers plain text)."""
    try:
        found = json.loads(body or b"{}")
    except ValueError:
        return {"body": body.decode(errors="replace")}
    return dict(found) if isinstance(found, dict) else {"body": found}


def test_a_gateway_just_started_holds_requests_until_a_replica_is_registered(tmp_path: Path) -> None:
    """From the port's first second to the rotation's first registration smg answered `404 model_not_found` ("No
    worker available"), which an OpenAI client takes as final (measured at ab3738d: 404 from 0.5 s, the first 200 at
    1.5 s). Now a request waits in smg's queue for the registration; the kit's /ready says 503 until then."""
    stub = StubReplica(KEY)
    gw = Gateway(tmp_path, {"a": stub})  # type: ignore[dict-item]
    seen: list[tuple[float, int]] = []
    began = time.monotonic()
    try:
        while time.monotonic() - began < 6:
            status, body = chat(gw.url, "hello")
            seen.append((time.monotonic() - began, status))
            if status == 404:
                pytest.fail(f"404 at {seen[-1][0]:.2f} s: {body}")
            time.sleep(0.05)
        probe = f"http://127.0.0.1:{gw.rotation_metrics}"
        assert get(probe + "/ready")[0] == 200 and get(probe + "/live")[0] == 200
    finally:
        gw.stop()
        stub.stop()
    statuses = Counter(s for _, s in seen)
    first = next(at for at, s in seen if s == 200)
    print(f"\na gateway's first seconds: {statuses}, the first 200 at {first:.2f} s")
    assert set(statuses) <= {0, 200} and statuses[200] > 10, statuses


def test_a_blip_keeps_a_replica_and_its_own_word_removes_it(tmp_path: Path) -> None:
    """One pass without an answer took a healthy replica out (5.6 s out for a 0.6 s blip: smg drains a removed
    worker 5 s and refuses its re-add). Silent for less than MISSED_PASSES passes it stays in smg, serving; saying
    `draining` it leaves at the next pass; silent longer it leaves after MISSED_PASSES."""
    stubs = [StubReplica(KEY), StubReplica(KEY)]
    gw = Gateway(tmp_path, {"a": stubs[0], "b": stubs[1]})  # type: ignore[dict-item]
    a = f"http://127.0.0.1:{stubs[0].port}"
    try:
        gw.wait_healthy(2)
        assert a in gw.registered()
        stubs[
            0
        ].silent = True  # no answer until a pass has missed it, then answering again before the next one
        began = time.monotonic()
        while "pass 1 of 3: kept" not in gw.output.read_text():
            assert time.monotonic() - began < 10, gw.output.read_text()[-2000:]
            time.sleep(0.02)
        stubs[
            0
        ].silent = False  # the next pass is at least POLL_SECONDS later: one pass missed, not MISSED_PASSES
        kept = gw.registered()
        time.sleep(2)
        log = gw.output.read_text()
        assert a in kept and a in gw.registered(), log[-2000:]
        assert "a is out of the rotation" not in log and "pass 1 of 3: kept" in log, log[-2000:]
        stubs[0].phase = "draining"
        said = time.monotonic()
        while a in gw.registered():
            assert time.monotonic() - said < 3, gw.output.read_text()[-2000:]
            time.sleep(0.1)
        left = time.monotonic() - said
        stubs[0].phase = "ready"
        time.sleep(7)  # smg drains the removed worker 5 s, then the rotation adds it again
        assert a in gw.registered(), gw.output.read_text()[-2000:]
        stubs[0].silent = True
        silent = time.monotonic()
        while a in gw.registered():
            assert time.monotonic() - silent < 10, gw.output.read_text()[-2000:]
            time.sleep(0.1)
        gone = time.monotonic() - silent
    finally:
        gw.stop()
        for stub in stubs:
            stub.stop()
    print(f"\nout on its word after {left:.2f} s; silent, out after {gone:.2f} s")
    bound = rotation.MISSED_PASSES * (rotation.POLL_SECONDS + rotation.READY_TIMEOUT) + 1
    assert left < 2 and rotation.POLL_SECONDS * (rotation.MISSED_PASSES - 1) <= gone < bound


def test_a_stalled_rotation_fails_the_gateways_liveness_while_smgs_own_passes(tmp_path: Path) -> None:
    """Nothing watched the rotation: a pass that blocked left smg with its last registrations while smg's own
    /liveness and /readiness said 200. The kit's /live and /ready (gateway/probes.py) fail once no pass has finished
    for the bound (3 s here; glm5.toml's 60 s otherwise), and pass again once the rotation moves. The stall: the
    workers file replaced by a pipe no one writes, which the next pass blocks reading."""
    stub = StubReplica(KEY)
    gw = Gateway(tmp_path, {"a": stub}, launch_flags=("--rotation-stale-seconds", "3"))  # type: ignore[dict-item]
    probe = f"http://127.0.0.1:{gw.rotation_metrics}"
    try:
        gw.wait_healthy(1)
        began = time.monotonic()
        while get(probe + "/live")[0] != 200 or get(probe + "/ready")[0] != 200:
            assert time.monotonic() - began < 20, gw.output.read_text()[-2000:]
            time.sleep(0.2)
        pipe = tmp_path / "stall"
        os.mkfifo(pipe)
        os.replace(pipe, gw.discovery)
        stalled = time.monotonic()
        while get(probe + "/live")[0] == 200:
            assert time.monotonic() - stalled < 20, gw.output.read_text()[-2000:]
            time.sleep(0.2)
        took = time.monotonic() - stalled
        status, said = get(probe + "/live")
        assert status == 503 and "has not finished a pass for" in str(said["reason"]), said
        assert get(probe + "/ready")[0] == 503
        assert get(gw.url + "/liveness")[0] == 200  # smg's own: alive, it cannot see the rotation
        with open(gw.discovery, "w") as writer:  # the blocked pass reads this and goes on
            json.dump({"version": 1, "workers": [{"id": "a", "url": f"http://127.0.0.1:{stub.port}",
                       "ready_url": f"http://127.0.0.1:{stub.exporter_port}/ready"}]}, writer)  # fmt: skip
        gw.write({"a": stub})  # type: ignore[dict-item]
        moved = time.monotonic()
        while get(probe + "/live")[0] != 200:
            assert time.monotonic() - moved < 10, gw.output.read_text()[-2000:]
            time.sleep(0.2)
    finally:
        gw.stop()
        stub.stop()
    print(f"\na stalled rotation: /live 503 after {took:.1f} s (bound 3 s), 200 again once it moved")
    # counted from the last pass that finished, up to a poll (and its pass) before the stall began
    assert 3 - rotation.POLL_SECONDS - 0.5 <= took < 3 + 3, took
