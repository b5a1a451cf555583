"""The gateway's rotation (gateway/rotation.py) and admission sizes (gateway/launch.py), in-process; the real smg over
the kit's container starts is tests/test_rollout.py."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from prometheus_client import CollectorRegistry

from configuration import layout, settings
from conftest import ROOT, kit_env
from gateway import launch, probes, rotation
from gateway.rotation import Answer
from monitoring import exporter as start_exporter


def workers_file(path: Path, *workers: dict[str, str]) -> Path:
    path.write_text(json.dumps({"version": 1, "workers": list(workers)}))
    return path


# A replica's pool by the layout's estimate at the defaults (TP attention), the one figure the gateway counts for a
# replica that has not said its own, and what it holds of [gateway].context_tokens (16,384).
POOL = layout.default_pool(settings.load_config())
SHARE = POOL // 16_384


def pools(pool: float | None, groups: int = 1) -> int:
    """A replica's share as launch sizes it: SHARE requests of 16k for an unknown pool, else what its pool holds."""
    return groups * (int(pool or POOL) // 16_384)


class Smg:
    """smg's worker registry as the rotation sees it (Registry.sync's one argument), recorded."""

    def __init__(self) -> None:
        self.given: list[dict[str, int]] = []

    def sync(self, wanted: dict[str, int]) -> None:
        self.given.append(dict(wanted))


def test_smg_is_given_only_the_ready_replicas_each_with_what_its_pool_holds(tmp_path: Path) -> None:
    source = workers_file(tmp_path / "workers.json", {"id": "a", "url": "http://10.0.0.1:30000"},
                          {"id": "b", "url": "http://10.0.0.2:30000", "ready_url": "http://10.0.0.2:9/ready"})  # fmt: skip
    target = tmp_path / "smg" / "workers.json"
    ready = {"http://10.0.0.1:30090/ready": Answer(True, "ready", 163_840.0),
             "http://10.0.0.2:9/ready": Answer(False, "verifying")}  # fmt: skip
    asked: list[str] = []

    def ask(url: str) -> Answer:
        asked.append(url)
        return ready[url]

    smg = Smg()
    turn = rotation.Rotation(source, target, 30090, ask, slots=pools, smg=smg)  # type: ignore[arg-type]
    assert turn.step() is True
    assert smg.given == [{"http://10.0.0.1:30000": 10}]  # its own pool: 163,840 tokens hold 10 of 16k
    assert json.loads(target.read_text()) == {
        "version": 1,
        "workers": [{"id": "a", "url": "http://10.0.0.1:30000", "slots": 10}],
    }
    assert sorted(asked) == sorted(
        ready
    )  # the exporter port of the url's host, or the worker's own ready_url
    assert turn.step() is False  # nothing changed: the record is not rewritten
    assert len(smg.given) == 2  # smg is told every pass: what it lost (a failed registration) comes back
    ready["http://10.0.0.2:9/ready"] = Answer(True, "ready")  # no pool said: the layout's estimate
    ready["http://10.0.0.1:30090/ready"] = Answer(False, "draining")  # a stopped replica leaves at once
    assert turn.step() is True
    assert [w["id"] for w in json.loads(target.read_text())["workers"]] == ["b"]
    assert smg.given[-1] == {"http://10.0.0.2:30000": SHARE}
    ready["http://10.0.0.2:9/ready"] = Answer(
        True, "ready", 163_840.0, 4
    )  # restarted with 4 attention-DP groups
    assert turn.step() is True and smg.given[-1] == {"http://10.0.0.2:30000": 40}  # each group its own 10
    source.write_text("{not json")  # an editor's half-written file: the last good list stays
    assert turn.step() is False and [w["id"] for w in turn.workers] == ["a", "b"]


def test_the_rotation_logs_who_joins_and_leaves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = workers_file(tmp_path / "w.json", {"id": "box-2", "url": "http://10.0.0.12:30000"})
    said = {"now": Answer(False, "capturing")}
    turn = rotation.Rotation(source, tmp_path / "out.json", 30090, lambda _url: said["now"], slots=pools)
    turn.step()
    said["now"] = Answer(True, "ready")
    turn.step()
    said["now"] = Answer(False, "draining")
    turn.step()
    err = capsys.readouterr().err
    assert "box-2 is out of the rotation (capturing)" in err
    assert err.index("box-2 joins the rotation (ready)") < err.index(
        "box-2 is out of the rotation (draining)"
    )


class Ready(BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, tuple[int, dict[str, Any]]]] = {}

    def do_GET(self) -> None:
        code, body = self.answers[self.path]
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_a: Any) -> None:
        return


