"""The gateway's rotation, on Docker hosts and on Kubernetes: smg sends work only to the replicas the kit itself calls
ready, and admits only what those replicas hold.

smg's own discovery routes to every worker that answers `/health`, but SGLang's `/health` is 200 from the warm-up on
(before the start is verified) and turns 503 only once the server drains, when smg, checking every [gateway]
interval, keeps sending it new work until the drain bound cuts it. So the operator's workers file (or the server
pods' Service) is the list of replicas, and this loop gives smg only those whose exporter says ready (`/ready` on the
replica's exporter port: verified, not draining), every POLL_SECONDS, through smg's worker API (`Registry`): a stopped
replica leaves within about a second of its SIGTERM, while it still serves (SGLang 0.5.23 serves what arrives during
its drain; smg lets a removed worker's requests finish), and a restarted one joins once verified.

Each replica is registered with the requests it holds (its `max_running_requests` label: what its own KV pool, from
its /ready, holds of [gateway].context_tokens, `slots`), and smg's priority scheduler admits the sum over the replicas
it has (smg 1.13.0 `WorkerCapacity`: recomputed on every worker added or removed). So while a replica is missing
(an upgrade's drain, a failure, a start) the survivors are offered what they hold and no more: the excess waits in
the gateway's queue, or is refused there (429 at once, 503 at the queue timeout), instead of waiting inside a server.

What the rotation gave smg is also written to `target` (smg's manifest format, {"version": 1, "workers": [{"id",
"url", "slots"}]}), for operators and tests; this loop is its one writer, and smg does not read it.
Its own view is on /metrics ([gateway].rotation_metrics_port; `Rotation.collect`): per worker of the workers file,
in the rotation or not, whether its exporter answered and the phase it said. smg cannot say it: a worker it removes
is drained and dropped, and smg 1.13.0 then drops its `smg_worker_health` series: a replica out of the rotation has
no smg series at all.

The replicas come from the operator's workers file on Docker hosts (smg's own format, {"version": 1, "workers":
[{"id", "url"}]}, each worker optionally with "ready_url": default the url's host on [deployment].exporter_port, path
/ready; only the url reaches smg), and on Kubernetes from the DNS of the server pods' headless Service
([gateway].pods_service, publishing not-ready pods too: every pod is asked, and shown here). smg's own Kubernetes
discovery is not used: it adds a pod when it first turns Ready and keeps it until the pod is deleted, so after an
in-place restart of the server (its stall watchdog, a crash) only SGLang's /health, 200 before verification, would
keep an unverified replica out.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as Late
from pathlib import Path
from typing import Any, NamedTuple

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.report import Log
from configuration import state

LOG = Log("gateway")
POLL_SECONDS = 0.5
READY_TIMEOUT = 2.0
LOOKUP_TIMEOUT = (
    5.0  # a listing's DNS lookup; past it the pass keeps the last list (getaddrinfo has no bound of its own)
)
# A replica that says it is not ready (its exporter names a phase: draining, failed, starting) leaves at once; one
# whose exporter does not answer, or answers without a phase, leaves after this many passes in a row: a blip of a
# second keeps it (smg drains a removed worker for 5 s and refuses its re-add meanwhile).
MISSED_PASSES = 3
NO_ANSWER = "no answer"
NAMES = (
    "glm5_rotation_in_rotation",
    "glm5_rotation_answering",
    "glm5_rotation_phase",
    "glm5_rotation_last_pass_timestamp_seconds",
    "glm5_rotation_last_sync_timestamp_seconds",
    "glm5_rotation_gateways",
)  # what collect() exports

SLOTS_LABEL = "max_running_requests"  # the worker label smg 1.13.0 sums into its admission (WorkerCapacity)
SMG_TIMEOUT = 5.0

Worker = dict[str, str]


class Answer(NamedTuple):
    """What a replica's exporter said on /ready."""

    ready: bool
    said: str  # its phase, or why it did not answer
    pool: float | None = (
        None  # a KV pool in tokens (max_total_num_tokens, read from its server's log), if known
    )
    groups: int = (
        1  # the attention-DP groups that each hold such a pool (GLM5_PROFILE=throughput: --attn-dp-size)
    )
    word: bool = True  # the exporter named its phase itself (False: no answer, or an answer without a phase)
    admitted: int | None = (
        None  # what the replica publishes the gateways admit to it (capacity.admitted_requests)
    )


