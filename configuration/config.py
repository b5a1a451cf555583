"""The effective launch configuration: glm5.toml's flags and environment under the resolved settings
(configuration/settings.py): the server argv, its environment and the graph counts SGLang will capture."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.report import Problem, Problems
from configuration import compile_jobs, layout, settings
from configuration.batch_sizes import prefill_capture_sizes, rank_decode_sizes
from configuration.state import SERVER_CONFIG

SERVER_PROGRAM = ("python3", "-m", "sglang.launch_server")
ALIASES = Path(__file__).resolve().parent / "sglang_aliases.json"
IPC_SWITCH = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"  # srt/environ.py:1539: GLM5_ALLREDUCE sets it (launch)
CONFIG_FLAG = "--config"  # sglang 0.5.23 reads options from a YAML file (utils/server_args_config_parser.py)


def generated_key() -> str:
    """A secret for a flag whose setting is unset and that must not stay open (glm5.toml `generated`): 48 hex digits
    of a CSPRNG, held by no one, printed nowhere (the relay masks every secret option)."""
    return secrets.token_hex(24)


@dataclass
class Effective:
    values: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    decode_sizes: list[int]
    prefill_sizes: list[int]
    prefill_chunk: int  # a rank's prefill chunk, tokens a step (prefill_chunk())
    layout: layout.Layout
    overrides: dict[str, str] = field(default_factory=dict)
    # Options that must not be on any command line (the API key): written to the private server config file
    # that `--config` names (configuration/state.py), keyed by flag name without the dashes.
    secret_options: dict[str, str] = field(default_factory=dict)

    def public_argv(self) -> list[str]:
        """The argv without `--config FILE`, for parsing before the file exists (preflight)."""
        out, skip = [], False
        for arg in self.argv:
            if skip:
                skip = False
            elif arg == CONFIG_FLAG and self.secret_options:
                skip = True
            else:
                out.append(arg)
        return out

    def secrets(self) -> list[str]:
        return [v for v in self.secret_options.values() if v]

    def server_env(self, environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """glm5.toml's [[env]] values are defaults: the operator's environment wins. Returns the effective
        value of each and where it came from ("glm5.toml" or "environment")."""
        values, sources = {}, {}
        for name, default in self.env.items():
            mine = environ.get(name)
            values[name], sources[name] = (
                (mine, "environment") if mine is not None else (default, "glm5.toml")
            )
        return values, sources

    def state(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """The configuration's part of the start record (configuration/start.py): the effective configuration of this
        run under `environ`."""
        env, env_from = self.server_env(environ)
        return {
            "argv": self.argv,  # holds no secret: those are in the server's config file
            "env": env,
            "env_from": env_from,
            "overrides": self.overrides,
            "served_model_name": self.values["served_model_name"],
            "port": self.values["port"],
            "log_dir": self.values["log_dir"],
            "cache_dir": self.values["cache_dir"],
            "build_id": self.values["build_id"],
            "cache_root": self.values["cache_root"],
            "health_timeout_seconds": self.values["health_timeout_seconds"],
            "stall_seconds": self.values["stall_seconds"],
            "autotune_stall_seconds": self.values["autotune_stall_seconds"],
            "accept_partial_capture": self.values["accept_partial_capture"],
            "verify": self.values["verify"],
            "on_failure": self.values["on_failure"],
            "decode_batch_sizes": self.decode_sizes,
            "decode_expected": len(self.decode_sizes),
            "prefill_token_sizes": self.prefill_sizes,
            "prefill_expected": len(self.prefill_sizes),
            "prefill_chunk": self.prefill_chunk,
            "speculative": self.values["speculative"],
            "profile": self.layout.profile,
            "attn_dp_size": self.layout.attn_dp_size,
        }


SGLANG_HEALTH_WAIT = ("SGLANG_HEALTH_CHECK_TIMEOUT", 20)  # entrypoints/http_server.py: /health's own wait


def check_health_timeout(timeout: float, environ: Mapping[str, str]) -> list[Problem]:
    """The probes must wait longer than the server's /health does: a probe that gives up first leaves the
    server to mark itself unhealthy (for every caller, and a SIGTERM then skips the drain) while the probe
    only saw a timeout."""
    name, default = SGLANG_HEALTH_WAIT
    raw = environ.get(name, "").strip() or str(default)
    try:
        server_wait = int(raw)  # http_server.py reads it with int()
    except ValueError:
        return [
            Problem(
                name, f"{raw!r} is not a whole number (SGLang reads it with int())", "use seconds, e.g. 20"
            )
        ]
    if timeout <= server_wait:
        return [
            Problem(
                "GLM5_HEALTH_TIMEOUT",
                f"{timeout:g} s is not above the server's own /health wait ({name}={server_wait})",
                f"set GLM5_HEALTH_TIMEOUT above {server_wait} (and below the probe command's timeout), or lower {name}",
            )
        ]
    return []


def sglang_aliases() -> list[list[str]]:
    """The option strings sglang's server parser gives one destination (configuration/sglang_aliases.json)."""
    aliases: list[list[str]] = json.loads(ALIASES.read_text())["aliases"]
    return aliases