@pytest.fixture
def exporter() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_replica_is_ready_only_when_its_exporter_answers_200(exporter: str) -> None:
    Ready.answers = {"/ok": (200, {"phase": "ready"}), "/drain": (503, {"phase": "draining"}),
                     "/odd": (503, {}), "/null": (503, {"phase": None}), "/list": (200, [1]),
                     "/pool": (200, {"phase": "ready", "capacity": {"max_total_num_tokens": 412160}}),
                     "/no-pool": (200, {"phase": "ready", "capacity": {"max_total_num_tokens": None}}),
                     "/groups": (200, {"phase": "ready", "capacity": {"max_total_num_tokens": 261569,
                                                                    "attn_dp_size": 4.0,
                                                                    "admitted_requests": 60.0}})}  # fmt: skip
    assert rotation.ask_ready(exporter + "/ok") == (True, "ready", None, 1, True, None)
    assert rotation.ask_ready(exporter + "/pool") == (
        True,
        "ready",
        412160.0,
        1,
        True,
        None,
    )  # its server's own sizes line
    assert rotation.ask_ready(exporter + "/no-pool") == (True, "ready", None, 1, True, None)
    assert rotation.ask_ready(exporter + "/drain") == (False, "draining", None, 1, True, None)  # its own word
    assert rotation.ask_ready(exporter + "/odd") == (False, "503", None, 1, False, None)
    assert rotation.ask_ready(exporter + "/null") == (False, "503", None, 1, False, None)  # names no phase
    assert rotation.ask_ready(exporter + "/list") == (True, "ready", None, 1, False, None)
    assert rotation.ask_ready(exporter + "/groups") == (
        True,
        "ready",
        261569.0,
        4,
        True,
        60,
    )  # DP attention: 4 pools; what the replica publishes the gateways admit to it
    ready, said, _, _, word, _ = rotation.ask_ready(
        "http://127.0.0.1:9/ready"
    )  # nothing listens: the box is gone
    assert not ready and said.startswith("no answer") and not word


