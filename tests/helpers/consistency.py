"""Cross-checks between entrypoint/glm5.toml, the Dockerfile, docker-compose.yml and k8s/: one list of drifts."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml

DURATION = re.compile(r"^(\d+)s$")


def dockerfile_facts(text: str) -> dict[str, Any]:
    joined = re.sub(r"\\\n\s*", " ", text)
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", joined, re.M))
    env: dict[str, str] = {}
    for block in re.findall(r"^ENV (.+)$", joined, re.M):
        env.update(dict(re.findall(r"(\w+)=(\S+)", block)))
    health = re.search(r"^HEALTHCHECK (.*?) CMD (\[.*\])", joined, re.M)
    assert health, "Dockerfile has no exec-form HEALTHCHECK"
    options = dict(re.findall(r"--([\w-]+)=(\S+)", health.group(1)))
    return {
        "args": args,
        "env": {
            k: v.replace("${CUDA_MAJOR_MINOR}", args.get("CUDA_MAJOR_MINOR", "")) for k, v in env.items()
        },
        "expose": re.findall(r"^EXPOSE (\d+)", joined, re.M),
        "health_options": options,
        "health_cmd": yaml.safe_load(health.group(2)),
        "user": re.findall(r"^USER (\S+)", joined, re.M),
        "stopsignal": re.findall(r"^STOPSIGNAL (\S+)", joined, re.M),
    }


def seconds(value: str | int) -> int:
    if isinstance(value, int):
        return value
    match = DURATION.match(value)
    assert match, f"expected a duration in seconds like 150s, got {value!r}"
    return int(match.group(1))


def check(root: Path, overrides: dict[str, str] | None = None) -> list[str]:
    """Return drift messages; overrides replace a file's text (to prove a drift is caught)."""
    overrides = overrides or {}

    def read(rel: str) -> str:
        return overrides.get(rel) or (root / rel).read_text()

    cfg = tomllib.loads(read("entrypoint/glm5.toml"))
    dep = cfg["deployment"]
    docker = dockerfile_facts(read("Dockerfile"))
    compose = yaml.safe_load(read("docker-compose.yml"))["services"]["glm5"]
    pod = yaml.safe_load(read("k8s/pod.yaml"))
    service = yaml.safe_load(read("k8s/service.yaml"))
    container = pod["spec"]["containers"][0]
    errors: list[str] = []

    def same(what: str, **values: Any) -> None:
        if len({repr(v) for v in values.values()}) > 1:
            errors.append(f"{what} differs: " + ", ".join(f"{k}={v!r}" for k, v in values.items()))

    port = dep["port"]
    same("image", toml=dep["image"], compose=compose["image"], pod=container["image"])
    same(
        "port",
        toml=port,
        dockerfile_expose=int(docker["expose"][0]),
        dockerfile_env=int(docker["env"]["GLM5_PORT"]),
        compose=int(compose["ports"][0].rsplit(":", 1)[1]),
        pod=container["ports"][0]["containerPort"],
        service=service["spec"]["ports"][0]["port"],
    )
    same("log dir", toml=dep["log_dir"], dockerfile=docker["env"]["GLM5_LOG_DIR"])
    same("state dir", toml=dep["state_dir"], dockerfile=docker["env"]["GLM5_STATE_DIR"])
    same(
        "health timeout",
        toml=str(dep["health_timeout_seconds"]),
        dockerfile=docker["env"]["GLM5_HEALTH_TIMEOUT"],
    )
    toml_env = {e["name"]: e.get("value") for e in cfg["env"]}
    same("CUDA_HOME", toml=toml_env["CUDA_HOME"], dockerfile=docker["env"]["CUDA_HOME"])
    same(
        "FLASHINFER_CUDA_VERSION",
        dockerfile_arg=docker["args"]["CUDA_MAJOR_MINOR"],
        dockerfile_env=docker["env"]["FLASHINFER_CUDA_VERSION"],
    )
    model_mounts = [
        v.rsplit(":", 1)[1] for v in compose["volumes"] if v.rsplit(":", 1)[1].startswith("/models")
    ]
    pod_model = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "weights"]
    same(
        "model folder",
        toml=dep["model_dir"],
        compose=model_mounts[0] if model_mounts else None,
        pod=pod_model[0] if pod_model else None,
    )
    gpus = compose["deploy"]["resources"]["reservations"]["devices"][0]
    same(
        "GPU count",
        toml=dep["gpu_count"],
        compose=len(gpus["device_ids"]),
        pod=container["resources"]["limits"]["nvidia.com/gpu"],
    )
    same("GPU ids", compose=gpus["device_ids"], expected=[str(i) for i in range(dep["gpu_count"])])

    probe = docker["health_cmd"]
    same(
        "readiness probe",
        dockerfile=probe,
        compose=compose["healthcheck"]["test"][1:],
        pod_startup=container["startupProbe"]["exec"]["command"],
        pod_readiness=container["readinessProbe"]["exec"]["command"],
    )
    live = container["livenessProbe"]["exec"]["command"]
    if "--live" not in live or live[0] != probe[0]:
        errors.append(f"liveness probe must be the healthcheck with --live: {live}")
    same(
        "start period",
        toml=dep["startup_budget_seconds"],
        dockerfile=seconds(docker["health_options"]["start-period"]),
        compose=seconds(compose["healthcheck"]["start_period"]),
    )
    startup = container["startupProbe"]
    if startup["periodSeconds"] * startup["failureThreshold"] < max(dep["startup_budget_seconds"], 1800):
        errors.append(
            "pod startupProbe budget (periodSeconds x failureThreshold) is under the startup budget / 30 min"
        )
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        if container[name]["timeoutSeconds"] < 5:
            errors.append(f"pod {name} timeoutSeconds under 5 s: /health takes over 1 s")
    if seconds(compose["healthcheck"]["timeout"]) < 5 or seconds(docker["health_options"]["timeout"]) < 5:
        errors.append("healthcheck timeout under 5 s")

    drain = dep["drain_seconds"]
    stop_grace = seconds(compose["stop_grace_period"])
    same("stop grace", toml=dep["stop_grace_seconds"], compose=stop_grace)
    if stop_grace <= drain:
        errors.append(f"compose stop_grace_period {stop_grace}s must exceed the drain bound {drain}s")
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_stop_s = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
    tgps = pod["spec"]["terminationGracePeriodSeconds"]
    same("termination grace", toml=dep["termination_grace_seconds"], pod=tgps)
    if tgps <= pre_stop_s + drain:
        errors.append(
            f"terminationGracePeriodSeconds {tgps} must exceed preStop {pre_stop_s}s + drain {drain}s"
        )
    same("stop signal", dockerfile=docker["stopsignal"][0], compose=compose["stop_signal"])
    same(
        "user",
        dockerfile_uid=docker["args"]["GLM5_UID"],
        pod=str(pod["spec"]["securityContext"]["runAsUser"]),
    )
    if docker["user"] != ["${GLM5_UID}"]:
        errors.append(f"Dockerfile USER should be the ARG GLM5_UID: {docker['user']}")
    ports = compose["ports"][0]
    if not ports.startswith("${GLM5_BIND:-127.0.0.1}:"):
        errors.append(f"compose publishes {ports}: bind to 127.0.0.1 by default")
    key_file = {e["name"]: e.get("value") for e in container.get("env", [])}.get("GLM5_API_KEY_FILE")
    if key_file:
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        holders = [n for n, path in mounts.items() if key_file.startswith(path.rstrip("/") + "/")]
        secret = volumes[holders[0]].get("secret", {}) if holders else {}
        if not secret or secret.get("optional", False):
            errors.append(
                f"GLM5_API_KEY_FILE={key_file} must come from a mounted, non-optional Secret (launch refuses a missing file)"
            )
    entry = shlex.split(container.get("args", ["serve"])[0])
    same("container command", pod=entry, expected=["serve"])
    return errors
