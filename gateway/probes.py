"""The gateway's own probes, beside the rotation's /metrics on its port ([gateway].rotation_metrics_port).

smg's /liveness and /readiness see smg alone: a rotation that is stuck (a pass blocked on a lookup, a thread that
died) leaves smg with its last registrations, and smg stays alive and ready while a replaced or draining replica keeps
getting work. So the probes the kit configures (the gateway Deployment's, compose's healthcheck) read these:

    /live   200 while smg's /liveness answers 200 and the rotation finished a pass within the bound
    /ready  200 while smg's /readiness answers 200 (a healthy worker), the rotation gave smg its workers within the
            bound, and at least one replica is in the rotation

The bound is glm5.toml [monitoring].rotation_stale_seconds (the alert GLM5GatewayRotationStale's too; gateway/launch
--rotation-stale-seconds).

Each answers JSON {"ok", "reason"}; 503 when not ok. Any other path is the rotation's /metrics.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any, NamedTuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from gateway.rotation import Rotation

# A pass is bounded by its lookups (rotation.LOOKUP_TIMEOUT), its asks (READY_TIMEOUT, in parallel) and smg's calls
# (SMG_TIMEOUT each): well under the bound unless it is stuck. The Deployment's liveness probe fails 3 times 10 s
# apart: a stuck rotation restarts the gateway within about the bound and 30 s.
SMG_PROBE_TIMEOUT = 2.0

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class Verdict(NamedTuple):
    ok: bool
    reason: str


def smg_says(url: str) -> Verdict:
    """One of smg's own probes: 200, or why not."""
    try:
        with urllib.request.urlopen(url, timeout=SMG_PROBE_TIMEOUT) as response:
            return Verdict(response.status == 200, f"smg: {response.status}")
    except urllib.error.HTTPError as err:
        return Verdict(False, f"smg {url.rsplit('/', 1)[-1]}: {err.code}")
    except OSError as err:
        return Verdict(False, f"smg {url.rsplit('/', 1)[-1]}: no answer ({getattr(err, 'reason', err)})")


def silent(at: float, now: float, what: str, bound: float) -> str | None:
    """Why a rotation timestamp is stale, or None."""
    if at <= 0:
        return f"the rotation has not {what} yet"
    if now - at > bound:
        return f"the rotation has not {what} for {now - at:.0f} s (more than {bound:g})"
    return None


def live(rotation: Rotation, smg_probe: str, now: float, bound: float) -> Verdict:
    stale = silent(rotation.passed_at, now, "finished a pass", bound)
    if stale:
        return Verdict(False, stale)
    return smg_says(f"{smg_probe}/liveness")


def ready(rotation: Rotation, smg_probe: str, now: float, bound: float) -> Verdict:
    stale = silent(rotation.synced_at, now, "given smg its workers", bound)
    if stale:
        return Verdict(False, stale)
    serving = [url for url, answer in rotation.state.items() if answer.ready]
    if not serving:
        return Verdict(False, "no replica is in the rotation")
    said = smg_says(f"{smg_probe}/readiness")
    if not said.ok:
        return said
    return Verdict(True, f"{len(serving)} replica(s) in the rotation")


def app(metrics: CollectorRegistry, rotation: Rotation, smg_probe: str, bound: float) -> App:
    """/live and /ready (above); every other path the registry's /metrics. `smg_probe`: smg's health-check base URL;
    `bound`: seconds without a pass (or a sync) before the rotation counts as stuck."""
    served = make_wsgi_app(metrics)

    def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/live", "/ready"):
            return served(environ, start_response)
        verdict = (live if path == "/live" else ready)(rotation, smg_probe, time.time(), bound)
        body = json.dumps({"ok": verdict.ok, "reason": verdict.reason}).encode()
        status = "200 OK" if verdict.ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return application


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


def serve(host: str, port: int, application: App) -> None:
    """Serve `application` on host:port from a daemon thread; raises OSError when the port is taken."""
    server = make_server(host, port, application, Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
