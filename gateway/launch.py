"""Start the SGLang Model Gateway (smg) in front of the GLM-5 replicas, the API key on no command line.

    gateway/launch --discovery-file FILE [-- SMG-FLAGS...]      plain Docker hosts (compose profile gateway)
    gateway/launch --kubernetes NAMESPACE [-- SMG-FLAGS...]     the Kubernetes overlay: pods of this namespace
    gateway/launch ... --dry-run                                print smg's arguments (the key redacted), start nothing

The flags come from entrypoint/glm5.toml's [gateway] (policy, worker health checks that follow the replicas'
readiness rule, ports), then the discovery, then any SMG-FLAGS; smg's own parser (smg.launch_router.
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
import os
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from common.report import INVALID_SETTING, USAGE, Log, Problems
from configuration import settings

LOG = Log("gateway")
SELECTOR = "app.kubernetes.io/name=glm5-serve app.kubernetes.io/component=server"


def smg_argv(values: Mapping[str, Any], args: argparse.Namespace) -> list[str]:
    """smg's arguments, without the key."""
    gw = settings.load_config()["gateway"]
    argv = ["--host", "0.0.0.0", "--port", str(gw["port"]), "--prometheus-port", str(gw["metrics_port"])]
    argv += ["--prometheus-host", "0.0.0.0", "--health-check-port", str(gw["probe_port"])]
    argv += [str(f).format(**values) for f in gw["flags"]]
    if args.discovery_file:
        argv += ["--discovery-provider", "file", "--discovery-file", args.discovery_file]
    elif args.kubernetes:
        # Its own namespace only (without it smg watches every namespace and needs cluster-wide rights).
        argv += ["--discovery-provider", "kubernetes", "--service-discovery-namespace", args.kubernetes]
        argv += ["--selector", *SELECTOR.split(), "--service-discovery-port", str(values["port"])]
    return argv + args.smg_flags


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="gateway/launch", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--discovery-file", help='the replicas: {"version": 1, "workers": [{"id", "url"}]}')
    where.add_argument("--kubernetes", metavar="NAMESPACE", help="discover the server pods of this namespace")
    parser.add_argument(
        "--dry-run", action="store_true", help="print smg's arguments (key redacted) and stop"
    )
    parser.add_argument("smg_flags", nargs="*", help="more smg flags, after --")
    args = parser.parse_args(argv)
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
    launch_router(router_args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