Ask = Callable[[str], Answer]  # ready URL -> what it said
# A replica's pool (None: unknown) and its attention-DP groups -> the requests the gateway admits to it.
Slots = Callable[[float | None, int], int]
Listing = Callable[[], "list[Worker] | None"]  # the replicas now; None: unknown (the last good list stays)
Count = Callable[[], int]  # the gateways that share the replicas now
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


def bounded(resolve: Resolve, timeout: float | None = None) -> Resolve:
    """`resolve` that raises OSError past `timeout` (default LOOKUP_TIMEOUT; its lookup goes on in a thread of its own, which one stuck
    lookup holds: later ones then time out too, until it returns)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lookup")

    def within(host: str, port: int) -> list[str]:
        bound = LOOKUP_TIMEOUT if timeout is None else timeout
        try:
            return pool.submit(resolve, host, port).result(timeout=bound)
        except Late:
            raise OSError(f"no answer from DNS within {bound:g} s") from None

    return within


def pods(host: str, port: int, resolve: Resolve = addresses) -> Listing:
    """The replicas behind a headless Service's name, one worker per pod address, `port` the server's; the lookup
    bounded in time (`bounded`)."""
    resolve = bounded(resolve)

    def listing() -> list[Worker] | None:
        try:
            found = resolve(host, port)
        except OSError as err:
            LOG.warning(f"{host}: {err}; keeping the last rotation")
            return None
        return [{"id": ip, "url": f"http://{'[' + ip + ']' if ':' in ip else ip}:{port}"} for ip in found]

    return listing


def peers(host: str, own: str | None, first: int, resolve: Resolve = addresses) -> Count:
    """The gateways that share the replicas: every address of their headless Service (publishing not-ready and
    terminating pods too: one still draining its requests holds its share), with this one's own (`own`, its pod IP)
    counted whether it is listed yet or not; `first` until a lookup answers, the last answer while none does."""
    resolve = bounded(resolve)
    last = [max(1, first)]

    def count() -> int:
        try:
            found = set(resolve(host, 0))
        except OSError as err:
            LOG.warning(f"{host}: {err}; counting {last[0]} gateway(s) as before")
            return last[0]
        last[0] = max(1, len(found | ({own} if own else set())))
        return last[0]

    return count


def ready_url(worker: Worker, exporter_port: int) -> str:
    if "ready_url" in worker:
        return worker["ready_url"]
    parsed = urllib.parse.urlsplit(worker["url"])
    return f"{parsed.scheme}://{parsed.hostname}:{exporter_port}/ready"


def answer_of(ready: bool, body: bytes, otherwise: str) -> Answer:
    """What an exporter's /ready body says: the phase it names (else `otherwise`), the KV pool of its capacity and the
    attention-DP groups that each hold one."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    doc = doc if isinstance(doc, dict) else {}
    phase = doc.get("phase")
    capacity = doc.get("capacity")
    capacity = capacity if isinstance(capacity, dict) else {}
    pool, groups = capacity.get("max_total_num_tokens"), capacity.get("attn_dp_size", 1)
    admitted = capacity.get("admitted_requests")
    named = isinstance(phase, str) and bool(phase)
    return Answer(
        ready,
        phase if isinstance(phase, str) and phase else otherwise,
        float(pool) if isinstance(pool, int | float) and pool > 0 else None,
        int(groups) if isinstance(groups, int | float) and groups >= 1 else 1,
        named,
        int(admitted) if isinstance(admitted, int | float) and admitted >= 1 else None,
    )


def ask_ready(url: str) -> Answer:
    """The replica's own readiness: 200 from its exporter's /ready, with the phase and the pool it reports."""
    try:
        with urllib.request.urlopen(url, timeout=READY_TIMEOUT) as response:
            return answer_of(True, response.read(), "ready")
    except urllib.error.HTTPError as err:
        return answer_of(False, err.read(), str(err.code))
    except (OSError, ValueError) as err:
        return Answer(False, f"{NO_ANSWER} ({getattr(err, 'reason', err)})", word=False)


