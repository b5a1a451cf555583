"""Start the SGLang Model Gateway (smg) in front of the GLM-5 replicas, the API key on no command line.

    gateway/launch --discovery-file FILE [-- SMG-FLAGS...]      plain Docker hosts (compose profile gateway): smg
                                                                routes to the ready replicas of FILE (gateway/rotation.py)
    gateway/launch --kubernetes NAMESPACE [--replicas N] [-- SMG-FLAGS...]
                                                                the Kubernetes overlays: the ready server pods of this
                                                                namespace ([gateway].pods_service, gateway/rotation.py)
    gateway/launch ... --dry-run                                print smg's arguments (the key redacted), start nothing

The flags come from entrypoint/glm5.toml's [gateway] (policy, worker health checks that follow the replicas'
readiness rule, ports), then admission: smg's priority scheduler admits the sum of what the ready replicas hold, each
registered by the rotation with its own share (gateway/rotation.py: what the replica's /ready publishes, its
capacity's admitted_requests; on Kubernetes divided among the gateway pods that exist now, counted each pass from
their headless Service, [gateway].gateways_service), so a replica that drains, fails or is still starting takes its share with it
and nothing needs a relaunch; while none is registered (the gateway's first second, or no replica serving) a request
waits in smg's queue for one, and gets 503 with Retry-After at the queue timeout, never a 404; the queue is sized
for the replicas listed (FILE's workers, or --replicas, else [gateway].replicas), and the scheduler's classes, all alike,
are written beside the rotation's record with the queue size and timeout smg's flags give;
then any SMG-FLAGS; smg's own parser (smg.launch_router.
parse_router_args) checks them all. The keys are added to the parsed arguments inside this process and smg is run
from Python (smg.launch_router.launch_router), so neither is in any argv (ps, /proc/PID/cmdline, the pod spec):
- the clients' key, GLM5_API_KEY or GLM5_API_KEY_FILE as for the replicas: smg checks it on /v1/* and forwards the
  client's own Authorization header to the replicas, which hold the same key (checked again by each);
- the operator's key, GLM5_ADMIN_API_KEY(_FILE) (unset: a random one this process alone holds), as smg's
  --control-plane-api-keys: its worker API and admin routes (/workers, /flush_cache, profiles, tokenizers) take it
  and refuse the clients' key; the rotation registers the replicas with it.
A request runs once ([gateway].flags: no retry, no circuit breaker) and its body is bounded (`max_payload_bytes`).
The gateway's probes are the kit's (gateway/probes.py: smg's own and the rotation's last pass), on the rotation's port.
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from common.report import INVALID_SETTING, USAGE, Log, Problem, Problems
from configuration import admission as kv
from configuration import layout, settings
from configuration.batch_sizes import rank_decode_sizes
from configuration.config import generated_key
from gateway import probes
from gateway.rotation import Registry, Rotation, Slots, peers, pods, read_workers

LOG = Log("gateway")


def slots(values: Mapping[str, Any]) -> Slots:
    """What the gateways admit to a replica whose attention-DP groups (1: TP attention) each hold a KV pool (None:
    unknown: a group's pool by the layout's estimate under `values`, configuration/layout.py pool_tokens): per group
    what its pool holds of [gateway].context_tokens, at most the largest decode batch a rank captures (its share of
    the running requests under DP attention). The rotation uses it only for a replica whose /ready publishes no
    `admitted_requests`, and divides it among the live gateways."""
    cfg = settings.load_config()
    gw = cfg["gateway"]
    estimated: dict[int, int] = {}  # attention-DP groups -> a group's pool by the estimate

    def admitted(pool: float | None, groups: int = 1) -> int:
        graphs = rank_decode_sizes(values, groups)[-1]
        if not pool and groups not in estimated:
            estimated[groups] = layout.pool_tokens(values, cfg, groups)
        return max(1, groups * kv.per_replica(graphs, pool or estimated[groups], gw["context_tokens"]))

    return admitted


def admission(
    values: Mapping[str, Any], replicas: int, config: str, gateways: int = 1, groups: int = 1
) -> list[str]:
    """smg's admission: its priority scheduler, which admits the sum of the slots the rotation registers each ready
    replica with (`slots`), so a missing replica's share is never offered to the others, and nothing is admitted
    while none is registered; the queue is sized for `replicas` (glm5.toml [gateway] says why these sizes), and the
    routing keeps each replica near its capacity. `config`: where the scheduler's classes are written
    (`scheduler_classes`). `groups`: the replicas' attention-DP groups (GLM5_PROFILE)."""
    gw = settings.load_config()["gateway"]
    per_replica = slots(values)(None, groups)
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
    # smg's own in-flight bound (--max-concurrent-requests) is off (0): it is the capacity smg falls back to while no
    # worker is registered, so a request was admitted and answered `404 model_not_found` ("No worker available")
    # from the port's first second to the rotation's first registration, a final answer to an OpenAI client. Off, the
    # priority scheduler's capacity is the registered shares alone: with none, a request waits in the queue for the
    # first one (tests/test_gateway_faults.py), and the bound is what the replicas registered (tests/test_rollout.py).
    return ["--priority-scheduler-enabled", "--priority-scheduler-config", config,
            "--priority-scheduler-default-max-class", "default",
            "--max-concurrent-requests", "0", "--queue-size", str(bound),
            "--queue-timeout-secs", str(gw["queue_timeout_seconds"]),
            "--balance-abs-threshold", str(spill), "--balance-rel-threshold", "1.1",
            "--disable-worker-overload-protection", "--request-timeout-secs", str(gw["request_timeout_seconds"]),
            "--shutdown-grace-period-secs", str(gw["shutdown_grace_seconds"])]  # fmt: skip


