"""healthcheck/healthcheck on log fixtures of several SGLang versions, live logs, HTTP and a 1 GB log."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from configuration import state
from conftest import ROOT, healthcheck_json, kit_env
from healthcheck import logscan, phase
from healthcheck import probe as healthcheck_probe
from helpers import start_record
from helpers.container import Container, start
from helpers.judging import decided

HEALTHCHECK = ROOT / "healthcheck" / "healthcheck"
LOGS = ROOT / "tests" / "fixtures" / "logs"


def probe(*args: str, **env: str) -> tuple[int, dict[str, Any]]:
    return healthcheck_json(kit_env() | env, *args)


@pytest.mark.parametrize(
    ("fixture", "phase", "decode", "prefill"),
    [
        ("sglang-0.5.23-rendered-from-source.log", "ready", (52, 52), (58, 58)),
        ("sglang-legacy-decode-ready.log", "ready", (52, 52), (None, 58)),
        ("sglang-piecewise-era-ready.log", "ready", (52, 52), (58, 58)),
        ("sglang-0.5.23-oom-during-decode-capture.log", "failed", (6, 52), (58, 58)),
        ("sglang-legacy-capture-failed.log", "failed", (0, 52), (None, 58)),
        ("glm5-serve-restart-after-failure.log", "capturing", (36, 52), (58, 58)),
    ],
)
def test_saved_logs_of_several_versions(
    fixture: str, phase: str, decode: tuple[int | None, int], prefill: tuple[int | None, int]
) -> None:
    code, state = probe("--log", str(LOGS / fixture), "--no-http")
    assert state["phase"] == phase, state
    assert (state["decode_captured"], state["decode_expected"]) == decode
    assert (state["prefill_captured"], state["prefill_expected"]) == prefill
    assert code == (0 if phase == "ready" else 1)


def test_a_dp_attention_start_reads_ready_with_the_lists_its_ranks_capture() -> None:
    """GLM5_PROFILE=throughput (attention-DP 4, two GPUs a group): 0.5.23 captures no decode batch of 1 there (batches
    are multiples of the attention-TP size), and the kit expects that list, so the start reads ready with no partial
    acceptance; judged by TP attention's list the same log is a short capture."""
    dp_log = str(LOGS / "sglang-0.5.23-dp-attention-4.log")
    code, state = probe("--log", dp_log, "--no-http", GLM5_PROFILE="throughput", GLM5_ATTN_DP_SIZE="4")
    assert state["phase"] == "ready" and code == 0, state
    assert (state["decode_captured"], state["decode_expected"]) == (51, 51)
    assert (state["prefill_captured"], state["prefill_expected"]) == (42, 42)  # 8192 // 4 = 2048: 4..2048
    assert state["capacity"]["max_total_num_tokens"] == 261569  # one group's pool, from DP0 TP0's line
    code, state = probe("--log", dp_log, "--no-http")
    assert (state["phase"], state["failure_kind"], state["decode_expected"]) == ("failed", "decode_short", 52)
    # What the gateway admits to it, as its exporter says (KEDA's unit): each of the 4 groups what 261,569 tokens hold
    # of 16k (15), at most a rank's largest graph; read as TP attention it would be 15.
    scan = logscan.scan((LOGS / "sglang-0.5.23-dp-attention-4.log").read_bytes())
    dp = decided(scan, (51, 42), attn_dp_size=4, decode_max=512, context_tokens=16384)
    assert dp.capacity is not None and dp.capacity["admitted_requests"] == 60
    assert decided(scan, (51, 42), decode_max=512, context_tokens=16384).capacity["admitted_requests"] == 15


def test_failure_reasons_say_what_and_where() -> None:
    _, oom = probe("--log", str(LOGS / "sglang-0.5.23-oom-during-decode-capture.log"), "--no-http")
    assert "CUDA out of memory" in oom["reason"] and "during decode graph capture (6/52)" in oom["reason"]
    assert "GLM5_MEM_FRACTION_STATIC" in oom["reason"]
    _, legacy = probe("--log", str(LOGS / "sglang-legacy-capture-failed.log"), "--no-http")
    assert "Exception: Capture cuda graph failed" in legacy["reason"]


def test_only_the_current_run_counts() -> None:
    # Run #1 failed with a traceback; run #2 is capturing: not failed.
    _, state = probe("--log", str(LOGS / "glm5-serve-restart-after-failure.log"), "--no-http")
    assert state["start"] == 2 and state["reason"] is None