def owner(setting: settings.Setting) -> str:
    """How to set a flag a setting owns: the setting, or for one fixed at its rendered value (GLM5_PORT, refused at
    any other), glm5.toml."""
    if setting.rendered:
        return f"glm5.toml's value of {setting.name}, rendered into {setting.rendered} (change it there, then ci/render)"
    return f"{setting.name} or {setting.name}_FILE" if setting.kind == "secret" else setting.name


def owned_names(config: Mapping[str, Any]) -> dict[str, str]:
    """Flags the configuration sets, by the name it writes, with what sets them."""
    owned = {s.flag: owner(s) for s in settings.declarations(config).values() if s.flag}
    owned[CONFIG_FLAG] = "nothing: the kit writes the server's config file (it holds the API key)"
    owned |= {f["name"]: f["owned_by"] for f in config["flag"] if "owned_by" in f}
    return owned


def owned_aliases(owned: Mapping[str, str]) -> dict[str, str]:
    """sglang's other names of the owned flags (--tensor-parallel-size: --tp-size), each with the owned one."""
    found: dict[str, str] = {}
    for group in sglang_aliases():
        flag = next((f for f in group if f in owned), None)
        found |= {alias: flag for alias in group if flag is not None and alias not in owned}
    return found


def owned_flags(config: Mapping[str, Any]) -> dict[str, str]:
    """Flags the configuration sets, by any of sglang's names, with what sets them: GLM5_EXTRA_ARGS may not."""
    owned = owned_names(config)
    return owned | {alias: owned[flag] for alias, flag in owned_aliases(owned).items()}


def check_extra_args(args: list[str], config: Mapping[str, Any]) -> list[Problem]:
    """Refuse removed, owned and refused flags, also by a prefix: sglang's argparse takes any unique one."""
    removed, owned, refused = config["removed_flag"], owned_flags(config), config["refused_flag"]
    aliases = owned_aliases(owned_names(config))
    problems = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        if flag in removed:
            problems.append(Problem("GLM5_EXTRA_ARGS", f"{flag} is rejected by sglang 0.5.23", removed[flag]))
        elif full := next((f for f in refused if f.startswith(flag)), None):
            problems.append(Problem("GLM5_EXTRA_ARGS", f"{flag} is not supported ({full})", refused[full]))
        elif full := flag if flag in owned else next((f for f in owned if f.startswith(flag)), None):
            shown = flag if flag == full else f"{flag} (as {full})"
            shown += f", sglang's other name of {aliases[full]}," if full in aliases else ""
            problems.append(
                Problem("GLM5_EXTRA_ARGS", f"{shown} is set by the configuration", f"use {owned[full]}")
            )
    return problems


