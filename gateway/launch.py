"""Start the SGLang Model Gateway (smg) in front of the GLM-5 replicas, the API key on no command line.

    gateway/launch --discovery-file FILE [-- SMG-FLAGS...]      plain Docker hosts (compose profile gateway): smg
                                                                routes to the ready replicas of FILE (gateway/rotation.py)
    gateway/launch --kubernetes NAMESPACE [--replicas N] [-- SMG-FLAGS...]
                                                                the Kubernetes overlays: the ready server pods of this
                                                                namespace ([gateway].pods_service, gateway/rotation.py)
    gateway/launch ... --dry-run                                print smg's arguments (the key redacted), start nothing

The flags come from entrypoint/glm5.toml's [gateway] (policy, worker health checks that follow the replicas'
readiness rule, ports), then admission sized from the replicas (per replica what its KV pool holds of [gateway].context_tokens,
configuration/admission.py: the pool is each listed replica's own max_total_num_tokens from its /ready, else
[gateway].kv_tokens; at most its largest captured decode batch; times the replicas: FILE's workers, or --replicas, else
[gateway].replicas; a queue as long again; smg takes it at launch, so restart the gateway when the replicas change:
smg stops listening 5 s after SIGTERM and finishes the answers in flight for up to [gateway].shutdown_grace_seconds,
so none is cut, while a lone compose gateway refuses new connections until they end; Kubernetes sizes for
--replicas, the autoscaling overlay's most, and needs no relaunch),
then the discovery, then any SMG-FLAGS; smg's own parser (smg.launch_router.
parse_router_args) checks them all. The key, GLM5_API_KEY or GLM5_API_KEY_FILE as for the replicas, is added
to the parsed arguments inside this process and smg is run from Python (smg.launch_router.launch_router), so it
is in no argv (ps, /proc/PID/cmdline, the pod spec). smg checks it on /v1/* and forwards the client's own
Authorization header to the replicas, which hold the same key: one key, checked at the gateway and again by
every replica on the cluster network.
Exit codes (common/report.py): 2 bad usage or flags smg refuses, 3 an invalid setting; smg's own otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from common.report import INVALID_SETTING, USAGE, Log, Problems
from configuration import admission as kv
from configuration import settings
from configuration.batch_sizes import effective_decode_max_bs
from gateway.rotation import Rotation, Worker, pods, read_workers, ready_url

LOG = Log("gateway")


def pool_tokens(workers: list[Worker], exporter_port: int) -> float | None:
    """The smallest KV pool the listed replicas report (max_total_num_tokens in their /ready's capacity), or None
    when none can say yet."""
    found = []
    for worker in workers:
        try:
            with urllib.request.urlopen(ready_url(worker, exporter_port), timeout=3) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as err:  # 503 before ready: its body still holds what the log said
            body = json.loads(err.read() or b"{}")
        except (OSError, ValueError):
            continue
        capacity = body.get("capacity") if isinstance(body, dict) else None
        if isinstance(capacity, dict) and capacity.get("max_total_num_tokens"):
            found.append(float(capacity["max_total_num_tokens"]))
    return min(found) if found else None


def admission(
    values: Mapping[str, Any], replicas: int, gateways: int = 1, pool: float | None = None
) -> list[str]:
    """Bounded concurrency and queue for `replicas` replicas, shared by `gateways` gateways (smg bounds each process
    alone; glm5.toml [gateway] says why these sizes), and the routing that keeps each replica near its capacity.
    `pool`: a replica's KV pool in tokens, as its server said (else [gateway].kv_tokens)."""
    gw = settings.load_config()["gateway"]
    graphs = effective_decode_max_bs(
        values["cuda_graph_max_bs_decode"], values["speculative"] != "off", values["max_running_requests"]
    )
    per_replica = kv.per_replica(graphs, pool or gw["kv_tokens"], gw["context_tokens"])
    bound = max(1, max(1, replicas) * per_replica // max(1, gateways))
    # cache_aware keeps a shared prefix on one replica until its load passes the fleet's mean by the spill margin
    # (smg's default: 64 requests and 1.5 times the mean): at saturation, where the mean is a replica's capacity, one
    # replica would hold 1.5 times it, the rest queued in it. 1/64th of the capacity and 1.1 times keep each near it
    # (tests/test_rollout.py: at most capacity + 1 at 4x overload; smg's defaults put all of it on one replica).
    spill = max(1, per_replica // 64)
    # smg's worker overload protection (on by default: 8 waiting requests) leaves a loaded worker out while another
    # is under the thresholds, and 1.13.0 counts a worker draining out of the rotation (5 s) as that other one: the
    # last live replica is left out and requests fail with no_available_workers (measured: 4,048 of 8,648 during a
    # rolling replacement at 40 clients; none with it off). The admission bound above guards the replicas instead.
    return ["--max-concurrent-requests", str(bound), "--queue-size", str(bound),
            "--queue-timeout-secs", str(gw["queue_timeout_seconds"]),
            "--balance-abs-threshold", str(spill), "--balance-rel-threshold", "1.1",
            "--disable-worker-overload-protection", "--request-timeout-secs", str(gw["request_timeout_seconds"]),
            "--shutdown-grace-period-secs", str(gw["shutdown_grace_seconds"])]  # fmt: skip


def smg_argv(values: Mapping[str, Any], args: argparse.Namespace) -> list[str]:
    """smg's arguments, without the key."""
    gw = settings.load_config()["gateway"]
    argv = ["--host", "0.0.0.0", "--port", str(gw["port"]), "--prometheus-port", str(gw["metrics_port"])]
    argv += ["--prometheus-host", "0.0.0.0", "--health-check-port", str(gw["probe_port"])]
    argv += [str(f).format(**values) for f in gw["flags"]]
    if args.discovery_file:
        listed = read_workers(Path(args.discovery_file)) or []
        argv += admission(values, len(listed), pool=pool_tokens(listed, int(values["exporter_port"])))
        argv += ["--discovery-provider", "file", "--discovery-file", args.rotation_file]
    elif args.kubernetes:
        argv += admission(values, args.replicas or int(gw["replicas"]), int(gw["gateways"]))
        # The rotation's manifest of the ready pods (gateway/rotation.py says why not smg's Kubernetes discovery).
        argv += ["--discovery-provider", "file", "--discovery-file", args.rotation_file]
    return argv + args.smg_flags


def pods_name(namespace: str) -> str:
    """The server pods' headless Service in `namespace` (k8s/overlays/gateway), as the pod's DNS search finds it."""
    return f"{settings.load_config()['gateway']['pods_service']}.{namespace}.svc"


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="gateway/launch", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--discovery-file", help='the replicas: {"version": 1, "workers": [{"id", "url"}]}')
    where.add_argument("--kubernetes", metavar="NAMESPACE", help="discover the server pods of this namespace")
    parser.add_argument(
        "--rotation-file",
        default=settings.load_config()["gateway"]["rotation_file"],
        help="where the ready replicas are written for smg (a writable folder)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        help="with --kubernetes: the replicas admission is sized for (default [gateway].replicas; the autoscaling "
        "overlay: its most)",
    )
    parser.add_argument(
        "--rotation-metrics-port",
        type=int,
        default=settings.load_config()["gateway"]["rotation_metrics_port"],
        help="where the rotation's own /metrics listens",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print smg's arguments (key redacted) and stop"
    )
    parser.add_argument("smg_flags", nargs="*", help="more smg flags, after --")
    args = parser.parse_args(argv)
    if args.replicas is not None and (args.replicas < 1 or not args.kubernetes):
        parser.error(
            f"--replicas {args.replicas}: 1 or more, with --kubernetes (a workers file lists its replicas)"
        )
    try:
        values = settings.resolve(settings.container_environment(environ))
    except Problems as err:
        LOG.problems(err.problems)
        return INVALID_SETTING
    public = smg_argv(values, args)
    key = values["api_key"]
    from smg.launch_router import launch_router, parse_router_args

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            router_args = parse_router_args(public + (["--api-key", key] if key else []))
    except SystemExit as exit_:  # smg's argparse refused a flag: its own message, without its usage
        reason = (said.getvalue().strip().splitlines() or ["(no message)"])[-1]
        LOG.error(f"smg refused the gateway flags: {reason.split(': error: ', 1)[-1]}")
        return USAGE if exit_.code else 0
    if args.dry_run:
        print(shlex.join(["smg", "launch", *public, *(["--api-key", "(redacted)"] if key else [])]))
        return 0
    if not key:
        LOG.warning("no GLM5_API_KEY(_FILE): the gateway answers anyone who reaches its port")
    source = (
        Path(args.discovery_file) if args.discovery_file else pods(pods_name(args.kubernetes), values["port"])
    )
    turn = Rotation(source, Path(args.rotation_file), int(values["exporter_port"]))
    try:
        turn.start()
    except OSError as err:
        LOG.error(f"--rotation-file {args.rotation_file}: {err}; fix: point it at a writable folder")
        return USAGE
    registry = CollectorRegistry()
    registry.register(turn)
    try:
        start_http_server(args.rotation_metrics_port, "0.0.0.0", registry)
    except OSError as err:
        LOG.error(
            f"--rotation-metrics-port {args.rotation_metrics_port}: {err}; "
            "fix: a free port ([gateway].rotation_metrics_port)"
        )
        return USAGE
    launch_router(router_args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