def max_payload_bytes() -> int:
    """The largest request body smg accepts: the longest context the kit sizes for, at [gateway]
    payload_bytes_per_token (glm5.toml says why)."""
    gw = settings.load_config()["gateway"]
    return int(max(gw["sizing_contexts"])) * int(gw["payload_bytes_per_token"])


def scheduler_classes(queue_size: int, queue_timeout_secs: int) -> str:
    """smg's priority-scheduler config (JSON, which its YAML reader takes): every class alike, none reserved, none
    preempting, each queueing as smg's --queue-size and --queue-timeout-secs say (the scheduler reads its classes,
    not those flags: the flags as given, the kit's or the operator's after `--`, are carried here)."""
    alike = {"reserved_floor": 0, "reserved_per_slot": 0.0, "queue_size": queue_size,
             "queue_timeout_secs": queue_timeout_secs, "starvation_threshold_secs": queue_timeout_secs,
             "can_preempt": False}  # fmt: skip
    return (
        json.dumps({"classes": dict.fromkeys(("system", "interactive", "default", "bulk"), alike)}, indent=2)
        + "\n"
    )


def smg_argv(values: Mapping[str, Any], args: argparse.Namespace, groups: int = 1) -> list[str]:
    """smg's arguments, without the key; `groups`: the replicas' attention-DP groups."""
    gw = settings.load_config()["gateway"]
    argv = ["--host", "0.0.0.0", "--port", str(gw["port"]), "--prometheus-port", str(gw["metrics_port"])]
    argv += ["--prometheus-host", "0.0.0.0", "--health-check-port", str(gw["probe_port"])]
    argv += [str(f).format(**values) for f in gw["flags"]]
    argv += ["--max-payload-size", str(max_payload_bytes())]
    config = str(scheduler_file(args))
    if args.discovery_file:
        argv += admission(values, len(read_workers(Path(args.discovery_file)) or []), config, 1, groups)
    elif args.kubernetes:
        argv += admission(values, args.replicas or int(gw["replicas"]), config, int(gw["gateways"]), groups)
    # No discovery flags: the rotation registers the ready replicas through smg's API (gateway/rotation.py says why
    # not smg's own discovery).
    return argv + args.smg_flags