def test_each_replicas_share_is_what_its_pool_holds_and_smg_admits_their_sum() -> None:
    def flags(replicas: int, **env: str) -> dict[str, str]:
        argv = launch.admission(settings.resolve(env), replicas, "/run/scheduler.json")
        return {k: (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else "")
                for i, k in enumerate(argv) if k.startswith("--")}  # fmt: skip

    gw = settings.load_config()["gateway"]
    share = launch.slots(settings.resolve({}))
    # No server has said its pool: the layout's estimate at the defaults holds SHARE of context_tokens (16,384) each.
    assert share(None) == SHARE == layout.default_pool(settings.load_config()) // gw["context_tokens"]
    assert share(8_400_000) == 512  # a pool of 8.4 M tokens holds 512 of 16k: the captured graphs' bound
    assert share(1_638_400) == 100  # the pool, not the graphs, bounds it
    assert (
        launch.slots(settings.resolve({"GLM5_MAX_RUNNING_REQUESTS": "64"}))(8_400_000) == 64
    )  # caps the graphs
    # DP attention (GLM5_PROFILE=throughput, 4 groups): the line names one group's pool, and each group runs its own
    # requests: 4 x what 261,569 tokens hold of 16k (15) = 60, where one TP-attention pool of that size holds 15.
    dp = launch.slots(settings.resolve({"GLM5_PROFILE": "throughput"}))
    assert dp(261_569, 4) == 60 and dp(261_569, 1) == 15
    # A rank's graphs bound its group: 256 running requests over 4 groups capture up to 64 each (2 GPUs a group).
    capped = launch.slots(
        settings.resolve({"GLM5_PROFILE": "throughput", "GLM5_MAX_RUNNING_REQUESTS": "256"})
    )
    assert capped(8_400_000, 4) == 4 * 64
    assert flags(2)["--queue-size"] == str(2 * SHARE)  # TP attention's bound: 2 x SHARE
    default = flags(2)
    # smg's priority scheduler sums the shares the rotation registers; the queue is for the replicas listed, and
    # smg's legacy bound is off: it would admit requests while no replica is registered (404, issue 51)
    assert "--priority-scheduler-enabled" in default
    assert default["--priority-scheduler-config"] == "/run/scheduler.json"
    assert default["--priority-scheduler-default-max-class"] == "default"  # no client raises its own class
    assert default["--max-concurrent-requests"] == "0" and default["--queue-size"] == str(2 * SHARE)
    assert default["--queue-timeout-secs"] == str(gw["queue_timeout_seconds"])
    assert default["--balance-abs-threshold"] == "1" and "--disable-worker-overload-protection" in default
    assert default["--request-timeout-secs"] == str(gw["request_timeout_seconds"])
    assert flags(3, GLM5_MAX_RUNNING_REQUESTS="16")["--queue-size"] == "48"
    classes = json.loads(launch.scheduler_classes(50, 60))["classes"]
    assert set(classes) == {"system", "interactive", "default", "bulk"}
    assert all(c == classes["default"] for c in classes.values())  # all alike: none reserved, none preempts
    assert (
        classes["default"] | {"reserved_floor": 0, "reserved_per_slot": 0.0, "can_preempt": False}
        == classes["default"]
    )
    assert (classes["default"]["queue_size"], classes["default"]["queue_timeout_secs"]) == (50, 60)


def test_a_draining_server_is_not_ready_by_the_exporters_ready(tmp_path: Path) -> None:
    """SGLang 0.5.23 logs its SIGTERM (tokenizer_manager.py SignalHandler) and serves on while it drains: the phase
    is draining from that line on, /ready answers 503 at once and liveness still passes (no /health asked)."""
    log, run = tmp_path / "log", tmp_path / "run"
    log.mkdir()
    run.mkdir()
    ready = (ROOT / "tests" / "fixtures" / "logs" / "sglang-0.5.23-rendered-from-source.log").read_text()
    marker = "===== glm5-serve: server start #1 at 2026-11-30T00:00:00+00:00 pid 1 =====\n"
    (log / "server.log").write_text(marker + ready)
    record = {"start": 1, "passed": True, "right": 57, "items": 57, "reasons": [], "results": []}
    (run / "verified.json").write_text(json.dumps(record))
    env = {"GLM5_LOG_DIR": str(log), "GLM5_STATE_DIR": str(run)}
    assert exporter_readiness(env) == (200, "ready")
    with (log / "server.log").open("a") as fh:
        fh.write(
            "[2026-11-30 02:00:00] SIGTERM received. signum=15 frame=None. Draining requests and shutting down...\n"
        )
    assert exporter_readiness(env) == (503, "draining")


def exporter_readiness(env: dict[str, str]) -> tuple[int, str]:
    code, body = start_exporter.readiness(env)
    return code, body["phase"]


