#!/usr/bin/env python3
"""GLM5_SERVER_PROGRAM for the real-server tests: runs the REAL `python -m sglang.launch_server` (0.5.23, from
.venv-sglang-cpu) on the CPU, serving the tiny Llama of tests/helpers/tiny_llama.py, under the kit's command line.

    GLM5_SERVER_PROGRAM="python3 tests/helpers/sglang_cpu_server.py"   SGLANG_CPU_MODEL=FOLDER (the tiny model)

entrypoint/launch runs it with the kit's flags (entrypoint/glm5.toml, the settings' flags, GLM5_EXTRA_ARGS, then
`--config FILE` when an API key is set). Each flag is classified in FLAGS: kept, given a CPU value, or dropped
because a CPU server cannot take it (GLM-5's GPU kernels and sizes); a flag (or --config key) not in FLAGS is
refused (exit 2, naming it), so a new kit flag is decided here rather than silently dropped. Then it adds what
serving on the CPU needs (ADDED: measured, see each reason), sets SGLANG_USE_CPU_ENGINE=1 and the import-time
stand-ins (tests/stubs/sglang_cpu), and execs the server: its PID is the server's, so the kit's signals reach
SGLang itself.

SGLANG_CPU_MAX_TOTAL_TOKENS (default 4096) sizes the KV pool.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-sglang-cpu"
STUBS = ROOT / "tests" / "stubs" / "sglang_cpu"
REFUSED = 2


@dataclass(frozen=True)
class Flag:
    action: str  # keep, cpu (its value replaced: cpu_value, or the model folder), drop
    takes_value: bool
    why: str = ""
    cpu_value: str = ""


DROP_GPU = "GLM-5's GPU kernels or sizes: the tiny Llama on the CPU cannot take it"
FLAGS = {
    "--model-path": Flag("cpu", True, "the tiny Llama (SGLANG_CPU_MODEL)"),
    "--served-model-name": Flag("keep", True),
    "--host": Flag("cpu", True, "loopback: a test server is never reachable from outside", "127.0.0.1"),
    "--port": Flag("keep", True),
    "--tp-size": Flag("drop", True, "one CPU process; TP8 needs 8 GPUs"),
    "--quantization": Flag("drop", True, "the tiny model is bf16, not a ModelOpt NVFP4 checkpoint"),
    "--kv-cache-dtype": Flag("drop", True, DROP_GPU),
    "--attention-backend": Flag("drop", True, "DSA is CUDA-only: ADDED states torch_native"),
    "--dsa-prefill-backend": Flag("drop", True, DROP_GPU),
    "--dsa-decode-backend": Flag("drop", True, DROP_GPU),
    "--moe-runner-backend": Flag("drop", True, DROP_GPU),
    "--fp4-gemm-backend": Flag("drop", True, DROP_GPU),
    "--mem-fraction-static": Flag(
        "drop", True, "of GPU memory; on the CPU --max-total-tokens sizes the pool"
    ),
    "--chunked-prefill-size": Flag("keep", True),
    "--cuda-graph-backend-decode": Flag("drop", True, "no CUDA graphs on the CPU"),
    "--cuda-graph-backend-prefill": Flag("drop", True, "no CUDA graphs on the CPU"),
    "--cuda-graph-max-bs-decode": Flag("drop", True, "no CUDA graphs on the CPU"),
    "--disable-custom-all-reduce": Flag("keep", False),
    "--reasoning-parser": Flag("keep", True),
    "--tool-call-parser": Flag("keep", True),
    "--enable-metrics": Flag("keep", False),
    "--max-running-requests": Flag("keep", True),
    "--config": Flag("keep", True),  # the kit's private file: its keys are classified too (config_keys)
    "--api-key": Flag("keep", True),  # only ever inside --config
    "--admin-api-key": Flag("keep", True),  # only ever inside --config (GLM5_ADMIN_API_KEY, or a random one)
}
ADDED = [
    ("--device", "cpu"),
    # without AMX the CPU has torch_native alone: the default, intel_amx, falls back to it with a warning
    ("--attention-backend", "torch_native"),
    # without it the KV pool takes 72% of the machine's memory (15.5 GB of 24: #tokens 64880591)
    ("--max-total-tokens", os.environ.get("SGLANG_CPU_MAX_TOTAL_TOKENS", "4096")),
    # without it the idle scheduler spins a core (100.7% CPU, 0.9% with it)
    ("--sleep-on-idle", ""),
]


class Refused(Exception):
    pass


def config_keys(file: str) -> list[str]:
    """The option names in the kit's server config file (configuration/state.py: `key: "value"` lines)."""
    try:
        lines = Path(file).read_text().splitlines()
    except OSError as err:
        raise Refused(f"--config {file}: cannot read it ({err.strerror})") from err
    return [line.split(":", 1)[0].strip() for line in lines if line.strip()]


def classify(argv: list[str], model: str) -> list[str]:
    """The server's argv for the CPU from the kit's: raises Refused naming a flag not in FLAGS."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        name, eq, inline = argv[i].partition("=")
        flag = FLAGS.get(name)
        if flag is None:
            raise Refused(
                f"{name}: not classified for the CPU server; decide it in FLAGS of {Path(__file__).name}"
            )
        value = inline if eq else None
        if flag.takes_value and value is None:
            if i + 1 >= len(argv):
                raise Refused(f"{name}: its value is missing")
            i += 1
            value = argv[i]
        i += 1
        if name == "--config":
            for key in config_keys(str(value)):
                if f"--{key}" not in FLAGS or FLAGS[f"--{key}"].action != "keep":
                    raise Refused(f"--config {value}: option {key!r} is not classified for the CPU server")
        if flag.action == "drop":
            continue
        if flag.action == "cpu":
            value = model if name == "--model-path" else flag.cpu_value
        out += [name] if value is None else [name, value]
    for name, value in ADDED:
        out += [name, value] if value else [name]
    return out


def server_env(environ: dict[str, str]) -> dict[str, str]:
    path = [str(STUBS), *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    return environ | {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": os.pathsep.join(path)}


def main() -> int:
    model = os.environ.get("SGLANG_CPU_MODEL", "")
    if not Path(model, "config.json").is_file():
        print(
            f"sglang_cpu_server: SGLANG_CPU_MODEL={model!r} is no model folder; "
            "fix: write one with tests/helpers/tiny_llama.py",
            file=sys.stderr,
        )
        return REFUSED
    try:
        args = classify(sys.argv[1:], model)
    except Refused as err:
        print(f"sglang_cpu_server: refused: {err}", file=sys.stderr)
        return REFUSED
    python = VENV / "bin" / "python"
    argv = [str(python), "-m", "sglang.launch_server", *args]
    print(f"sglang_cpu_server: {' '.join(argv)}", flush=True)
    os.execve(python, argv, server_env(dict(os.environ)))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