def write_partial(tmp_path: Path, text: str) -> Path:
    log = tmp_path / "server.log"
    log.write_text(text)
    return log


@pytest.mark.boots
def test_phases_as_the_log_grows(tmp_path: Path) -> None:
    full = (LOGS / "glm5-serve-restart-after-failure.log").read_text()
    second = full.index("===== glm5-serve: server start #2")
    checkpoints = [
        (full.index("Load weight begin", second) - 30, "starting"),
        (full.index("Load weight end", second) - 30, "loading"),
        (full.index("Capturing prefill shape", second) + 300, "capturing"),
        (len(full), "capturing"),
    ]
    for end, want in checkpoints:
        _, found = probe("--log", str(write_partial(tmp_path, full[:end])), "--no-http")
        assert found["phase"] == want, (end, found)
    _, mid = probe("--log", str(write_partial(tmp_path, full[: checkpoints[2][0]])), "--no-http")
    assert mid["decode_captured"] is None and mid["prefill_captured"] is not None


def test_between_the_prefill_and_the_decode_capture_it_is_capturing(tmp_path: Path) -> None:
    """0.5.23 captures prefill, then decode: a log cut after the prefill end is capturing, not loading weights."""
    full = (LOGS / "sglang-0.5.23-rendered-from-source.log").read_text()
    cut = full.index("Capture target decode CUDA graph begin")
    cut = full.rindex("\n", 0, cut) + 1
    log = write_partial(tmp_path, full[:cut])
    _, found = probe("--log", str(log), "--no-http")
    assert found["phase"] == "capturing" and found["decode_captured"] is None, found
    done = subprocess.run(
        [str(HEALTHCHECK), "--status", "--log", str(log), "--no-http"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "prefill graphs 58/58 done, decode graphs next" in done.stdout, done.stdout


def test_status_line_for_people(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(HEALTHCHECK),
            "--status",
            "--log",
            str(LOGS / "glm5-serve-restart-after-failure.log"),
            "--no-http",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.startswith("capturing decode graphs 36/52, ")
    assert "since start #2" in done.stdout


def test_fewer_decode_sizes_than_configured_fails_unless_accepted(tmp_path: Path) -> None:
    text = (LOGS / "sglang-0.5.23-rendered-from-source.log").read_text()
    short = text.replace(
        ", 272, 288, 304, 320, 336, 352, 368, 384, 400, 416, 432, 448, 464, 480, 496, 512]", "]"
    )
    assert short != text
    log = write_partial(tmp_path, short)
    code, state = probe("--log", str(log), "--no-http")
    assert code == 1 and state["phase"] == "failed"
    assert "captured 36 batch sizes, expected 52" in state["reason"]
    assert "did not take effect" in state["reason"]
    # a restart would capture the same: no restart
    assert probe("--log", str(log), "--no-http", "--live")[0] == 0
    code, state = probe("--log", str(log), "--no-http", "--accept-partial-capture")
    assert code == 0 and state["phase"] == "ready"
    code, _ = probe("--log", str(log), "--no-http", GLM5_ACCEPT_PARTIAL_CAPTURE="1")
    assert code == 0


def test_fewer_prefill_shapes_than_configured_fails_unless_accepted(tmp_path: Path) -> None:
    text = (LOGS / "sglang-0.5.23-rendered-from-source.log").read_text()
    short = text.replace(", 7168, 7680, 8192]", "]")
    assert short != text
    # The kit's start marker says what the start expects (the server's own list would agree with itself).
    marker = state.marker_line(1, "2026-11-30T10:00:00+00:00", 7, 52, 58)
    log = write_partial(tmp_path, marker + "\n" + short)
    code, found = probe("--log", str(log), "--no-http")
    assert code == 1 and found["phase"] == "failed"
    assert "captured 55 token shapes, expected 58" in found["reason"]
    code, found = probe("--log", str(log), "--no-http", "--accept-partial-capture")
    assert code == 0 and found["phase"] == "ready"


def test_expected_counts_follow_the_configuration(tmp_path: Path) -> None:
    """`--log FILE` judges a saved log outside any start: where it names no counts, the configuration's."""
    log = write_partial(tmp_path, (LOGS / "sglang-0.5.23-rendered-from-source.log").read_text())
    code, state = probe("--log", str(log), "--no-http", GLM5_CUDA_GRAPH_MAX_BS_DECODE="1024")
    assert code == 1 and state["decode_expected"] == 68 and state["phase"] == "failed"


def test_a_tail_past_its_marker_is_judged_by_the_latest_record(tmp_path: Path) -> None:
    """Hours of output (or a rotation) push the start's marker out of the tail before capture.json was kept: the tail
    is the latest start's, judged by its record's counts (a short capture still fails), not by none."""
    (tmp_path / "log").mkdir()
    (tmp_path / "run").mkdir()
    start_record.write(tmp_path / "run", start=2, pid=os.getpid(), decode_expected=68, prefill_expected=58,
                       log_dir=str(tmp_path / "log"))  # fmt: skip
    shutil.copy(LOGS / "sglang-0.5.23-rendered-from-source.log", tmp_path / "log" / "server.log")  # no marker
    env = {"GLM5_LOG_DIR": str(tmp_path / "log"), "GLM5_STATE_DIR": str(tmp_path / "run")}
    code, found = probe("--no-http", **env)
    assert code == 1 and found["decode_expected"] == 68 and found["failure_kind"] == "decode_short", found


def test_a_running_start_is_judged_by_its_record_not_the_configuration(tmp_path: Path) -> None:
    """Online, the probe reads the start's record and never resolves the configuration again: a GLM5_* setting
    changed after the start (here the decode cap) changes nothing of what the start is judged by."""
    env = run_dir(tmp_path, "sglang-0.5.23-rendered-from-source.log", start=3, pid=os.getpid())
    code, found = probe("--no-http", **env, GLM5_CUDA_GRAPH_MAX_BS_DECODE="1024")
    assert code == 0 and found["decode_expected"] == 52 and found["phase"] == "ready", found
    assert healthcheck_probe.run_of(env).port == start_record.record().port


class Health(BaseHTTPRequestHandler):
    """Local HTTP test double for SGLang's /health: 503 until told otherwise."""

    status = 503

    def do_GET(self) -> None:
        self.send_response(Health.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *_a: Any) -> None:
        return


@pytest.fixture
def health_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def run_dir(
    tmp_path: Path, fixture: str, start: int | None = None, pid: int | None = None, verified: bool = True
) -> dict[str, str]:
    (tmp_path / "log").mkdir(exist_ok=True)
    (tmp_path / "run").mkdir(exist_ok=True)
    text = (LOGS / fixture).read_text()
    if start is not None:
        text = (
            f"===== glm5-serve: server start #{start} at 2026-11-30T00:00:00+00:00 pid {pid} =====\n" + text
        )
        start_record.write(
            tmp_path / "run", start=start, pid=pid, decode_expected=52, prefill_expected=58,
            log_dir=str(tmp_path / "log"),
        )  # fmt: skip
        if verified:  # verify/gate's record of this start (tests/test_verify_gate.py boots the gate itself)
            record = {"start": start, "passed": True, "right": 57, "items": 57, "reasons": [], "results": []}
            (tmp_path / "run" / "verified.json").write_text(json.dumps(record))
    (tmp_path / "log" / "server.log").write_text(text)
    return {"GLM5_LOG_DIR": str(tmp_path / "log"), "GLM5_STATE_DIR": str(tmp_path / "run")}


@pytest.mark.boots
def test_ready_needs_health_200(tmp_path: Path, health_server: str) -> None:
    env = run_dir(
        tmp_path, "sglang-0.5.23-rendered-from-source.log", start=1, pid=os.getpid(), verified=False
    )
    Health.status = 200
    code, state = probe("--url", health_server, **env)
    assert (code, state["phase"], state["http"]) == (
        1,
        "verifying",
        200,
    )  # up, its verification not yet there
    assert probe("--url", health_server, "--verify", "off", **env)[1]["phase"] == "ready"
    env = run_dir(tmp_path, "sglang-0.5.23-rendered-from-source.log", start=1, pid=os.getpid())
    Health.status = 503
    code, state = probe("--url", health_server, **env)
    assert (code, state["phase"], state["http"]) == (1, "ready", 503)  # once ready, never "on its way" again
    assert state["reason"] == "/health answered 503: not serving now"
    Health.status = 200
    code, state = probe("--url", health_server, **env)
    assert (code, state["phase"], state["http"]) == (0, "ready", 200)


@pytest.mark.boots
def test_liveness_fails_only_for_what_a_restart_can_clear(tmp_path: Path) -> None:
    """A slow start passes; so do a dead start or a capture that ran out of memory (supervisord restarts the server
    in place, or the container waits in failed): restarting the container would only reload the weights. A hang
    fails it (tests/test_liveness.py), and so does a ready server whose /health fails."""
    env = run_dir(tmp_path, "glm5-serve-restart-after-failure.log")
    assert probe("--live", **env)[0] == 0  # capturing: alive
    assert probe(**env)[0] == 1  # but not ready
    dead = subprocess.Popen(["true"])
    dead.wait()
    env = run_dir(tmp_path, "sglang-0.5.23-rendered-from-source.log", start=3, pid=dead.pid)
    code, state = probe("--live", "--no-http", **env)
    assert code == 0 and state["phase"] == "failed" and "exited" in state["reason"]
    env = run_dir(tmp_path, "sglang-0.5.23-oom-during-decode-capture.log")
    code, state = probe("--live", **env)
    assert code == 0 and state["phase"] == "failed" and "out of memory" in state["reason"]


def test_timeout_under_three_seconds_is_refused() -> None:
    done = subprocess.run([str(HEALTHCHECK), "--timeout", "1"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "use 3 s or more" in done.stderr


@pytest.mark.boots
def test_a_long_running_server_stays_ready_past_the_tail_window(tmp_path: Path, health_server: str) -> None:
    env = run_dir(tmp_path, "sglang-0.5.23-rendered-from-source.log", start=1, pid=os.getpid())
    Health.status = 200
    assert probe("--url", health_server, **env)[0] == 0
    tail = (tmp_path / "log" / "server.log").read_bytes()
    assert healthcheck_probe.remember(
        env["GLM5_STATE_DIR"], tail
    )  # the one writer (lifecycle's tick) keeps it
    with (tmp_path / "log" / "server.log").open("a") as fh:
        fh.write(
            '[2026-11-30 01:00:00] INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
            * 100_000
        )
    code, state = probe("--url", health_server, "--tail-bytes", "65536", **env)
    assert (code, state["phase"], state["decode_captured"]) == (0, "ready", 52)


@pytest.mark.boots
def test_one_probe_on_a_1gb_log_is_cheap(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    head = (LOGS / "sglang-0.5.23-rendered-from-source.log").read_bytes()
    request = b"[2026-11-30 01:00:00 TP0] Decode batch. #running-req: 1024, #token: 412160, token usage: 0.93, gen throughput (token/s): 3028.00, #queue-req: 0\n"
    with log.open("wb") as fh:
        fh.write(head)
        block = request * (8 * 1024 * 1024 // len(request))
        while fh.tell() < 2**30:
            fh.write(block)
        fh.write(head)  # a restart near the end: its capture lines are in the tail
    assert log.stat().st_size >= 2**30
    env = {
        "GLM5_LOG_DIR": str(tmp_path),
        "GLM5_STATE_DIR": str(tmp_path),
        "GLM5_PORT": "30000",
        "GLM5_HEALTH_TIMEOUT": "5",
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    # As the image runs it: python3 -S (the shebang), the image's GLM5_* environment, no HTTP wait.
    done = subprocess.run(
        [str(HEALTHCHECK), "--json", "--no-http"],
        capture_output=True,
        text=True,
        env=os.environ | env,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, state = done.returncode, json.loads(done.stdout.splitlines()[0])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(
        f"\nhealthcheck on a {log.stat().st_size / 2**30:.2f} GiB log: {cpu * 1000:.0f} ms CPU (whole process), {(time.monotonic() - began) * 1000:.0f} ms wall"
    )
    assert code == 0 and state["phase"] == "ready"
    assert cpu < 0.5  # the whole process, interpreter start-up included; the scan alone is timed below


def test_scan_cost_is_bounded_by_the_tail(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    with log.open("wb") as fh:
        fh.seek(2**30)
        fh.write((LOGS / "sglang-0.5.23-rendered-from-source.log").read_bytes() + b"x" * 4 * 2**20)
    costs = []  # the least of ten, as timeit takes it: the other workers of the suite only ever add to one
    for _ in range(10):
        began = time.process_time()
        result = logscan.scan(logscan.read_tail(log))
        costs.append(time.process_time() - began)
    per_probe = min(costs)
    print(f"\nlogscan.read_tail + scan of the 4 MiB tail of a 1 GiB log: {per_probe * 1000:.1f} ms CPU")
    assert result.bytes_read == logscan.TAIL_BYTES
    assert per_probe < 0.05


# The decision as pure steps (healthcheck/phase.py): each testable without files, processes or HTTP.


def scan_of(name: str) -> logscan.Scan:
    return logscan.scan((LOGS / name).read_bytes())


def test_launch_json_counts_only_for_its_own_start() -> None:
    scan = scan_of("glm5-serve-restart-after-failure.log")
    assert scan.start is not None
    own = start_record.record(start=scan.start, decode_expected=40, prefill_expected=30)
    other = start_record.record(start=scan.start - 1, decode_expected=40, prefill_expected=30)
    assert healthcheck_probe.expected_counts(scan, own) == (40, 30)
    # an earlier start's record is ignored: the counts its marker line announced
    assert scan.marker_expected is not None
    assert healthcheck_probe.expected_counts(scan, other) == scan.marker_expected != (40, 30)
    assert (
        state.current_start(other, scan.start) is None
    )  # so the probe neither trusts its pid nor its counts


def test_ready_needs_the_log_and_then_health() -> None:
    scan = scan_of("sglang-legacy-decode-ready.log")
    assert phase.log_says_ready(scan)
    assert decided(scan).phase == "ready"  # --no-http
    assert decided(scan, http=200).phase == "ready"
    waiting = decided(scan, http=503)
    assert waiting.phase == "ready" and waiting.reason == "/health answered 503: not serving now"
    assert decided(scan, alive=False, http=200).phase == "failed"  # its process is gone


def test_a_short_capture_fails_unless_accepted() -> None:
    scan = scan_of("sglang-legacy-decode-ready.log")
    assert decided(scan, (60, 58), http=200).phase == "failed"
    assert decided(scan, (60, 58), http=200, accept_partial=True).phase == "ready"


def test_capture_facts_are_kept_only_for_a_finished_capture_of_a_known_start() -> None:
    done = scan_of("glm5-serve-restart-after-failure.log")
    assert healthcheck_probe.worth_keeping(logscan.scan(b"Load weight begin\n")) is None
    kept = healthcheck_probe.worth_keeping(done)
    if kept is None:  # this fixture's current start may not have finished capture: take one that has
        kept = healthcheck_probe.worth_keeping(
            logscan.scan(
                b"===== glm5-serve: server start #3 at 2026-11-30T00:00:00 x\n"
                + (LOGS / "sglang-legacy-decode-ready.log").read_bytes()
            )
        )
    assert kept is not None and kept["start"] is not None
    empty = logscan.Scan()
    back = healthcheck_probe.merged(empty, start_record.record(start=kept["start"]), kept)
    assert back.start == kept["start"] and phase.decode_done(back)
    assert (
        healthcheck_probe.merged(empty, start_record.record(start=kept["start"] + 1), kept) is empty
    )  # another start's facts


def test_out_of_memory_without_a_traceback_still_fails_the_start() -> None:
    """A constructed line (not quoted from a real log): an OOM message that no traceback precedes in the tail."""
    data = (
        b"===== glm5-serve: server start #1 at 2026-11-30T10:00:00+00:00 pid 1: x =====\n"
        b"[2026-11-30 10:01:00 TP0] Load weight begin. avail mem=94.62 GB\n"
        b"[2026-11-30 10:02:00 TP3] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    scan = logscan.scan(data)
    result = decided(scan)
    assert result.phase == "failed" and result.reason is not None
    assert result.reason.startswith("out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate")
    assert "while loading weights" in result.reason and "lower GLM5_MEM_FRACTION_STATIC" in result.reason


@pytest.mark.boots
def test_a_throughput_start_of_the_double_reads_ready(tmp_path: Path, containers: list[Container]) -> None:
    """Issue 52: every GLM5_PROFILE=throughput start ended prefill_short, the kit expecting 58 prefill shapes where
    0.5.23 captures 42 at D=4. The double captures as 0.5.23 does (the chunk divided, the shapes re-clamped, decode
    batches aligned to the attention-TP size); the kit's expectation is 0.5.23's (tests/test_launch.py)."""
    c = start(tmp_path, GLM5_PROFILE="throughput", GLM5_ATTN_DP_SIZE="4", GLM5_VERIFY="off")  # the audit's D
    containers.append(c)
    c.wait_healthy()
    code, state = healthcheck_json(c.target.env, "--no-http")
    assert state["phase"] == "ready" and code == 0, state
    assert (state["prefill_captured"], state["prefill_expected"]) == (42, 42)
    assert (state["decode_captured"], state["decode_expected"]) == (51, 51)