def test_the_rotation_says_on_metrics_who_is_in_who_answers_and_their_phase(tmp_path: Path) -> None:
    source = workers_file(tmp_path / "w.json", {"id": "a", "url": "http://10.0.0.1:30000"},
                          {"id": "b", "url": "http://10.0.0.2:30000"}, {"url": "http://10.0.0.3:30000"})  # fmt: skip
    said = {"http://10.0.0.1:30090/ready": Answer(True, "ready"), "http://10.0.0.2:30090/ready": Answer(False, "loading"),
            "http://10.0.0.3:30090/ready": Answer(False, "no answer (Connection refused)", word=False)}  # fmt: skip
    turn = rotation.Rotation(source, tmp_path / "out.json", 30090, lambda url: said[url], slots=pools)
    registry = CollectorRegistry()
    registry.register(turn)
    # nothing before its first pass: no worker, no pass, no sync
    assert {s.name: s.value for family in registry.collect() for s in family.samples} == {
        "glm5_rotation_gateways": 0.0,
        "glm5_rotation_last_pass_timestamp_seconds": 0.0,
        "glm5_rotation_last_sync_timestamp_seconds": 0.0,
    }
    before = time.time()
    turn.step()
    samples = {(s.name, s.labels.get("id"), s.labels.get("phase")): s.value
               for family in registry.collect() for s in family.samples}  # fmt: skip
    assert before <= samples.pop(("glm5_rotation_last_pass_timestamp_seconds", None, None)) <= time.time()
    assert samples.pop(("glm5_rotation_last_sync_timestamp_seconds", None, None)) == 0.0  # no smg here
    assert samples.pop(("glm5_rotation_gateways", None, None)) == 1.0  # a Docker host's gateway: alone
    url3 = "http://10.0.0.3:30000"  # no id: the url is its id
    assert samples == {
        ("glm5_rotation_in_rotation", "a", None): 1.0,
        ("glm5_rotation_in_rotation", "b", None): 0.0,
        ("glm5_rotation_in_rotation", url3, None): 0.0,
        ("glm5_rotation_answering", "a", None): 1.0,
        ("glm5_rotation_answering", "b", None): 1.0,
        ("glm5_rotation_answering", url3, None): 0.0,
        ("glm5_rotation_phase", "a", "ready"): 1.0,
        ("glm5_rotation_phase", "b", "loading"): 1.0,
    }
    said["http://10.0.0.2:30090/ready"] = Answer(False, "503", word=False)  # an answer without a phase
    turn.step()
    phases = {s.labels["id"]: s.labels["phase"] for family in registry.collect()
              for s in family.samples if s.name == "glm5_rotation_phase"}  # fmt: skip
    assert phases == {"a": "ready", "b": "unknown"}


# On Kubernetes: the replicas are the server pods behind the headless Service (k8s/overlays/gateway), each asked.


def test_on_kubernetes_an_unverified_pod_gets_no_traffic_also_after_an_in_place_restart(
    tmp_path: Path,
) -> None:
    """smg's own Kubernetes discovery adds a pod once it turns Ready and keeps it until the pod is deleted; the
    rotation asks every pod the Service lists, on every pass, so a restarted server is out until verified again."""
    listed = {"now": ["10.0.0.1", "10.0.0.2"]}
    said = {
        "http://10.0.0.1:30090/ready": Answer(True, "ready"),
        "http://10.0.0.2:30090/ready": Answer(False, "verifying"),
    }
    source = rotation.pods("glm5-pods.glm5.svc", 30000, lambda host, port: list(listed["now"]))
    target = tmp_path / "out.json"
    turn = rotation.Rotation(source, target, 30090, lambda url: said[url], slots=pools)
    turn.step()
    one = {"slots": SHARE}
    assert json.loads(target.read_text())["workers"] == [
        {"id": "10.0.0.1", "url": "http://10.0.0.1:30000"} | one
    ]
    said["http://10.0.0.1:30090/ready"] = Answer(
        False, "verifying"
    )  # its server restarted in place: the pod stays
    said["http://10.0.0.2:30090/ready"] = Answer(True, "ready")
    turn.step()
    assert json.loads(target.read_text())["workers"] == [
        {"id": "10.0.0.2", "url": "http://10.0.0.2:30000"} | one
    ]
    listed["now"] = ["10.0.0.2", "10.0.0.3"]  # a pod replaced: a new address, asked before it gets anything
    said["http://10.0.0.3:30090/ready"] = Answer(False, "loading")
    turn.step()
    assert [w["id"] for w in json.loads(target.read_text())["workers"]] == ["10.0.0.2"]


def test_a_dns_answer_that_fails_keeps_the_last_rotation_and_no_record_empties_it() -> None:
    def failing(host: str, port: int) -> list[str]:
        raise OSError("Temporary failure in name resolution")

    assert rotation.pods("glm5-pods.glm5.svc", 30000, failing)() is None
    assert rotation.pods("glm5-pods.glm5.svc", 30000, lambda h, p: [])() == []
    assert rotation.addresses(
        "localhost", 30000
    )  # the real resolver: a name with records gives its addresses


