"""The gateway's rotation, on Docker hosts and on Kubernetes: smg sends work only to the replicas the kit itself calls
ready.

smg's file discovery routes to every worker of its manifest that answers `/health`, but SGLang's `/health` is 200
from the warm-up on (before the start is verified) and turns 503 only once the server drains, when smg, checking
every [gateway] interval, keeps sending it new work until the drain bound cuts it. So the operator's workers file
is the list of replicas, and this loop writes the manifest smg reads with only those whose exporter says ready
(`/ready` on the replica's exporter port: verified, not draining), every POLL_SECONDS. smg rereads its manifest on
change (inotify on the folder, ~0.2 s) and lets a removed worker's requests finish, so a stopped replica leaves the
rotation within about a second of its SIGTERM, while it still serves (SGLang 0.5.23 serves what arrives during its
drain), and a restarted one joins once verified.

Its own view is on /metrics ([gateway].rotation_metrics_port; `Rotation.collect`): per worker of the workers file,
in the rotation or not, whether its exporter answered and the phase it said. smg cannot say it: a worker taken out of
its manifest is drained for 5 s and removed, and smg 1.13.0 then drops its `smg_worker_health` series: a replica out
of the rotation has no smg series at all.

The replicas come from the operator's workers file on Docker hosts (smg's own format, {"version": 1, "workers":
[{"id", "url"}]}, each worker optionally with "ready_url": default the url's host on [deployment].exporter_port, path
/ready; only id and url reach smg), and on Kubernetes from the DNS of the server pods' headless Service
([gateway].pods_service, publishing not-ready pods too: every pod is asked, and shown here). smg's own Kubernetes
discovery is not used: it adds a pod when it first turns Ready and keeps it until the pod is deleted, so after an
in-place restart of the server (its stall watchdog, a crash) only SGLang's /health, 200 before verification, would
keep an unverified replica out.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.report import Log
from configuration import state

LOG = Log("gateway")
POLL_SECONDS = 0.5
READY_TIMEOUT = 2.0
NO_ANSWER = "no answer"
NAMES = (
    "glm5_rotation_in_rotation",
    "glm5_rotation_answering",
    "glm5_rotation_phase",
)  # what collect() exports

Worker = dict[str, str]
Ask = Callable[[str], tuple[bool, str]]  # ready URL -> (ready, what it said)
Listing = Callable[[], "list[Worker] | None"]  # the replicas now; None: unknown (the last good list stays)
Resolve = Callable[[str, int], list[str]]  # host, port -> its addresses (raises OSError when it cannot tell)


def read_workers(source: Path) -> list[Worker] | None:
    """The operator's workers, or None when the file is unreadable or not the format (the last good list stays)."""
    try:
        doc = json.loads(source.read_text())
        workers = doc["workers"]
        if not all(isinstance(w, dict) and isinstance(w.get("url"), str) for w in workers):
            raise ValueError("each worker needs a url")
    except (OSError, ValueError, KeyError, TypeError) as err:
        LOG.warning(f"{source}: {err}; keeping the last rotation (the format: gateway/workers.example.json)")
        return None
    return [{k: str(v) for k, v in w.items()} for w in workers]


def addresses(host: str, port: int) -> list[str]:
    """Every address the name resolves to (a headless Service: one per pod); none when the name has no record."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        if err.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []  # no endpoints: a Service with no pod publishes no record
        raise
    return sorted({str(info[4][0]) for info in found})


def pods(host: str, port: int, resolve: Resolve = addresses) -> Listing:
    """The replicas behind a headless Service's name, one worker per pod address, `port` the server's."""

    def listing() -> list[Worker] | None:
        try:
            found = resolve(host, port)
        except OSError as err:
            LOG.warning(f"{host}: {err}; keeping the last rotation")
            return None
        return [{"id": ip, "url": f"http://{'[' + ip + ']' if ':' in ip else ip}:{port}"} for ip in found]

    return listing


def ready_url(worker: Worker, exporter_port: int) -> str:
    if "ready_url" in worker:
        return worker["ready_url"]
    parsed = urllib.parse.urlsplit(worker["url"])
    return f"{parsed.scheme}://{parsed.hostname}:{exporter_port}/ready"


def phase_of(body: bytes, otherwise: str) -> str:
    """The phase an exporter's /ready body names, or `otherwise` for a body that names none."""
    try:
        doc = json.loads(body)
    except ValueError:
        return otherwise
    phase = doc.get("phase") if isinstance(doc, dict) else None
    return phase if isinstance(phase, str) and phase else otherwise