def manifest(workers: list[Worker], slots: dict[str, int]) -> str:
    """The record of what smg was given: each ready replica's id and url, and the requests admitted to it."""
    kept = [{k: w[k] for k in ("id", "url") if k in w} | {"slots": slots[w["url"]]} for w in workers]
    return json.dumps({"version": 1, "workers": kept}, indent=2) + "\n"


class Registry:
    """smg's workers, through its control-plane API with the operator's key (`key`: smg's --control-plane-api-keys,
    which refuses the clients' key there); each worker registered with the clients' key (`worker_key`), which its
    replica holds and smg's own asks of it (/server_info, /health) carry."""

    def __init__(self, base_url: str, key: str | None, worker_key: str | None = None) -> None:
        self.base_url, self.key, self.worker_key = base_url.rstrip("/"), key, worker_key

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        with urllib.request.urlopen(request, timeout=SMG_TIMEOUT) as response:
            return json.loads(response.read() or b"{}")

    def sync(self, wanted: dict[str, int]) -> None:
        """Make smg's workers `wanted` (url -> slots): remove the others at once (smg lets their requests finish)
        and add the missing. A worker whose share changed is registered again, one at a time: smg 1.13.0 drains a
        worker it is told to change (a PATCH of its labels too) for 5 s, in which it takes no new request, so the
        next is changed only once no worker drains. A worker smg still drains is left to it: its url is added again
        on a later pass, once smg has dropped it (until then smg answers 409). Raises OSError when smg does not
        answer (before it listens, and while it stops): the next pass tries again."""
        listed = self.call("GET", "/workers").get("workers", [])
        live = {w["url"]: w for w in listed if w.get("status") != "draining"}
        resizing = len(live) < len(listed)  # one drains: no other share changes this pass
        for url, known in live.items():
            if url not in wanted:
                self.call("DELETE", f"/workers/{known['id']}")
            elif wanted[url] != _slots(known) and not resizing:
                self.call("DELETE", f"/workers/{known['id']}")
                resizing = True
        for url, slots in wanted.items():
            if url in live:
                continue  # as registered, or its new share waits its turn
            worker: dict[str, Any] = {"url": url, "labels": {SLOTS_LABEL: str(slots)}}
            if self.worker_key:  # smg 1.13.0 never shows it back on GET /workers
                worker["api_key"] = self.worker_key
            try:
                self.call("POST", "/workers", worker)
            except urllib.error.HTTPError as err:
                if err.code != 409:  # 409: a registration under way, or the old one still draining
                    raise


def _slots(worker: dict[str, Any]) -> int | None:
    labels = worker.get("labels")
    value = labels.get(SLOTS_LABEL) if isinstance(labels, dict) else None
    return int(value) if isinstance(value, str) and value.isdigit() else None