def test_the_kubernetes_gateway_uses_the_rotation_not_smgs_discovery() -> None:
    done = subprocess.run([str(ROOT / "gateway" / "launch"), "--kubernetes", "glm5", "--dry-run", "--",
                           "--queue-timeout-secs", "7"],
                          capture_output=True, text=True, env=kit_env(), check=False, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    command, _, classes = done.stdout.partition("\n")
    assert "--discovery" not in command and "kubernetes" not in command
    assert "--priority-scheduler-config /tmp/glm5-gateway/scheduler.json" in command
    # the scheduler's classes as written, with smg's own queue flags as given (the operator's last)
    assert classes.startswith("# /tmp/glm5-gateway/scheduler.json:\n")
    assert json.loads(classes.partition("\n")[2])["classes"]["bulk"]["queue_timeout_secs"] == 7
    assert launch.pods_name("glm5") == "glm5-pods.glm5.svc"


class FakeSmg(BaseHTTPRequestHandler):
    """smg 1.13.0's worker API as the rotation uses it, its answers as the real one gave them here (GET /workers: each
    worker with its url, status and labels; DELETE: 202 and the worker drains, listed as `draining` until dropped;
    POST for a url still listed: 409 WORKER_ALREADY_EXISTS)."""

    workers: ClassVar[list[dict[str, Any]]] = []
    calls: ClassVar[list[tuple[str, str, dict[str, Any], str]]] = []

    def reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def record(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        self.calls.append((self.command, self.path, body, self.headers.get("Authorization", "")))
        return dict(body)

    def do_GET(self) -> None:
        self.record()
        self.reply(200, {"workers": self.workers})

    def do_DELETE(self) -> None:
        self.record()
        self.reply(202, {"status": "accepted", "message": "Worker removal queued for background processing"})

    def do_POST(self) -> None:
        body = self.record()
        if any(w["url"] == body["url"] for w in self.workers):
            self.reply(
                409,
                {"error": f"Worker already exists at URL '{body['url']}'", "code": "WORKER_ALREADY_EXISTS"},
            )
        elif body["url"].endswith(":9"):
            self.reply(500, {"error": "registration failed"})
        else:
            self.reply(
                202, {"status": "accepted", "message": "Worker addition queued for background processing"}
            )

    def log_message(self, *_a: Any) -> None:
        return


def listed(url: str, slots: int, status: str = "ready") -> dict[str, Any]:
    return {"id": f"id-{url[7]}", "url": url, "status": status, "is_healthy": status == "ready",
            "labels": {"served_model_name": "glm-5", "max_running_requests": str(slots)}}  # fmt: skip


def test_smg_is_told_each_ready_replica_with_its_share_and_nothing_else() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSmg)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    smg = rotation.Registry(f"http://127.0.0.1:{server.server_address[1]}", "k-123", "client-456")
    FakeSmg.calls = []
    FakeSmg.workers = [listed("http://a:1", 3), listed("http://b:1", 3), listed("http://c:1", 4, "draining"),
                       listed("http://e:1", 2)]  # fmt: skip
    try:
        smg.sync({"http://a:1": 3, "http://b:1": 5, "http://c:1": 4, "http://d:1": 2})
        changes = [
            (method, path, body.get("url"), body.get("labels")) for method, path, body, _ in FakeSmg.calls
        ]
        assert changes == [
            ("GET", "/workers", None, None),
            ("DELETE", "/workers/id-e", None, None),  # no longer ready: out at once
            ("POST", "/workers", "http://c:1", {"max_running_requests": "4"}),  # 409 until smg has dropped it
            ("POST", "/workers", "http://d:1", {"max_running_requests": "2"}),
        ]  # a, listed with its share, is left alone; b's new share waits while c drains
        # smg drains a worker whose share changes for 5 s (no new request meanwhile): one at a time, once none drains
        FakeSmg.calls = []
        FakeSmg.workers = [listed("http://a:1", 3), listed("http://b:1", 3)]
        smg.sync({"http://a:1": 4, "http://b:1": 5})
        changes = [(method, path) for method, path, _, _ in FakeSmg.calls]
        assert changes == [("GET", "/workers"), ("DELETE", "/workers/id-a")]  # b's turn comes once a is back
        # the operator's key on smg's control plane; each worker registered with the clients' key its replica holds
        assert all(key == "Bearer k-123" for *_, key in FakeSmg.calls)
        assert all(
            body.get("api_key") == "client-456" for method, _, body, _ in FakeSmg.calls if method == "POST"
        )
        with pytest.raises(urllib.error.HTTPError):  # anything but a 409: said by the rotation, tried again
            smg.sync({"http://f:9": 1})
    finally:
        server.shutdown()


# --- steady membership and a watched rotation (issue 51) -------------------------------------------------------


def test_a_replica_leaves_on_its_own_word_at_once_and_after_missed_answers_only_in_a_row(
    tmp_path: Path,
) -> None:
    """One missed answer removed a healthy replica (smg then drained it for 5 s and refused its re-add: 5.6 s out
    for a 0.6 s blip). Its own word (a phase: draining) still takes it out at the next pass; no answer, or one
    without a phase, only MISSED_PASSES passes in a row."""
    source = workers_file(tmp_path / "w.json", {"id": "a", "url": "http://10.0.0.1:30000"})
    url = "http://10.0.0.1:30090/ready"
    said = {url: Answer(True, "ready")}
    smg = Smg()
    turn = rotation.Rotation(source, tmp_path / "out.json", 30090, lambda u: said[u], slots=pools, smg=smg)  # type: ignore[arg-type]
    turn.step()
    assert rotation.MISSED_PASSES >= 2  # else a blip is not survived at all
    blips = [Answer(False, "no answer (Connection reset)", word=False), Answer(False, "502", word=False)]
    for blip in blips[: rotation.MISSED_PASSES - 1]:  # a blip of fewer passes than the bound: kept
        said[url] = blip
        turn.step()
        assert smg.given[-1] == {"http://10.0.0.1:30000": SHARE}, blip
    said[url] = Answer(True, "ready")
    turn.step()
    for _ in range(rotation.MISSED_PASSES):  # silent that many passes in a row: out on the last
        said[url] = blips[0]
        turn.step()
    assert smg.given[-rotation.MISSED_PASSES :] == [{"http://10.0.0.1:30000": SHARE}] * (
        rotation.MISSED_PASSES - 1
    ) + [{}]
    said[url] = Answer(True, "ready")
    turn.step()
    said[url] = Answer(False, "draining")  # its own word: out at once
    turn.step()
    assert smg.given[-2:] == [{"http://10.0.0.1:30000": SHARE}, {}]


def test_a_lookup_that_hangs_is_bounded_and_keeps_the_last_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo has no bound of its own: a pass that waited on it stopped the rotation. Bounded, the pass goes on
    with the last listing and says why."""
    monkeypatch.setattr(rotation, "LOOKUP_TIMEOUT", 0.3)
    hang = threading.Event()
    calls = {"n": 0}

    def resolve(host: str, port: int) -> list[str]:
        calls["n"] += 1
        if calls["n"] > 1:
            hang.wait(30)
        return ["10.0.0.1"]

    listing = rotation.pods("glm5-pods.glm5.svc", 30000, resolve)
    assert listing() == [{"id": "10.0.0.1", "url": "http://10.0.0.1:30000"}]
    began = time.monotonic()
    assert listing() is None  # unknown: the rotation keeps its last list
    assert time.monotonic() - began < 2
    hang.set()


BOUND = settings.load_config()["monitoring"]["rotation_stale_seconds"]  # 60: the alert's too


def test_the_gateways_probes_fail_on_a_stale_rotation_and_while_no_replica_is_in(tmp_path: Path) -> None:
    """smg's own probes cannot see the rotation; the kit's (gateway/probes.py) can: /live fails once no pass has
    finished for WATCHED_SECONDS, /ready while no replica is in the rotation or smg was not given them lately."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ready)  # stands in for smg's probe port: 200 on both
    Ready.answers = {"/liveness": (200, {}), "/readiness": (200, {})}
    threading.Thread(target=server.serve_forever, daemon=True).start()
    smg_probe = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        source = workers_file(tmp_path / "w.json", {"id": "a", "url": "http://10.0.0.1:30000"})
        said = {"http://10.0.0.1:30090/ready": Answer(False, "loading")}
        turn = rotation.Rotation(
            source, tmp_path / "out.json", 30090, lambda u: said[u], slots=pools, smg=Smg()
        )  # type: ignore[arg-type]
        now = time.time()
        assert not probes.live(turn, smg_probe, now, BOUND).ok  # no pass yet
        turn.step()
        now = time.time()
        assert probes.live(turn, smg_probe, now, BOUND) == (True, "smg: 200")
        assert probes.ready(turn, smg_probe, now, BOUND) == (False, "no replica is in the rotation")
        said["http://10.0.0.1:30090/ready"] = Answer(True, "ready")
        turn.step()
        assert probes.ready(turn, smg_probe, time.time(), BOUND) == (True, "1 replica(s) in the rotation")
        later = time.time() + BOUND + 1  # no pass since: stuck
        stale = probes.live(turn, smg_probe, later, BOUND)
        assert not stale.ok and "has not finished a pass for 61 s (more than 60)" in stale.reason, stale
        assert not probes.ready(turn, smg_probe, later, BOUND).ok
        Ready.answers = {"/liveness": (503, {}), "/readiness": (503, {})}
        assert probes.live(turn, smg_probe, time.time(), BOUND) == (False, "smg liveness: 503")
        assert probes.ready(turn, smg_probe, time.time(), BOUND) == (False, "smg readiness: 503")
    finally:
        server.shutdown()


def test_each_gateway_admits_a_replicas_published_share_divided_among_the_gateways_that_exist(
    tmp_path: Path,
) -> None:
    """The gateway count was frozen in the image ([gateway].gateways = 2): one gateway pod lost, the survivor
    admitted half of what the replicas hold; a third (a rollout's surge) made 1.5x. Now each pass counts the gateway
    pods of their headless Service (itself always), and divides what each replica publishes it holds (its /ready's
    admitted_requests, not the gateway's own arithmetic) among them: together never more than the replica holds."""
    gateways = {"now": ["10.1.0.1", "10.1.0.2"]}
    count = rotation.peers("glm5-gateways.glm5.svc", "10.1.0.1", 2, lambda host, port: list(gateways["now"]))
    source = workers_file(tmp_path / "w.json", {"id": "a", "url": "http://10.0.0.1:30000"})
    published = Answer(True, "ready", float(POOL), 1, True, 30)  # the kit's arithmetic would say SHARE
    smg = Smg()
    turn = rotation.Rotation(
        source,
        tmp_path / "out.json",
        30090,
        lambda u: published,
        slots=pools,
        smg=smg,
        gateways=count,  # type: ignore[arg-type]
    )
    seen = []
    for listed in (
        ["10.1.0.1", "10.1.0.2"],
        ["10.1.0.1"],
        ["10.1.0.1", "10.1.0.2", "10.1.0.3"],
        ["10.1.0.2"],
    ):
        gateways["now"] = listed
        turn.step()
        seen.append((len(set(listed) | {"10.1.0.1"}), smg.given[-1]["http://10.0.0.1:30000"]))
    # (gateways, this one's share): lost one, the survivor takes the whole; a surge, a third each; not yet listed
    # itself (a new pod), it counts itself
    assert seen == [(2, 15), (1, 30), (3, 10), (2, 15)], seen
    assert all(n * share <= 30 for n, share in seen)
    failing = rotation.peers(
        "glm5-gateways.glm5.svc", None, 2, lambda host, port: (_ for _ in ()).throw(OSError("SERVFAIL"))
    )
    assert failing() == 2  # no answer yet: [gateway].gateways; after one, the last answer
