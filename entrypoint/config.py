"""Load glm5.toml, apply the documented GLM5_* overrides (validated, all errors collected) and
render the effective launch configuration: server argv, environment, expected graph counts."""

from __future__ import annotations

import math
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch_sizes import decode_batch_sizes, effective_decode_max_bs, prefill_token_sizes

CONFIG_PATH = Path(__file__).resolve().parent / "glm5.toml"
SERVER_PROGRAM = ("python3", "-m", "sglang.launch_server")
# Flags that 0.5.23 rejects (removed or ambiguous): refused in GLM5_EXTRA_ARGS with the replacement.
REMOVED_FLAGS = {
    "--enable-piecewise-cuda-graph": "prefill graphs are --cuda-graph-backend-prefill breakable (baked)",
    "--piecewise-cuda-graph-max-tokens": "use --cuda-graph-max-bs-prefill",
    "--piecewise-cuda-graph-tokens": "use --cuda-graph-bs-prefill",
    "--piecewise-cuda-graph-compiler": "breakable prefill graphs use no torch.compile",
    "--disable-piecewise-cuda-graph": "use --cuda-graph-backend-prefill disabled",
    "--cuda-graph-max-bs": "ambiguous in 0.5.23: set GLM5_CUDA_GRAPH_MAX_BS_DECODE",
    "--cuda-graph-bs": "ambiguous in 0.5.23: use --cuda-graph-bs-decode or --cuda-graph-bs-prefill",
}
# Flags the configuration owns: set them through their override, not GLM5_EXTRA_ARGS.
OWNED_BY_OVERRIDE = {
    "--model-path": "GLM5_MODEL_DIR",
    "--port": "GLM5_PORT",
    "--served-model-name": "GLM5_SERVED_MODEL_NAME",
    "--mem-fraction-static": "GLM5_MEM_FRACTION_STATIC",
    "--kv-cache-dtype": "GLM5_KV_CACHE_DTYPE",
    "--cuda-graph-max-bs-decode": "GLM5_CUDA_GRAPH_MAX_BS_DECODE",
    "--max-running-requests": "GLM5_MAX_RUNNING_REQUESTS",
    "--speculative-algorithm": "GLM5_SPECULATIVE",
    "--tp-size": "nothing (the image is built for TP8 on 8 GPUs)",
    "--api-key": "GLM5_API_KEY or GLM5_API_KEY_FILE",
}
SPECULATIVE_FLAGS = {
    "mtp": [
        ("--speculative-algorithm", "EAGLE"),
        ("--speculative-num-steps", "3"),
        ("--speculative-eagle-topk", "1"),
        ("--speculative-num-draft-tokens", "4"),
    ]
}
NAME_FORM = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


