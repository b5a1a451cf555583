"""Checks run before anything expensive: GPUs, shared memory, the model folder, FlashInfer.

Each failure is a Problem with its own exit code and a message that names the setting and the
fix. All findings are collected; the process exits with the code of the first one.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.report import Log, Problem

GPU_QUERY = "index,pci.bus_id,name,compute_cap,memory.total,driver_version"
VERIFY = Path(__file__).resolve().parent.parent / "patches" / "verify"  # the thin executable
ARCHITECTURE = "GlmMoeDsaForCausalLM"
RESOLVE_FLAGS = (
    Path(__file__).resolve().parent / "resolve_flags.py"
)  # stand-alone: run by the server's Python

# Exit codes, one per kind of failure (README: "Preflight exit codes").
NVIDIA_SMI_MISSING = 10
NVIDIA_SMI_FAILED = 11
GPU_QUERY_UNREADABLE = 12
GPU_COUNT = 13
GPU_PRODUCT = 14
GPU_COMPUTE_CAPABILITY = 15
GPU_MEMORY = 16
GPU_DRIVER = 17
GPU_MIG = 18  # the doctor's mig check: MIG mode on, or a MIG slice visible
DOCTOR_CHECKS = (
    "mig",
    "pcie_link",
    "topology",
    "p2p",
    "iommu",
    "power",
    "kernels",
)  # the doctor's fast checks run here
SHM_TOO_SMALL = 20
MODEL_DIR_MISSING = 30
MODEL_CONFIG = 31
MODEL_ARCHITECTURE = 32
MODEL_QUANTIZATION = 33
MODEL_INDEX = 34
MODEL_SHARDS = 35
FLASHINFER = 40
SKIP_SETTING = 41  # GLM5_SKIP_PREFLIGHT malformed (glm5.toml: its `code`)
SERVER_FLAGS = 42


def download_hint(values: Mapping[str, Any]) -> str:
    return (
        "download the weights before the start: with compose `docker compose run --rm glm5 download` (into "
        f"GLM5_MODEL_HOST_DIR, default {values['model_host_dir']}), or on the host `hf download "
        f"{values['model_repo']} --local-dir <GLM5_MODEL_HOST_DIR>`; on Kubernetes the weights Job "
        "(k8s/base/job-weights.yaml)"
    )


def query_gpus(nvidia_smi: str = "nvidia-smi") -> tuple[str | None, Problem | None]:
    if shutil.which(nvidia_smi) is None:
        return None, Problem(
            "GPUs",
            "nvidia-smi is not in the container: run it with the "
            "NVIDIA runtime (compose: deploy.resources.reservations.devices; "
            "docker run --gpus all; k8s: nvidia.com/gpu: 8)",
            code=NVIDIA_SMI_MISSING,
        )
    done = subprocess.run(
        [nvidia_smi, f"--query-gpu={GPU_QUERY}", "--format=csv"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if done.returncode != 0:
        return None, Problem(
            "GPUs",
            f"nvidia-smi failed (exit {done.returncode}): "
            f"{(done.stdout + done.stderr).strip()[:300]}; check the host driver with "
            "nvidia-smi on the host",
            code=NVIDIA_SMI_FAILED,
        )
    return done.stdout, None


def check_gpus(csv_text: str, values: Mapping[str, Any], environ: Mapping[str, str]) -> list[Problem]:
    text = csv_text.strip()
    if not text or "No devices were found" in text:
        return [
            Problem(
                "GPUs",
                "nvidia-smi sees no GPU: pin all eight GPUs to the "
                "container (compose device_ids 0-7, NVIDIA_VISIBLE_DEVICES=all)",
                code=NVIDIA_SMI_FAILED,
            )
        ]
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    header = [h.split(" [")[0] for h in rows[0]]
    if header != GPU_QUERY.split(","):
        return [
            Problem(
                "GPUs",
                f"unexpected nvidia-smi header {rows[0]}: expected "
                f"{GPU_QUERY} (is this nvidia-smi older than R580?)",
                code=GPU_QUERY_UNREADABLE,
            )
        ]
    gpus = [dict(zip(header, r, strict=False)) for r in rows[1:] if r]
    findings: list[Problem] = []
    where = ", ".join(f"{g.get('index', '?')}@{g.get('pci.bus_id', '?')}" for g in gpus)
    visible = environ.get("CUDA_VISIBLE_DEVICES") or environ.get("NVIDIA_VISIBLE_DEVICES") or "unset"
    want = values["gpu_count"]
    if len(gpus) != want:
        findings.append(
            Problem(
                "GPUs",
                f"{len(gpus)} GPU(s) visible ({where}; visible devices "
                f"{visible}), TP{want} needs exactly {want}: pin GPUs 0-{want - 1} to the "
                "container and leave CUDA_VISIBLE_DEVICES unset",
                code=GPU_COUNT,
            )
        )
    for gpu in gpus:
        label = f"GPU {gpu.get('index', '?')} ({gpu.get('pci.bus_id', '?')}, {gpu.get('name', '?')})"
        if len(gpu) != len(header) or any(v.startswith("[") for v in gpu.values()):
            findings.append(
                Problem(
                    "GPUs",
                    f"{label}: unreadable nvidia-smi row {gpu}; check the GPU with nvidia-smi -q on the host",
                    code=GPU_QUERY_UNREADABLE,
                )
            )
            continue
        if values["gpu_product"] not in gpu["name"]:
            findings.append(
                Problem(
                    "GPUs",
                    f"{label} is not an {values['gpu_product']}: this image "
                    "is tuned and tested for RTX PRO 6000 Blackwell only",
                    code=GPU_PRODUCT,
                )
            )
        if gpu["compute_cap"] != values["compute_capability"]:
            findings.append(
                Problem(
                    "GPUs",
                    f"{label} has compute capability "
                    f"{gpu['compute_cap']}, the image's kernels are built for "
                    f"{values['compute_capability']} (SM120)",
                    code=GPU_COMPUTE_CAPABILITY,
                )
            )
        mib = gpu["memory.total"].split()[0]
        if not mib.isdigit() or int(mib) < values["min_gpu_memory_mib"]:
            findings.append(
                Problem(
                    "GPUs",
                    f"{label} has {gpu['memory.total']}, GLM-5-NVFP4 at TP8 "
                    f"needs {values['min_gpu_memory_mib']} MiB or more per GPU (no MIG, no vGPU "
                    "slice)",
                    code=GPU_MEMORY,
                )
            )
        major = gpu["driver_version"].split(".")[0]
        if not major.isdigit() or int(major) < values["min_driver_major"]:
            findings.append(
                Problem(
                    "GPUs",
                    f"{label} runs driver {gpu['driver_version']}, the image's "
                    f"CUDA 13 needs R{values['min_driver_major']} or newer: upgrade the host "
                    "driver",
                    code=GPU_DRIVER,
                )
            )
    return findings


def check_shm(values: Mapping[str, Any], shm: Path = Path("/dev/shm")) -> list[Problem]:
    try:
        st = os.statvfs(shm)
    except OSError as err:
        return [
            Problem("/dev/shm", f"cannot stat {shm} ({err.strerror}): run with ipc: host", code=SHM_TOO_SMALL)
        ]
    gib = st.f_frsize * st.f_blocks / 2**30
    if gib < values["min_shm_gib"]:
        return [
            Problem(
                "/dev/shm",
                f"{shm} is {gib:.2f} GiB, TP8 needs {values['min_shm_gib']} "
                "GiB or more: run with ipc: host (compose), --ipc=host or --shm-size=32g (docker run), "
                "or a Memory emptyDir at /dev/shm (k8s)",
                code=SHM_TOO_SMALL,
            )
        ]
    return []


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
    findings += check_shards(model, values)
    return findings


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
        Problem(
            "FLASHINFER_CUDA_VERSION" if c["check"].startswith("override") else "FlashInfer",
            c["detail"],
            code=FLASHINFER,
        )
        for c in result["checks"]
        if not c["ok"]
    ]


def check_flags(server_args: list[str], python: str = sys.executable) -> list[Problem]:
    """Parse and resolve the server flags with sglang's own code, as the server will before it loads anything
    (entrypoint/resolve_flags.py: argparse, resolve_once with the model's config, check_server_args)."""
    env = dict(os.environ) | {"HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run(
            [python, str(RESOLVE_FLAGS), *server_args],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return [
            Problem(
                "GLM5_EXTRA_ARGS",
                f"resolving the server flags did not finish: {err}",
                "retry",
                code=SERVER_FLAGS,
            )
        ]
    if done.returncode == 0:
        return []
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip() and not ln.startswith("[")]
    last = (lines or ["(no output)"])[-1]
    return [
        Problem(
            "GLM5_EXTRA_ARGS",
            f"sglang refused the server flags: {last}; "
            "fix or remove the flag (entrypoint/launch --dry-run shows the command)",
            code=SERVER_FLAGS,
        )
    ]


def doctor_findings(
    values: Mapping[str, Any], environ: Mapping[str, str], log: Log, warnings: list[dict[str, str]]
) -> list[Problem]:
    """The doctor's fast checks (entrypoint/doctor.py): a fail stops the start, a warn is logged and kept."""
    from dataclasses import asdict

    from entrypoint import doctor

    problems = []
    for found in doctor.run(doctor.Box(environ), values, DOCTOR_CHECKS):
        if found.status == "fail":
            problems.append(Problem("GPUs", f"{found.name}: {found.detail}", found.fix, code=GPU_MIG))
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
) -> list[Problem]:
    """Every check not in GLM5_SKIP_PREFLIGHT (values["skip_preflight"]); all problems, collected. The doctor's
    warnings are logged and appended to `warnings` (launch records them in launch.json)."""
    skip: set[str] = values["skip_preflight"]
    problems: list[Problem] = []
    for name in sorted(skip):
        log.warning(f"preflight: check '{name}' skipped by GLM5_SKIP_PREFLIGHT")
    if "gpu" not in skip:
        if gpu_csv is None:
            gpu_csv, failure = query_gpus()
            problems += [failure] if failure else []
        if gpu_csv is not None:
            problems += check_gpus(gpu_csv, values, environ)
            problems += doctor_findings(values, environ, log, warnings if warnings is not None else [])
    if "shm" not in skip:
        problems += check_shm(values, shm)
    if "model" not in skip:
        problems += check_model(values)
    if "flashinfer" not in skip:
        problems += check_flashinfer()
    if "flags" not in skip:
        problems += check_flags(server_args)
    return problems