def ask_ready(url: str) -> tuple[bool, str]:
    """The replica's own readiness: 200 from its exporter's /ready, with the phase it reports."""
    try:
        with urllib.request.urlopen(url, timeout=READY_TIMEOUT) as response:
            return True, phase_of(response.read(), "ready")
    except urllib.error.HTTPError as err:
        return False, phase_of(err.read(), str(err.code))
    except (OSError, ValueError) as err:
        return False, f"{NO_ANSWER} ({getattr(err, 'reason', err)})"


def manifest(workers: list[Worker]) -> str:
    """smg's manifest: id and url only."""
    kept = [{k: w[k] for k in ("id", "url") if k in w} for w in workers]
    return json.dumps({"version": 1, "workers": kept}, indent=2) + "\n"


class Rotation(Collector):
    """The replicas (`source`: the operator's file, or a listing such as pods()) in, smg's manifest (`target`) out;
    its state as Prometheus metrics."""

    def __init__(
        self, source: Path | Listing, target: Path, exporter_port: int, ask: Ask = ask_ready
    ) -> None:
        self.listing: Listing = (lambda: read_workers(source)) if isinstance(source, Path) else source
        self.target, self.exporter_port, self.ask = target, exporter_port, ask
        self.workers: list[Worker] = []
        self.state: dict[str, tuple[bool, str]] = {}  # url -> (in the rotation, what its replica said)

    def step(self) -> bool:
        """One pass: ask every replica, write the manifest when it changes; True when it did."""
        listed = self.listing()
        if listed is not None:
            self.workers = listed
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(self.workers)))) as pool:
            answers = list(pool.map(lambda w: self.ask(ready_url(w, self.exporter_port)), self.workers))
        now = {w["url"]: answer for w, answer in zip(self.workers, answers, strict=True)}
        for worker in self.workers:
            ready, said = now[worker["url"]]
            was = self.state.get(worker["url"])
            if was is None or was[0] != ready:
                name = worker.get("id", worker["url"])
                LOG.info(f"{name} {'joins' if ready else 'is out of'} the rotation ({said})")
        for url in set(self.state) - set(now):
            LOG.info(f"{url} is no longer listed: out of the rotation")
        text = manifest([w for w in self.workers if now[w["url"]][0]])
        self.state = now
        try:
            if self.target.read_text() == text:
                return False
        except OSError:
            pass
        self.target.parent.mkdir(parents=True, exist_ok=True)
        state.write_whole(self.target, text)  # smg reads it on the rename
        return True

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Per worker (labels worker, the url as smg's own series name it, and id): in the rotation, its exporter
        answering, and the phase it said (an exporter's phase name; `unknown` for an answer without one)."""
        labels = ["worker", "id"]
        within = GaugeMetricFamily(
            "glm5_rotation_in_rotation", "1 while smg is given this worker", labels=labels
        )
        answering = GaugeMetricFamily(
            "glm5_rotation_answering", "1 while the worker's exporter answers /ready", labels=labels
        )
        phase = GaugeMetricFamily(
            "glm5_rotation_phase", "1 for the phase the worker's exporter says", labels=[*labels, "phase"]
        )
        workers, state = self.workers, self.state  # one pass's view: step() replaces both, never mutates them
        for worker in workers:
            url = worker["url"]
            if url not in state:
                continue
            ready, said = state[url]
            ids = [url, worker.get("id", url)]
            within.add_metric(ids, float(ready))
            heard = not said.startswith(NO_ANSWER)
            answering.add_metric(ids, float(heard))
            if heard:
                phase.add_metric([*ids, said if said.isidentifier() else "unknown"], 1.0)
        yield from (within, answering, phase)

    def run(self, stop: threading.Event, poll: float = POLL_SECONDS) -> None:
        while not stop.wait(poll):
            try:
                self.step()
            except OSError as err:  # a manifest folder that cannot be written: said, and tried again
                LOG.error(f"cannot write {self.target}: {err}")
            except Exception as err:  # noqa: BLE001  (the loop must outlive any one pass: said, and tried again)
                LOG.error(f"rotation pass failed: {type(err).__name__}: {err}")

    def start(self, poll: float = POLL_SECONDS) -> threading.Event:
        """The first pass now (smg starts with the rotation as it is), then a thread; set the event to stop it."""
        self.step()
        stop = threading.Event()
        threading.Thread(target=self.run, args=(stop, poll), name="rotation", daemon=True).start()
        return stop