class Rotation(Collector):
    """The replicas (`source`: the operator's file, or a listing such as pods()) in; smg's workers (`smg`) and the
    record (`target`) out; its state as Prometheus metrics."""

    def __init__(
        self,
        source: Path | Listing,
        target: Path,
        exporter_port: int,
        ask: Ask = ask_ready,
        *,
        slots: Slots,
        smg: Registry | None = None,
        gateways: Count = lambda: 1,
    ) -> None:
        self.listing: Listing = (lambda: read_workers(source)) if isinstance(source, Path) else source
        self.target, self.exporter_port, self.ask = target, exporter_port, ask
        self.slots, self.smg, self.gateways = slots, smg, gateways
        self.sharing = 0  # the gateways the shares were last divided among (0: no pass yet)
        self.workers: list[Worker] = []
        self.state: dict[str, Answer] = {}  # url -> the answer it stands by (ready: in the rotation)
        self.missed: dict[str, int] = {}  # url -> passes in a row without its own word while in the rotation
        self.smg_said = ""  # why smg's workers could not be updated, said once until it changes
        self.passed_at = 0.0  # time.time() of the last pass that finished (0: none yet)
        self.synced_at = 0.0  # ... and of the last that gave smg its workers (0: none yet)

    def step(self) -> bool:
        """One pass: ask every replica, give smg the ready ones, write the record when it changes; True when it
        did."""
        listed = self.listing()
        if listed is not None:
            self.workers = listed
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(self.workers)))) as pool:
            answers = list(pool.map(lambda w: self.ask(ready_url(w, self.exporter_port)), self.workers))
        now = {w["url"]: self.stand(w, answer) for w, answer in zip(self.workers, answers, strict=True)}
        for worker in self.workers:
            ready, said = now[worker["url"]].ready, now[worker["url"]].said
            was = self.state.get(worker["url"])
            if was is None or was.ready != ready:
                name = worker.get("id", worker["url"])
                LOG.info(f"{name} {'joins' if ready else 'is out of'} the rotation ({said})")
        for url in set(self.state) - set(now):
            LOG.info(f"{url} is no longer listed: out of the rotation")
        serving = [w for w in self.workers if now[w["url"]].ready]
        sharing = self.gateways()
        if sharing != self.sharing:
            LOG.info(f"{sharing} gateway(s) share the replicas: each admits 1/{sharing} of a replica's share")
        self.sharing = sharing
        slots = {w["url"]: self.share(now[w["url"]], sharing) for w in serving}
        self.state = now
        if self.smg is not None:
            try:
                self.smg.sync(slots)
                self.smg_said = ""
                self.synced_at = time.time()
            except (
                OSError,
                ValueError,
            ) as err:  # smg not listening yet, or stopping: the next pass tries again
                said = f"smg's workers not updated: {getattr(err, 'reason', err)}; trying again"
                if said != self.smg_said:
                    LOG.info(said)
                self.smg_said = said
        self.passed_at = time.time()
        text = manifest(serving, slots)
        try:
            if self.target.read_text() == text:
                return False
        except OSError:
            pass
        self.target.parent.mkdir(parents=True, exist_ok=True)
        state.write_whole(self.target, text)
        return True

    def share(self, answer: Answer, sharing: int) -> int:
        """What this gateway admits to a replica: what the replica publishes the gateways admit to it (its /ready,
        capacity.admitted_requests; the kit's own arithmetic, `slots`, for a replica that publishes none), divided
        among the gateways that share it."""
        whole = answer.admitted if answer.admitted is not None else self.slots(answer.pool, answer.groups)
        return max(1, whole // max(1, sharing))

    def stand(self, worker: Worker, answer: Answer) -> Answer:
        """The answer this pass acts on: the replica's own word at once (ready, or a phase it names); a replica in
        the rotation that gave no word keeps its last answer for MISSED_PASSES - 1 passes in a row, then leaves."""
        url, was = worker["url"], self.state.get(worker["url"])
        if answer.ready or answer.word or was is None or not was.ready:
            self.missed.pop(url, None)
            return answer
        self.missed[url] = missed = self.missed.get(url, 0) + 1
        if missed >= MISSED_PASSES:
            self.missed.pop(url, None)
            return answer
        LOG.info(f"{worker.get('id', url)}: {answer.said}, pass {missed} of {MISSED_PASSES}: kept")
        return was

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
        passes = GaugeMetricFamily(
            "glm5_rotation_last_pass_timestamp_seconds",
            "When the rotation last finished a pass (Unix time; 0: none yet): stale, nothing follows the replicas",
        )
        passes.add_metric([], self.passed_at)
        synced = GaugeMetricFamily(
            "glm5_rotation_last_sync_timestamp_seconds",
            "When the rotation last gave smg its workers (Unix time; 0: none yet)",
        )
        synced.add_metric([], self.synced_at)
        sharing = GaugeMetricFamily(
            "glm5_rotation_gateways",
            "The gateways this one divides each replica's share among (0: no pass yet)",
        )
        sharing.add_metric([], float(self.sharing))
        workers, state = self.workers, self.state  # one pass's view: step() replaces both, never mutates them
        for worker in workers:
            url = worker["url"]
            if url not in state:
                continue
            ready, said = state[url].ready, state[url].said
            ids = [url, worker.get("id", url)]
            within.add_metric(ids, float(ready))
            heard = not said.startswith(NO_ANSWER)
            answering.add_metric(ids, float(heard))
            if heard:
                phase.add_metric([*ids, said if said.isidentifier() else "unknown"], 1.0)
        yield from (within, answering, phase, passes, synced, sharing)

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