def scheduler_file(args: argparse.Namespace) -> Path:
    """Where the scheduler's classes are written: beside the rotation's record (a writable folder)."""
    return Path(args.rotation_file).parent / "scheduler.json"


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
        help="where the rotation's own /metrics and the gateway's /live and /ready listen (gateway/probes.py)",
    )
    parser.add_argument(
        "--rotation-stale-seconds",
        type=float,
        default=settings.load_config()["monitoring"]["rotation_stale_seconds"],
        help="the rotation counts as stuck (/live and /ready fail) after this long without a pass",
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
        groups = layout.resolve(values, settings.load_config()).attn_dp_size  # the replicas' own settings
    except Problems as err:
        LOG.problems(err.problems)
        return INVALID_SETTING
    except Problem as problem:
        LOG.problems([problem])
        return INVALID_SETTING
    public = smg_argv(values, args, groups)
    key = values["api_key"]
    operator = values["admin_api_key"] or generated_key()
    from smg.launch_router import launch_router, parse_router_args

    said = io.StringIO()
    keys = (["--api-key", key] if key else []) + [
        "--control-plane-api-keys",
        f"operator:operator:admin:{operator}",
    ]
    try:
        with contextlib.redirect_stderr(said):
            router_args = parse_router_args(public + keys)
    except SystemExit as exit_:  # smg's argparse refused a flag: its own message, without its usage
        reason = (said.getvalue().strip().splitlines() or ["(no message)"])[-1]
        LOG.error(f"smg refused the gateway flags: {reason.split(': error: ', 1)[-1]}")
        return USAGE if exit_.code else 0
    classes = scheduler_classes(router_args.queue_size, router_args.queue_timeout_secs)
    if args.dry_run:
        shown = [*(["--api-key", "(redacted)"] if key else []), "--control-plane-api-keys", "(redacted)"]
        print(shlex.join(["smg", "launch", *public, *shown]))
        print(f"# {scheduler_file(args)}:\n{classes}", end="")
        return 0
    if not key:
        LOG.warning("no GLM5_API_KEY(_FILE): the gateway answers anyone who reaches its port")
    source = (
        Path(args.discovery_file) if args.discovery_file else pods(pods_name(args.kubernetes), values["port"])
    )
    gw = settings.load_config()["gateway"]
    # On Kubernetes every gateway pod shares each replica: counted each pass from their own headless Service.
    gateways = (
        (lambda: 1)
        if args.discovery_file
        else peers(
            f"{gw['gateways_service']}.{args.kubernetes}.svc", environ.get("POD_IP"), int(gw["gateways"])
        )
    )
    host = "127.0.0.1" if router_args.host in ("0.0.0.0", "::", "") else router_args.host
    registry = Registry(
        f"http://{'[' + host + ']' if ':' in host else host}:{router_args.port}", operator, key or None
    )
    turn = Rotation(
        source,
        Path(args.rotation_file),
        int(values["exporter_port"]),
        slots=slots(values),
        smg=registry,
        gateways=gateways,
    )
    try:
        scheduler_file(args).parent.mkdir(parents=True, exist_ok=True)
        scheduler_file(args).write_text(classes)
        turn.start()
    except OSError as err:
        LOG.error(f"--rotation-file {args.rotation_file}: {err}; fix: point it at a writable folder")
        return USAGE
    metrics = CollectorRegistry()
    metrics.register(turn)
    probe_port = router_args.health_check_port or router_args.port
    try:
        probes.serve(
            "0.0.0.0",
            args.rotation_metrics_port,
            probes.app(metrics, turn, f"http://127.0.0.1:{probe_port}", args.rotation_stale_seconds),
        )
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
