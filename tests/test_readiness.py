"""ci/readiness.py: the one wait-until-ready rule that ci/smoke, ci/bench and the tests share."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ci import readiness

BOOT = datetime.datetime(2026, 11, 30, 10, 0, tzinfo=datetime.UTC)
BEFORE, AFTER = "2026-11-30T09:59:00+00:00", "2026-11-30T10:00:05+00:00"


@pytest.fixture
def health_200() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class Scripted(readiness.Target):
    """A target whose healthcheck says the given states in turn (the last one repeats)."""

    def __init__(self, url: str, states: list[dict[str, Any] | None], gone_after: int | None = None) -> None:
        super().__init__(readiness.Connection(url, None))
        self.states, self.polls, self.gone_after = states, 0, gone_after

    def state(self) -> dict[str, Any] | None:
        self.polls += 1
        return self.states[min(self.polls - 1, len(self.states) - 1)]

    def exited(self) -> str | None:
        return "exited 70" if self.gone_after is not None and self.polls >= self.gone_after else None


def wait(target: readiness.Target, since: datetime.datetime | None = BOOT, **kw: Any) -> readiness.Readiness:
    lines: list[str] = []
    return readiness.wait_until_ready(target, kw.pop("timeout", 5), 0.01, since, lines.append, **kw)


@pytest.mark.boots
def test_health_200_is_not_enough_while_the_healthcheck_says_warming_up(health_200: str) -> None:
    target = Scripted(
        health_200,
        [{"phase": "warming_up", "started_at": AFTER}] * 3 + [{"phase": "ready", "started_at": AFTER}],
    )
    assert wait(target).ready and target.polls == 4


@pytest.mark.boots
def test_a_start_from_before_the_boot_counts_as_starting(health_200: str) -> None:
    old_ready = {"phase": "ready", "started_at": BEFORE}
    old_failed = {"phase": "failed", "reason": "old OOM", "started_at": BEFORE}
    target = Scripted(health_200, [old_failed, old_ready, {"phase": "ready", "started_at": AFTER}])
    assert wait(target).ready and target.polls == 3


@pytest.mark.boots
def test_without_a_boot_the_running_start_counts(health_200: str) -> None:
    assert wait(Scripted(health_200, [{"phase": "ready", "started_at": BEFORE}]), since=None).ready


@pytest.mark.boots
def test_a_failed_start_ends_the_wait_with_its_reason(health_200: str) -> None:
    waited = wait(
        Scripted(health_200, [{"phase": "failed", "reason": "OOM in capture", "started_at": AFTER}])
    )
    assert not waited.ready and waited.reason == "OOM in capture"


@pytest.mark.boots
def test_through_restarts_only_the_exit_ends_the_wait(health_200: str) -> None:
    failed = {"phase": "failed", "reason": "crash", "started_at": AFTER}
    target = Scripted(health_200, [failed, failed, {"phase": "ready", "started_at": AFTER}])
    assert wait(target, through_restarts=True).ready
    gone = Scripted(health_200, [failed], gone_after=3)
    waited = wait(gone, through_restarts=True)
    assert not waited.ready and waited.reason == "exited 70" and gone.polls == 3


@pytest.mark.boots
def test_no_healthcheck_view_falls_back_to_health_alone(health_200: str) -> None:
    assert wait(Scripted(health_200, [None])).ready


def test_nothing_listening_times_out() -> None:
    waited = wait(Scripted("http://127.0.0.1:9", [None]), timeout=0.2)
    assert not waited.ready and waited.reason == "not ready within 0s"


def test_the_connection_follows_the_host_settings(tmp_path: Any) -> None:
    key = tmp_path / "key"
    key.write_text("k-0123456789abcdef\n")
    conn = readiness.connection({"GLM5_HOST_PORT": "31000", "GLM5_API_KEY_FILE": str(key)})
    assert conn == readiness.Connection("http://127.0.0.1:31000", "k-0123456789abcdef")
    assert readiness.connection({}, "http://h:1/").url == "http://h:1"


def test_the_key_the_quick_start_writes_to_glm5_env_is_the_host_tools_key(tmp_path: Any) -> None:
    """The quick start puts GLM5_API_KEY in glm5.env (the container's settings): ci/smoke --url in a new shell sent
    no key and failed 8 of 9 checks with 401. The shell and .env still win."""
    (tmp_path / "glm5.env").write_text("GLM5_VERIFY=enforce\nGLM5_API_KEY=k-from-glm5-env-0123\n")
    assert readiness.connection({}, root=tmp_path).api_key == "k-from-glm5-env-0123"
    shell = readiness.connection({"GLM5_API_KEY": "k-from-the-shell-0123"}, root=tmp_path)
    assert shell.api_key == "k-from-the-shell-0123"
    (tmp_path / ".env").write_text("GLM5_API_KEY=k-from-dot-env-012345\n")
    assert readiness.connection({}, root=tmp_path).api_key == "k-from-dot-env-012345"
    assert readiness.connection({}, root=tmp_path / "none").api_key is None


def test_a_local_target_boots_each_variant_with_its_own_settings_only(tmp_path: Any) -> None:
    target = readiness.Local(
        readiness.Connection("http://127.0.0.1:9", None), {"BASE": "1"}, tmp_path / "out"
    )
    seen = []
    original = readiness.subprocess.Popen

    class Recorder:
        def __init__(self, argv: list[str], env: dict[str, str], **_kw: Any) -> None:
            seen.append(env)

        def poll(self) -> int:
            return 0

    readiness.subprocess.Popen = Recorder  # type: ignore[assignment,misc]
    try:
        target.boot({"GLM5_MEM_FRACTION_STATIC": "0.85"})
        target.boot({"GLM5_CUDA_GRAPH_MAX_BS_DECODE": "256"})
    finally:
        readiness.subprocess.Popen = original  # type: ignore[misc]
    assert seen[1] == {"BASE": "1", "GLM5_CUDA_GRAPH_MAX_BS_DECODE": "256"}