class ConfigError(Exception):
    """Invalid overrides; each message names the variable and the fix."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass
class Effective:
    values: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    decode_sizes: list[int]
    prefill_sizes: list[int]
    overrides: dict[str, str] = field(default_factory=dict)
    secret_flags: tuple[str, ...] = ("--api-key",)

    def redacted_argv(self) -> list[str]:
        out = list(self.argv)
        for i, arg in enumerate(out[:-1]):
            if arg in self.secret_flags:
                out[i + 1] = "<redacted>"
        return out

    def state(self) -> dict[str, Any]:
        """What the healthcheck and people read: the effective configuration of this run."""
        return {
            "argv": self.redacted_argv(),
            "env": self.env,
            "overrides": self.overrides,
            "served_model_name": self.values["served_model_name"],
            "port": self.values["port"],
            "decode_batch_sizes": self.decode_sizes,
            "decode_expected": len(self.decode_sizes),
            "prefill_token_sizes": self.prefill_sizes,
            "prefill_expected": len(self.prefill_sizes),
            "speculative": self.values["speculative"],
        }


def load(path: Path = CONFIG_PATH) -> dict[str, Any]:
    with path.open("rb") as fh:
        return tomllib.load(fh)


def parse_override(name: str, spec: Mapping[str, Any], raw: str) -> tuple[Any, str | None]:
    """Return (value, error). Errors name the variable, the value and the expected form."""
    kind = spec["kind"]
    if kind == "int":
        if not re.fullmatch(r"[0-9]+", raw):
            return None, f"{name}={raw!r}: expected a whole number in {spec['min']}..{spec['max']}"
        value: Any = int(raw)
    elif kind == "float":
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if math.isnan(value):
            return None, f"{name}={raw!r}: expected a number in {spec['min']}..{spec['max']}, e.g. 0.80"
    elif kind == "choice":
        if raw not in spec["choices"]:
            return None, f"{name}={raw!r}: expected one of {', '.join(spec['choices'])}"
        return raw, None
    elif kind == "path":
        if not raw.startswith("/"):
            return None, f"{name}={raw!r}: expected an absolute path inside the container"
        return raw.rstrip("/") or "/", None
    elif kind == "name":
        if not NAME_FORM.fullmatch(raw):
            return None, f"{name}={raw!r}: expected letters, digits and . _ / - (at most 128)"
        return raw, None
    elif kind == "args":
        try:
            return shlex.split(raw), None
        except ValueError as err:
            return None, f"{name}: cannot split {raw!r} as shell words ({err}); fix the quoting"
    else:
        raise AssertionError(f"glm5.toml: unknown override kind {kind!r} for {name}")
    if not spec["min"] <= value <= spec["max"]:
        return None, f"{name}={raw!r}: out of range {spec['min']}..{spec['max']}"
    return value, None


def check_extra_args(args: list[str]) -> list[str]:
    errors = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in REMOVED_FLAGS:
            errors.append(f"GLM5_EXTRA_ARGS: {flag} is rejected by sglang 0.5.23: {REMOVED_FLAGS[flag]}")
        elif flag in OWNED_BY_OVERRIDE:
            errors.append(
                f"GLM5_EXTRA_ARGS: {flag} is set by the configuration: use {OWNED_BY_OVERRIDE[flag]}"
            )
    return errors


def resolve(environ: Mapping[str, str], config: dict[str, Any] | None = None) -> Effective:
    config = config or load()
    values: dict[str, Any] = dict(config["deployment"])
    values.update(speculative="off", max_running_requests=None, extra_args=[])
    errors: list[str] = []
    applied: dict[str, str] = {}
    for name, spec in config["override"].items():
        if "default" in spec:
            values[spec["key"]], _ = parse_override(name, spec, spec["default"])
        raw = environ.get(name)
        if raw is None or raw.strip() == "":
            continue
        value, error = parse_override(name, spec, raw.strip())
        if error:
            errors.append(error)
        else:
            values[spec["key"]] = value
            applied[name] = raw.strip()
    errors += check_extra_args(values["extra_args"])
    api_key, key_errors = read_secret(environ, "GLM5_API_KEY")
    errors += key_errors
    if errors:
        raise ConfigError(errors)
    backend = "flashinfer_sparse_mla" if values["kv_cache_dtype"] == "fp8_e4m3" else "tilelang"
    values.setdefault("dsa_prefill_backend", backend)
    values.setdefault("dsa_decode_backend", backend)
    argv = render_argv(config, values, api_key)
    env = {e["name"]: e["value"] for e in config["env"] if "value" in e}
    spec = values["speculative"] != "off"
    max_bs = effective_decode_max_bs(values["cuda_graph_max_bs_decode"], spec, values["max_running_requests"])
    prefill_max = min(8192, int(flag_value(argv, "--chunked-prefill-size") or 8192))
    return Effective(
        values, argv, env, decode_batch_sizes(max_bs, spec), prefill_token_sizes(prefill_max), applied
    )


def render_argv(config: dict[str, Any], values: dict[str, Any], api_key: str | None) -> list[str]:
    argv = list(SERVER_PROGRAM)
    for flag in config["flag"]:
        argv.append(flag["name"])
        if "value" in flag:
            argv.append(str(flag["value"]).format(**values))
    for name, value in SPECULATIVE_FLAGS.get(values["speculative"], []):
        argv += [name, value]
    if values["max_running_requests"] is not None:
        argv += ["--max-running-requests", str(values["max_running_requests"])]
    if api_key:
        argv += ["--api-key", api_key]
    return argv + list(values["extra_args"])


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == flag:
            return argv[i + 1]
    return None


def read_secret(environ: Mapping[str, str], name: str) -> tuple[str | None, list[str]]:
    """VAR or VAR_FILE (docker/k8s secrets), never both; an unreadable file is an error."""
    direct, file_var = environ.get(name), environ.get(f"{name}_FILE")
    if direct and file_var:
        return None, [f"{name} and {name}_FILE are both set: keep one (prefer {name}_FILE for secrets)"]
    if file_var:
        try:
            value = Path(file_var).read_text().strip()
        except OSError as err:
            return None, [f"{name}_FILE={file_var}: cannot read it ({err.strerror}); mount the secret there"]
        if not value:
            return None, [f"{name}_FILE={file_var}: the file is empty; put the secret in it"]
        return value, []
    return (direct or None), []