def resolve(environ: Mapping[str, str], config: Mapping[str, Any] | None = None) -> Effective:
    """The effective configuration under `environ`; raises report.Problems naming every bad setting."""
    config = config or settings.load_config()
    values = settings.resolve(environ, config)
    decls = settings.declarations(config)
    problems = check_extra_args(values["extra_args"], config)
    problems += check_health_timeout(values["health_timeout_seconds"], environ)
    problems += compile_jobs.check(environ)
    if environ.get(IPC_SWITCH, "").strip():
        problems.append(
            Problem(
                IPC_SWITCH,
                "is the kit's to set: GLM5_ALLREDUCE decides it with the doctor's check of this box",
                "unset it; set GLM5_ALLREDUCE=auto (after `doctor --ipc`), nccl or pcie_ipc",
            )
        )
    try:
        chosen = layout.resolve(values, config, bool(environ.get("GLM5_MEM_FRACTION_STATIC", "").strip()))
    except Problem as problem:
        problems.append(problem)
        chosen = layout.Layout("latency", 1, (), "", "latency")
    if chosen.mem_fraction is not None:  # the DP graphs' room (layout.py): what --mem-fraction-static renders
        values["mem_fraction_static"] = chosen.mem_fraction
    argv = list(SERVER_PROGRAM)
    secret_options: dict[str, str] = {}
    for flag in config["flag"]:
        if "setting" in flag:  # the setting's value, left out while unset; a secret only in the config file
            setting = decls[flag["setting"]]
            value = values[setting.key]
            if (value is None or value == "") and flag.get("generated") and setting.kind == "secret":
                value = generated_key()  # unset: a key nobody is given (each resolution its own)
            if value is None or value == "":
                continue
            if setting.kind == "secret":
                secret_options[flag["name"].removeprefix("--")] = str(value)
            else:
                argv += [flag["name"], str(value)]
            continue
        if "value" not in flag:
            argv.append(flag["name"])
            continue
        keys = [k for k in values if "{" + k + "}" in flag["value"]]
        if any(values[k] is None for k in keys):
            if not flag.get("optional"):
                problems.append(
                    Problem(
                        f"glm5.toml [[flag]] {flag['name']}", f"{flag['value']} is unset", "give it a value"
                    )
                )
            continue
        if flag.get("secret"):
            secret_options[flag["name"].removeprefix("--")] = str(flag["value"]).format(**values)
        else:
            argv += [flag["name"], str(flag["value"]).format(**values)]
    for setting in decls.values():
        argv += setting.flags.get(str(values[setting.key]), [])
    argv += chosen.flags()
    argv += values["extra_args"]
    if secret_options:
        argv += [CONFIG_FLAG, str(Path(values["state_dir"]) / SERVER_CONFIG)]
    if problems:
        raise Problems(problems)
    values["build_id"] = build_id(values["home"])
    values["cache_root"] = f"{values['cache_dir']}/build-{values['build_id']}"
    env = {e["name"]: str(e["value"]).format(**values) for e in config["env"] if "value" in e}
    groups, tp = chosen.attn_dp_size, int(values["gpu_count"])
    # The largest prefill shape: 0.5.23 caps it at min(8192, chunk) (srt/arg_groups/memory_hook.py:233-237), the
    # chunk a rank's (prefill_chunk). tests/test_launch.py holds this to 0.5.23's own resolution, and preflight holds
    # each start to it (entrypoint/resolution.py).
    chunk = prefill_chunk(argv, groups)
    prefill_max = min(PREFILL_SHAPE_CAP, chunk)
    applied = {
        s.name: environ[s.name].strip()
        for s in decls.values()
        if s.where == "container" and s.kind != "secret" and environ.get(s.name, "").strip()
    }
    return Effective(
        values,
        argv,
        env,
        rank_decode_sizes(values, groups),
        prefill_capture_sizes(prefill_max, groups, tp),
        chunk,
        chosen,
        applied,
        secret_options,
    )


BUILD_ID_FILE = "BUILD-ID"  # written by the image build: a digest of what compiled kernels depend on
BUILD_ID_FORM = re.compile(r"[0-9a-f]{16}")


def build_id(home: str) -> str:
    """The image build's identity (its BUILD-ID file), or "dev" outside an image: JIT caches are keyed by it."""
    try:
        found = (Path(home) / BUILD_ID_FILE).read_text().strip()
    except OSError:
        return "dev"
    return found if BUILD_ID_FORM.fullmatch(found) else "dev"


PREFILL_SHAPE_CAP = 8192  # the largest prefill shape 0.5.23 captures (srt/arg_groups/memory_hook.py:233-237)


def prefill_chunk(argv: list[str], attn_dp_size: int) -> int:
    """A rank's prefill chunk: --chunked-prefill-size (0.5.23's default 8192 when unset), divided under attention DP
    by the groups, to which 0.5.23 also re-clamps the prefill shapes (srt/arg_groups/parallel_hook.py:327-360): at
    D=4, 8192 -> 2048, 42 shapes."""
    return int(flag_value(argv, "--chunked-prefill-size") or 8192) // attn_dp_size


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[i + 1]
    return None


def reference(cfg: Mapping[str, Any]) -> str:
    """The configuration reference (markdown): every flag and environment variable with its reason, then
    every setting. `entrypoint/launch --reference` prints it; ci/render puts it in the README."""
    values = resolve({}, cfg).values
    decls = settings.declarations(cfg)
    lines = ["| flag | value | why |", "|---|---|---|"]
    for flag in cfg["flag"]:
        if "setting" in flag:
            found = values[decls[flag["setting"]].key]
            shown = f"({flag['setting']})" if found is None or found == "" else str(found)
        else:
            shown = str(flag.get("value", "")).format(**values)
        lines.append(f"| `{flag['name']}` | `{shown}` | {flag['reason']} |")
    lines += ["", "| environment | value | why |", "|---|---|---|"]
    for env in cfg["env"]:
        lines.append(
            f"| `{env['name']}` | `{env.get('value', env.get('shown', '(image)'))}` | {env['reason']} |"
        )
    return "\n".join(lines) + "\n\n" + settings.reference(cfg)
