"""Checks run before anything expensive: GPUs, shared memory, the model folder, FlashInfer, the server flags (SGLang's
own resolution of them, and what it settles against what the kit expects: entrypoint/resolution.py).

Each failure is a Problem with its own exit code and a message that names the setting and the
fix. All findings are collected; the process exits with the code of the first one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.report import INVALID_SETTING, Log, Problem
from configuration import config
from entrypoint import doctor, resolution

VERIFY = Path(__file__).resolve().parent.parent / "patches" / "verify"  # the thin executable
ARCHITECTURE = "GlmMoeDsaForCausalLM"

# the doctor's fast checks run here
DOCTOR_CHECKS = (
    "mig",
    "pcie_link",
    "topology",
    "p2p",
    "iommu",
    "power",
    "kernels",
)
# Exit codes, one per kind of failure (README: "Preflight exit codes"); those of the box (10-20) are the doctor's.
MODEL_DIR_MISSING = 30
MODEL_CONFIG = 31
MODEL_ARCHITECTURE = 32
MODEL_QUANTIZATION = 33
MODEL_INDEX = 34
MODEL_SHARDS = 35
MODEL_MTP = 36  # GLM5_SPECULATIVE=mtp, but the checkpoint has no MTP layer
FLASHINFER = 40
SKIP_SETTING = 41  # GLM5_SKIP_PREFLIGHT malformed (glm5.toml: its `code`)
SERVER_FLAGS = 42
# SGLang's resolution settles a rank's captures (chunk, prefill shapes, decode batches) otherwise than the kit
# expects, or what it settled cannot be read
SERVER_CAPTURES = 43
# Every code preflight (launch --prepare) exits with, the first problem's: (codes, what, the fix its message names).
# docs/reference.md's table is rendered from this by ci/render ({NAME}: a value of ci/render.values()), and
# tests/test_preflight.py checks that it holds each exit code of this module and the doctor's, once.
EXIT_CODES: tuple[tuple[tuple[int, ...], str, str], ...] = (
    ((INVALID_SETTING,), "a setting is invalid, unknown or removed", "the variable and its expected form"),
    ((doctor.NVIDIA_SMI_MISSING, doctor.NVIDIA_SMI_FAILED, doctor.GPU_QUERY_UNREADABLE),
     "nvidia-smi missing, failing, or a GPU's row unreadable", "the GPU runtime, the host driver, `nvidia-smi -q`"),
    ((doctor.GPU_COUNT,), "not exactly {gpu_count} GPUs visible (lists index@bus)",
     "pin GPUs 0-{gpu_count_minus_one}, CUDA_VISIBLE_DEVICES unset"),
    ((doctor.GPU_PRODUCT, doctor.GPU_COMPUTE_CAPABILITY, doctor.GPU_MEMORY, doctor.GPU_DRIVER),
     "not an {gpu_product}; compute capability not {compute_capability}; under {min_gpu_memory_mib} MiB; driver "
     "below R{min_driver_major}", "per GPU"),
    ((doctor.GPU_MIG,), "a fast check of the doctor fails (" + ", ".join(DOCTOR_CHECKS) + "): MIG mode on or a MIG "
     "slice visible, say", "the check's own (`nvidia-smi -i N -mig 0`, then a GPU reset or reboot, for MIG)"),
    ((doctor.SHM_TOO_SMALL,), "/dev/shm under {min_shm_gib} GiB, or unreadable",
     "`ipc: host` / `--shm-size` / a Memory emptyDir"),
    ((MODEL_DIR_MISSING, MODEL_CONFIG, MODEL_ARCHITECTURE, MODEL_QUANTIZATION, MODEL_INDEX, MODEL_SHARDS),
     "model folder missing, unreadable or empty; config.json; architecture not " + ARCHITECTURE + "; not ModelOpt "
     "NVFP4; no index; shards missing, empty or `.incomplete`", "the exact `hf download` command"),
    ((MODEL_MTP,), "`GLM5_SPECULATIVE=mtp`, but the checkpoint has no MTP layer (`model.layers.78.*` for GLM-5; "
     "SGLang would skip the draft weights silently)", "unset it, or a checkpoint that has the layer"),
    ((FLASHINFER,), "FlashInfer not patched, or FLASHINFER_CUDA_VERSION malformed or not the image's nvcc",
     "`patches/apply`, the right value"),
    ((SKIP_SETTING,), "`GLM5_SKIP_PREFLIGHT` names an unknown check", "the valid names"),
    ((SERVER_FLAGS,), "sglang refuses the server flags: its parser, or its own argument resolution with the model's "
     "config.json (`resolve_once`, `check_server_args`; `entrypoint/resolve_flags.py`); or sglang cannot be "
     "imported (an incomplete image)", "sglang's reason, naming `GLM5_EXTRA_ARGS` only when it is set"),
    ((SERVER_CAPTURES,), "sglang's resolution of the server flags settles a rank's prefill chunk, prefill shapes or "
     "decode batches otherwise than the kit expects (the counts the healthcheck waits for), or what it settled cannot "
     "be read (`entrypoint/resolution.py`)", "the setting that shapes the list; the kit's expectation "
     "(configuration/config.py) must follow sglang's"),
)  # fmt: skip


def download_hint(values: Mapping[str, Any]) -> str:
    return (
        "download the weights before the start: with compose `docker compose run --rm download` (into "
        f"GLM5_MODEL_HOST_DIR, default {values['model_host_dir']}), or on the host `hf download "
        f"{values['model_repo']} --local-dir <GLM5_MODEL_HOST_DIR>`; on Kubernetes the weights Job "
        "(k8s/base/job-weights.yaml)"
    )


def check_model(values: Mapping[str, Any]) -> list[Problem]:
    model = Path(values["model_dir"])
    if not model.is_dir():
        return [
            Problem(
                "GLM5_MODEL_DIR", f"{model} does not exist: {download_hint(values)}", code=MODEL_DIR_MISSING
            )
        ]
    try:
        empty = not any(model.iterdir())
    except OSError as err:
        return [
            Problem(
                "GLM5_MODEL_DIR",
                f"cannot read {model} ({err.strerror}): the server runs as UID {os.getuid()}",
                "make the folder readable by it (chmod -R a+rX on the host)",
                code=MODEL_DIR_MISSING,
            )
        ]
    if empty:
        return [
            Problem(
                "GLM5_MODEL_HOST_DIR",
                f"{model} is empty (Docker creates an empty folder when the host folder GLM5_MODEL_HOST_DIR does "
                f"not exist; on Kubernetes the weights Job has not filled the volume yet): {download_hint(values)}",
                code=MODEL_DIR_MISSING,
            )
        ]
    findings: list[Problem] = []
    config = read_json(model / "config.json")
    if not isinstance(config, dict):
        return [
            Problem(
                "GLM5_MODEL_DIR",
                f"{model}/config.json is {config}: the folder is not a "
                f"Hugging Face checkpoint, or the download is incomplete; {download_hint(values)}",
                code=MODEL_CONFIG,
            )
        ]
    archs = config.get("architectures") or []
    if ARCHITECTURE not in archs:
        findings.append(
            Problem(
                "GLM5_MODEL_DIR",
                f"{model} holds {archs or 'no architecture'}"
                f", not {ARCHITECTURE}: point GLM5_MODEL_DIR at a GLM-5 checkpoint",
                code=MODEL_ARCHITECTURE,
            )
        )
    if not is_modelopt_nvfp4(model, config):
        findings.append(
            Problem(
                "GLM5_MODEL_DIR",
                f"{model} is not a ModelOpt NVFP4 "
                "checkpoint (no hf_quant_config.json with quant_algo NVFP4, nor such a "
                f"quantization_config): use {values['model_repo']} or another NVFP4 export",
                code=MODEL_QUANTIZATION,
            )
        )
    shards = check_shards(model, values)
    findings += shards
    if not shards:
        findings += check_mtp(
            model, config, read_json(model / "model.safetensors.index.json")["weight_map"], values
        )
    return findings


def check_mtp(
    model: Path, config: Mapping[str, Any], weight_map: Mapping[str, str], values: Mapping[str, Any]
) -> list[Problem]:
    """MTP's draft layer is the checkpoint's layer num_hidden_layers (model.layers.78 for GLM-5): SGLang 0.5.23 loads
    only weights under that prefix into the draft model and skips the rest without a word
    (models/deepseek_common/deepseek_weight_loader.py, nextn_layer_prefix), so without them MTP never fires. A
    separate mtp.safetensors outside the index is added back only for GLM-4 MoE architectures, not GlmMoeDsaForCausalLM
    (model_loader/weight_utils.py maybe_add_mtp_safetensors)."""
    if values["speculative"] != "mtp":
        return []
    layers, nextn = config.get("num_hidden_layers"), config.get("num_nextn_predict_layers")
    prefix = f"model.layers.{layers}."
    if nextn == 1 and any(name.startswith(prefix) for name in weight_map):
        return []
    found = f"num_nextn_predict_layers = {nextn}" if nextn != 1 else f"no weight under {prefix}* in its index"
    return [
        Problem(
            "GLM5_SPECULATIVE",
            f"mtp needs the checkpoint's MTP layer, and {model} has {found}: SGLang would load no draft weights "
            "without a word and MTP would never fire",
            f"unset GLM5_SPECULATIVE, or use a checkpoint whose model.safetensors.index.json lists {prefix}* "
            f"({values['model_repo']} does)",
            code=MODEL_MTP,
        )
    ]


def is_modelopt_nvfp4(model: Path, config: Mapping[str, Any]) -> bool:
    hf_quant = read_json(model / "hf_quant_config.json")
    if isinstance(hf_quant, dict):
        quant = hf_quant.get("quantization") or {}
        producer = (hf_quant.get("producer") or {}).get("name", "modelopt")
        if quant.get("quant_algo") == "NVFP4" and producer == "modelopt":
            return True
    qc = config.get("quantization_config") or {}
    return qc.get("quant_method") == "modelopt" and qc.get("quant_algo") == "NVFP4"


def check_shards(model: Path, values: Mapping[str, Any]) -> list[Problem]:
    index = read_json(model / "model.safetensors.index.json")
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        return [
            Problem(
                "GLM5_MODEL_DIR",
                f"{model}/model.safetensors.index.json is {index}: the "
                f"download is incomplete; resume it ({download_hint(values)})",
                code=MODEL_INDEX,
            )
        ]
    shards = sorted(set(index["weight_map"].values()))
    missing = [s for s in shards if not (model / s).is_file()]
    empty = [s for s in shards if s not in missing and (model / s).stat().st_size == 0]
    partial = sorted(p.name for p in model.glob("**/*.incomplete"))
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of {len(shards)} shards missing ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''})"
        )
    if empty:
        problems.append(f"{len(empty)} empty ({', '.join(empty[:3])})")
    if partial:
        problems.append(f"{len(partial)} unfinished download file(s) ({', '.join(partial[:3])})")
    if problems:
        return [
            Problem(
                "GLM5_MODEL_DIR",
                f"{model}: {'; '.join(problems)}: the download did not "
                f"finish; resume it ({download_hint(values)})",
                code=MODEL_SHARDS,
            )
        ]
    return []


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as err:
        return f"unreadable ({err})"


def check_flashinfer(verify: Path = VERIFY) -> list[Problem]:
    done = subprocess.run(
        [str(verify), "--skip-compile", "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    try:
        result = json.loads(done.stdout)
    except ValueError:
        return [
            Problem(
                "FLASHINFER_CUDA_VERSION",
                f"patches/verify did not run: {done.stderr.strip()[-400:]}",
                code=FLASHINFER,
            )
        ]
    return [
        Problem(verify_setting(c["check"]), c["detail"], code=FLASHINFER)
        for c in result["checks"]
        if not c["ok"]
    ]


def verify_setting(check: str) -> str:
    """What a failed patches/verify check names: the override's setting, or the patched package's install."""
    if check.startswith("override"):
        return "FLASHINFER_CUDA_VERSION"
    return "SGLang" if check.startswith("sglang") else "FlashInfer"


def check_flags(
    server_args: list[str],
    python: str | None = None,
    extra_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    expected: resolution.Captures | None = None,
) -> list[Problem]:
    """Parse and resolve the server flags with sglang's own code, as the server will before it loads anything
    (entrypoint/resolution.py: argparse, resolve_once with the model's config, check_server_args), run by `python`
    (default the server's, server_python) in `environ` (the server's; default this process's)."""
    env = os.environ if environ is None else environ
    python = python or server_python(env)
    return judge(resolution.resolve(server_args, python, env), server_args, python, extra_args, expected)


def server_python(environ: Mapping[str, str]) -> str:
    """The server program's Python: `python3` on the server's PATH (in the image /opt/venv/bin/python3, which runs the
    kit too), else this one."""
    return shutil.which(config.SERVER_PROGRAM[0], path=environ.get("PATH")) or sys.executable


def judge(
    found: resolution.Resolved | resolution.Failed,
    server_args: list[str],
    python: str,
    extra_args: Sequence[str] = (),
    expected: resolution.Captures | None = None,
) -> list[Problem]:
    """The problems of a resolution's answer. A refusal names GLM5_EXTRA_ARGS only when it is set; sglang that cannot
    be imported is the image's fault. With `expected` (the kit's, launch --prepare's), what the resolution settles for a
    rank's captures must be it: the healthcheck waits for the kit's counts, after the weights load."""
    if isinstance(found, resolution.Failed):
        return [failed_problem(found, python, extra_args)]
    if expected is None:
        return []
    return [
        capture_problem(difference, server_args)
        for difference in resolution.differences(expected, found.captures)
    ]


def failed_problem(found: resolution.Failed, python: str, extra_args: Sequence[str]) -> Problem:
    """The problem of a resolution that gave no answer: sglang refused the flags, could not be imported or run, or
    settled something the kit cannot read."""
    setting = "GLM5_EXTRA_ARGS" if extra_args else "the server flags (entrypoint/glm5.toml, GLM5_* settings)"
    if found.kind == "not_run":
        return Problem(
            setting,
            f"resolving the server flags did not finish: {found.reason}",
            "retry; when it repeats, the reason names the cause (the image's Python missing, or killed: the "
            "container's memory)",
            code=SERVER_FLAGS,
        )
    if found.reason.startswith(("ModuleNotFoundError", "ImportError")):
        return Problem(
            "the image",
            f"sglang's argument parser cannot be imported by {python}: {found.reason}",
            "the image is incomplete: rebuild it (ci/build-image checks it), or report it with a support bundle",
            code=SERVER_FLAGS,
        )
    if found.kind == "unreadable":
        return Problem(
            "the server flags (entrypoint/glm5.toml, GLM5_* settings)",
            f"sglang resolved them, but what it settles for the CUDA graph captures cannot be read: {found.reason}",
            "report it with a support bundle; GLM5_SKIP_PREFLIGHT=flags starts without the check (logged)",
            code=SERVER_CAPTURES,
        )
    fix = "fix or remove the flag" if extra_args else "fix the setting or the [[flag]] it names"
    return Problem(
        setting,
        f"sglang refused the server flags: {found.reason}; {fix} (entrypoint/launch --dry-run shows the command)",
        code=SERVER_FLAGS,
    )


def capture_problem(difference: resolution.Difference, server_args: list[str]) -> Problem:
    """One value sglang's resolution settles otherwise than the kit expects, named by the setting that shapes it."""
    groups = int(config.flag_value(server_args, "--attn-dp-size") or 1)
    chunk = config.flag_value(server_args, "--chunked-prefill-size") or "8192 (sglang's default)"
    if difference.what == "decode batches":
        setting = "GLM5_CUDA_GRAPH_MAX_BS_DECODE"
        shaped = (
            f"--cuda-graph-max-bs-decode {config.flag_value(server_args, '--cuda-graph-max-bs-decode')}, "
            f"--max-running-requests {config.flag_value(server_args, '--max-running-requests') or '(unset)'}"
        )
    else:
        setting = "GLM5_PROFILE" if groups > 1 else "--chunked-prefill-size (entrypoint/glm5.toml [[flag]])"
        shaped = f"--chunked-prefill-size {chunk}"
    shaped += f", --attn-dp-size {groups}" if groups > 1 else ", TP attention"
    return Problem(
        setting,
        f"sglang 0.5.23 resolves a rank's {difference.what} to {resolution.shown(difference.resolved)}, the kit expects "
        f"{resolution.shown(difference.expected)} ({shaped}): the healthcheck would judge the start's capture by the "
        "kit's figure, after the weights load",
        "another GLM5_PROFILE or GLM5_ATTN_DP_SIZE, or the setting's default; the kit's expectation "
        "(configuration/config.py) must follow sglang's: report it with this message. GLM5_SKIP_PREFLIGHT=flags with "
        "GLM5_ACCEPT_PARTIAL_CAPTURE=1 starts anyway (logged)",
        code=SERVER_CAPTURES,
    )


def doctor_findings(
    values: Mapping[str, Any], environ: Mapping[str, str], log: Log, warnings: list[dict[str, str]]
) -> list[Problem]:
    """The doctor's fast checks (entrypoint/doctor.py): a fail stops the start, a warn is logged and kept."""
    problems = []
    for found in doctor.run(doctor.Box(environ), values, DOCTOR_CHECKS):
        if found.status == "fail":
            problems.append(Problem("GPUs", f"{found.name}: {found.detail}", found.fix, code=doctor.GPU_MIG))
        elif found.status == "warn":
            log.warning(f"doctor: {found.name}: {found.detail}; fix: {found.fix}")
            warnings.append(asdict(found))
    return problems


def run(
    values: Mapping[str, Any],
    environ: Mapping[str, str],
    log: Log,
    server_args: list[str],
    gpu_csv: str | None = None,
    shm: Path = Path("/dev/shm"),
    warnings: list[dict[str, str]] | None = None,
    server_environ: Mapping[str, str] | None = None,
    expected: resolution.Captures | None = None,
) -> list[Problem]:
    """Every check not in GLM5_SKIP_PREFLIGHT (values["skip_preflight"]); all problems, collected. The doctor's
    warnings are logged and appended to `warnings` (launch records them in launch.json). The flags are resolved in
    `server_environ` (the server's; default `environ`), and what the resolution settles is held to `expected`."""
    skip: set[str] = values["skip_preflight"]
    problems: list[Problem] = []
    for name in sorted(skip):
        log.warning(f"preflight: check '{name}' skipped by GLM5_SKIP_PREFLIGHT")
    if "gpu" not in skip:
        if gpu_csv is None:
            gpu_csv, failure = doctor.query_gpus()
            problems += [failure] if failure else []
        if gpu_csv is not None:
            problems += doctor.gpu_problems(gpu_csv, values, environ)
            problems += doctor_findings(values, environ, log, warnings if warnings is not None else [])
    if "shm" not in skip:
        problems += doctor.shm_problems(values, shm)
    if "model" not in skip:
        problems += check_model(values)
    if "flashinfer" not in skip:
        problems += check_flashinfer()
    if "flags" not in skip:
        problems += check_flags(
            server_args,
            extra_args=values["extra_args"],
            environ=environ if server_environ is None else server_environ,
            expected=expected,
        )
    return problems
