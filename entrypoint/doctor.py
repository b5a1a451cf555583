"""Hardware doctor: in seconds, whether this box can run GLM-5 at TP8 well, before a 10-minute load.

    entrypoint/doctor [--json] [--host] [--nccl] [--ipc] [--only NAME,...]
    docker compose run --rm glm5 doctor        (the same inside the image; in the pod: kubectl exec ... doctor)
    entrypoint/doctor --host                   (on the host, from the kit's checkout, before the first build: adds
                                                Docker Compose, the NVIDIA Container Toolkit, the weights' disk;
                                                with sudo, lspci reads ACS too)

Named checks, each `pass`, `warn`, `fail` or `unknown` (the data could not be read; never a crash) with a
detail and a fix: gpus, mig, pcie_link, topology, p2p, iommu, acs, power, shm, kernels, with --host compose,
container_toolkit and weights_disk, and with --nccl
nccl_allreduce (a real all-reduce over every GPU, about a minute), with --ipc pcie_ipc_allreduce (FlashInfer's
PCIe-IPC all-reduce against NCCL's at the decode sizes, kept on the cache volume with the box's fingerprint: the
start's all-reduce is decided from it, configuration/allreduce_choice.py). Preflight runs the fast ones: a fail
stops the start, a warn is logged and recorded in launch.json. Exit 0 when no check fails, 1 otherwise.

Every reading comes from the tool that owns it (nvidia-smi, lspci, /proc, /sys); the parsers follow real
outputs quoted in tests/fixtures/doctor/ (nvidia-smi prints ANSI underline escapes in topo headers, `[N/A]`
for fields a GPU or VM does not report).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.report import INVALID_SETTING, Log, Problem, Problems
from configuration import allreduce_choice, config, settings, state
from configuration.config import build_id

STATUSES = ("pass", "warn", "fail", "unknown")
GPU_QUERY = "index,pci.bus_id,name,compute_cap,memory.total,driver_version"
# Preflight's exit codes for what the box lacks (README: "Preflight exit codes"), one per kind.
NVIDIA_SMI_MISSING = 10
NVIDIA_SMI_FAILED = 11
GPU_QUERY_UNREADABLE = 12
GPU_COUNT = 13
GPU_PRODUCT = 14
GPU_COMPUTE_CAPABILITY = 15
GPU_MEMORY = 16
GPU_DRIVER = 17
GPU_MIG = 18  # the mig check, or any of the fast checks preflight runs: MIG mode on, or a MIG slice visible
SHM_TOO_SMALL = 20
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NO_P2P = {"NS", "GNS", "CNS", "TNS", "U"}
P2P_MEANING = {
    "NS": "not supported",
    "GNS": "GPU not supported",
    "CNS": "chipset not supported",
    "TNS": "topology not supported",
    "U": "unknown",
}
MAX_Q_WATTS, FULL_WATTS = 300, 600  # RTX PRO 6000 Blackwell: Max-Q edition by design, Workstation/Server


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


class Box:
    """What the checks read. Each reader returns text, or None when it cannot be read (then: unknown)."""

    def __init__(self, environ: Mapping[str, str] | None = None, root: Path = Path("/"), host: bool = False):
        self.environ = dict(os.environ if environ is None else environ)
        self.root = root
        self.host = host
        self.notes: dict[str, str] = {}  # why a reading failed, by what was read

    def command(self, *argv: str, timeout: float = 60) -> str | None:
        if shutil.which(argv[0], path=self.environ.get("PATH")) is None:
            self.notes[argv[0]] = f"{argv[0]} is not installed here"
            return None
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False, env=self.environ
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            self.notes[" ".join(argv)] = str(err)
            return None
        if done.returncode != 0:
            self.notes[" ".join(argv)] = (done.stdout + done.stderr).strip()[
                :300
            ] or f"exit {done.returncode}"
            return None
        return done.stdout

    def smi(self, *args: str) -> str | None:
        return self.command("nvidia-smi", *args)

    def query(self, fields: str) -> list[dict[str, str]] | None:
        """`nvidia-smi --query-gpu=FIELDS --format=csv` as rows keyed by field (units dropped from the header)."""
        text = self.smi(f"--query-gpu={fields}", "--format=csv")
        if text is None or not text.strip() or "No devices were found" in text:
            return None
        rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
        header = [h.split(" [")[0].strip() for h in rows[0]]
        found = [dict(zip(header, (v.strip() for v in r), strict=False)) for r in rows[1:] if r]
        if not found:
            self.notes["nvidia-smi"] = "nvidia-smi lists no GPU"
        return found or None

    def read(self, path: str) -> str | None:
        try:
            return (self.root / path.lstrip("/")).read_text()
        except OSError as err:
            self.notes[path] = err.strerror or str(err)
            return None

    def listdir(self, path: str) -> list[str] | None:
        try:
            return sorted(os.listdir(self.root / path.lstrip("/")))
        except OSError as err:
            self.notes[path] = err.strerror or str(err)
            return None


# What to do when a reading is missing, by what was read: never the command the doctor just ran.
UNREADABLE_FIX = {
    "nvidia-smi": "the container has no working GPU runtime: on the host, `nvidia-smi` must list the 8 GPUs; then "
    "compose needs the NVIDIA container toolkit (deploy.resources.reservations.devices), Kubernetes the "
    "`nvidia` RuntimeClass and the device plugin",
    "/proc/cmdline": 'run the doctor on the host instead: sudo env "PATH=$PATH" entrypoint/doctor --host',
}
UNINTERPRETED_FIX = (
    "a reading of a form the doctor does not know: attach `entrypoint/doctor --bundle - > glm5-bundle.tar.gz` to an "
    "issue; the other checks still stand"
)


# On the host there is no container runtime between the doctor and the driver: what is missing is the driver itself.
HOST_DRIVER_FIX = (
    "install the NVIDIA driver, R{min_driver_major} or newer, on the host so that `nvidia-smi` lists the "
    "{gpu_count} GPUs (MIG off)"
)
HOST_UNREADABLE_FIX = "install the NVIDIA driver on the host (the gpus check names the version it needs)"


def unreadable(name: str, what: str, box: Box, fix: str = "") -> Check:
    why = box.notes.get(what) or next((v for k, v in box.notes.items() if k.startswith(what)), "no output")
    if not fix and box.host and what == "nvidia-smi":
        fix = HOST_UNREADABLE_FIX
    return Check(
        name, "unknown", f"could not read {what}: {why}", fix or UNREADABLE_FIX.get(what, UNINTERPRETED_FIX)
    )


# ---- the readings preflight shares: nvidia-smi's GPU query and /dev/shm, as Problems with their exit codes ----


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


def gpu_problems(csv_text: str, values: Mapping[str, Any], environ: Mapping[str, str]) -> list[Problem]:
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


SHM_REMEDY = "run with ipc: host (compose), --ipc=host or --shm-size=32g (docker run), or a Memory emptyDir at /dev/shm (k8s)"


def shm_problems(
    values: Mapping[str, Any], shm: Path = Path("/dev/shm"), remedy: str = SHM_REMEDY
) -> list[Problem]:
    """/dev/shm too small for TP8, or unreadable, each with `remedy` (the container's by default)."""
    try:
        st = os.statvfs(shm)
    except OSError as err:
        return [Problem("/dev/shm", f"cannot stat {shm} ({err.strerror}): {remedy}", code=SHM_TOO_SMALL)]
    gib = st.f_frsize * st.f_blocks / 2**30
    if gib < values["min_shm_gib"]:
        return [
            Problem(
                "/dev/shm",
                f"{shm} is {gib:.2f} GiB, TP8 needs {values['min_shm_gib']} GiB or more: {remedy}",
                code=SHM_TOO_SMALL,
            )
        ]
    return []


# ---- the checks -------------------------------------------------------------------------------------------


def check_gpus(box: Box, values: Mapping[str, Any]) -> Check:
    text = box.smi(f"--query-gpu={GPU_QUERY}", "--format=csv")
    if text is None:
        return Check(
            "gpus",
            "fail",
            box.notes.get("nvidia-smi") or next(iter(box.notes.values()), "nvidia-smi gave no output"),
            HOST_DRIVER_FIX.format_map(values)
            if box.host
            else "run with the NVIDIA runtime and all eight GPUs (compose device_ids 0-7; k8s nvidia.com/gpu: 8)",
        )
    problems = gpu_problems(text, values, box.environ)
    if problems:
        return Check("gpus", "fail", "; ".join(p.message for p in problems), "see each GPU above")
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))[1:]
    names = sorted({r[2] for r in rows if len(r) > 2})
    return Check("gpus", "pass", f"{len(rows)}x {', '.join(names)}, driver {rows[0][5]}")


def check_mig(box: Box) -> Check:
    rows = box.query("index,mig.mode.current,mig.mode.pending")
    listing = box.smi("-L")
    if rows is None and listing is None:
        return unreadable("mig", "nvidia-smi", box)
    found = []
    for r in rows or []:
        current, pending = r.get("mig.mode.current", ""), r.get("mig.mode.pending", "")
        if current == "Enabled" or pending == "Enabled":
            found.append(f"GPU {r.get('index')} (current {current}, pending {pending})")
    slices = [ln.strip() for ln in (listing or "").splitlines() if ln.strip().startswith("MIG ")]
    if found or slices:
        detail = "MIG mode enabled on " + ", ".join(found) if found else "MIG slices visible"
        if slices:
            detail += f"; {len(slices)} MIG slice(s) visible here ({slices[0]}...)"
        gpus = ",".join(f.split()[1] for f in found) or "N"
        return Check(
            "mig",
            "fail",
            detail + ": TP8 needs eight whole GPUs",
            f"on the host: sudo nvidia-smi -i {gpus} -mig 0, then reset the GPU (sudo nvidia-smi -i N -r) or reboot",
        )
    return Check("mig", "pass", "MIG disabled on every GPU")


def check_pcie_link(box: Box) -> Check:
    """What each card can train to in its slot; never the current generation, which drops while a GPU idles."""
    rows = box.query("index,pcie.link.gen.gpumax,pcie.link.gen.hostmax,pcie.link.gen.max,pcie.link.width.max")
    if rows is None:
        return unreadable("pcie_link", "nvidia-smi", box)
    weak, unknown = [], []
    for r in rows:
        gpu_max, host_max = number(r.get("pcie.link.gen.gpumax")), number(r.get("pcie.link.gen.hostmax"))
        both = number(r.get("pcie.link.gen.max"))
        gen = min(x for x in (gpu_max, host_max, both, 99) if x is not None)
        width = number(r.get("pcie.link.width.max"))
        if gen == 99 or width is None:
            unknown.append(r.get("index", "?"))
        elif gen < 5 or width < 16:
            weak.append(
                f"GPU {r.get('index')} trains to Gen{gen} x{width} at most (GPU Gen{gpu_max or '?'}, "
                f"slot Gen{host_max or '?'})"
            )
    if weak:
        return Check(
            "pcie_link",
            "warn",
            "; ".join(weak) + ": all-reduce over PCIe runs at the slowest link",
            "seat each card in a CPU-attached Gen5 x16 slot; check the BIOS PCIe speed setting and any riser or "
            "retimer; a bifurcated (x8) slot halves the bandwidth",
        )
    if unknown and len(unknown) == len(rows):
        return Check(
            "pcie_link",
            "unknown",
            "nvidia-smi reports no maximum link for any GPU ([N/A])",
            "read the slots' links on the host: sudo lspci -vv -d 10de: | grep -E 'LnkCap|LnkSta'",
        )
    note = f" (GPU {', '.join(unknown)} unreported)" if unknown else ""
    return Check("pcie_link", "pass", f"every GPU can train to Gen5 x16 or better{note}")


def number(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def parse_matrix(text: str) -> tuple[list[str], dict[str, list[str]], int]:
    """An nvidia-smi topo matrix: its GPU labels, each GPU row's cells by column (the device columns: GPUs, then
    any NICs; then CPU affinity and NUMA affinity), and how many device columns precede CPU affinity. Cells are
    split on any whitespace (nvidia-smi writes tabs; pasted copies carry spaces); its ANSI underline escapes are
    dropped."""
    lines = [ANSI.sub("", ln) for ln in text.splitlines()]
    header_at = next(i for i, ln in enumerate(lines) if re.search(r"\bGPU0\b", ln))
    header = lines[header_at].split()
    devices = header[: header.index("CPU")] if "CPU" in header else header
    gpus = [h for h in devices if re.fullmatch(r"GPU\d+", h)]
    rows: dict[str, list[str]] = {}
    for ln in lines[header_at + 1 :]:
        cells = ln.split()
        if not cells:
            if rows:
                break
            continue
        if re.fullmatch(r"GPU\d+", cells[0]):
            rows[cells[0]] = cells[1:]
    return gpus, rows, len(devices) if "CPU" in header else len(gpus)


def check_topology(box: Box) -> Check:
    text = box.smi("topo", "-m")
    if text is None:
        return unreadable("topology", "nvidia-smi", box)
    try:
        gpus, rows, devices = parse_matrix(text)
    except StopIteration:
        return Check("topology", "unknown", "nvidia-smi topo -m printed no GPU matrix", UNINTERPRETED_FIX)
    kinds: dict[str, list[str]] = {}
    numa: dict[str, str] = {}
    order = {g: int(g[3:]) for g in gpus}
    for a in gpus:
        cells = rows.get(a, [])
        for j, b in enumerate(gpus):
            if j < len(cells) and order[a] < order[b]:
                kinds.setdefault(cells[j], []).append(f"{a}-{b}")
        if len(cells) > devices + 1:
            numa[a] = cells[devices + 1]
    nodes = sorted(set(numa.values()))
    layout = (
        "; NUMA " + ", ".join(f"{n}: {' '.join(g for g in gpus if numa.get(g) == n)}" for n in nodes)
        if numa
        else ""
    )
    summary = ", ".join(f"{k} {len(v)}" for k, v in sorted(kinds.items()))
    if "SYS" in kinds:
        return Check(
            "topology",
            "warn",
            f"{len(kinds['SYS'])} GPU pair(s) cross the CPU sockets (SYS, e.g. {kinds['SYS'][0]}){layout}; "
            f"pairs by path: {summary}",
            "NCCL_P2P_LEVEL=SYS (the image's default) lets peer-to-peer cross the sockets; if the first all-reduce "
            "hangs, see the acs and iommu checks (NCCL_P2P_DISABLE=1 works around it at a bandwidth cost)",
        )
    return Check("topology", "pass", f"{len(gpus)} GPUs, pairs by path: {summary}{layout}")


def check_p2p(box: Box) -> Check:
    found, read = [], 0
    for mode, word in (("r", "read"), ("w", "write")):
        text = box.smi("topo", "-p2p", mode)
        if text is None:
            continue
        try:
            gpus, rows, _ = parse_matrix(text)
        except StopIteration:
            continue
        read += 1
        for i, a in enumerate(gpus):
            for j, b in enumerate(gpus):
                cell = rows.get(a, [""] * len(gpus))[j] if j < len(rows.get(a, [])) else ""
                if i < j and cell in NO_P2P:
                    found.append(f"{a}-{b} {word} {cell} ({P2P_MEANING[cell]})")
    if not read:
        return unreadable("p2p", "nvidia-smi", box)
    if found:
        return Check(
            "p2p",
            "warn",
            f"{len(found)} GPU pair direction(s) without peer-to-peer: {', '.join(found[:4])}"
            + ("..." if len(found) > 4 else ""),
            "NCCL then copies through host memory (a fraction of the bandwidth); enable P2P: Above 4G decoding and "
            "Resizable BAR in the BIOS, ACS off on the GPUs' bridges, IOMMU off or iommu=pt",
        )
    return Check("p2p", "pass", "peer-to-peer read and write OK between every GPU pair")


# The two known fixes for peer-to-peer redirected through the root complex (NVIDIA/nccl#2079; NCCL's troubleshooting,
# docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs).
ACS_FIXES = (
    "either clear ACS on the root-complex and switch bridges above the GPUs at every boot, `sudo setpci -s BDF "
    "ECAP_ACS+0x6.w=0000` for each bridge lspci shows with ACSCtl SrcValid+ (NCCL's troubleshooting guide), or add "
    "pci=noacs to the kernel command line and reboot (NVIDIA/nccl#2079)"
)


def check_iommu(box: Box) -> Check:
    cmdline = box.read("/proc/cmdline")
    units = box.listdir("/sys/class/iommu")
    if cmdline is None and units is None:
        return unreadable("iommu", "/proc/cmdline", box)
    args = (cmdline or "").split()
    passthrough = "iommu=pt" in args or "iommu.passthrough=1" in args
    off = any(a in args for a in ("intel_iommu=off", "amd_iommu=off", "iommu=off"))
    on = bool(units) and not off
    if not on:
        return Check(
            "iommu", "pass", "no IOMMU translating DMA" + (f" ({' '.join(units or [])})" if units else "")
        )
    if passthrough:
        return Check("iommu", "pass", f"IOMMU in passthrough mode (iommu=pt; units {' '.join(units or [])})")
    return Check(
        "iommu",
        "warn",
        f"IOMMU on and translating ({' '.join(units or [])}; kernel command line without iommu=pt): GPU peer-to-peer "
        "is routed through it, and NCCL can hang at the first all-reduce (NVIDIA/nccl#2079)",
        "add iommu=pt to the kernel command line (GRUB_CMDLINE_LINUX, then update-grub and reboot), or turn "
        "VT-d / AMD-Vi off in the BIOS; and ACS off: " + ACS_FIXES,
    )


def check_acs(box: Box) -> Check:
    host_mode = 'run `sudo env "PATH=$PATH" entrypoint/doctor --host` on the host from the kit\'s checkout (needs pciutils)'
    text = box.command("lspci", "-vvv")
    if text is None:
        return Check(
            "acs", "unknown", f"lspci is not readable here ({box.notes.get('lspci', 'no output')})", host_mode
        )
    blocks = re.split(r"\n(?=[0-9a-f]{2,4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d |[0-9a-f]{2}:[0-9a-f]{2}\.\d )", text)
    denied = [b for b in blocks if "bridge" in b.split("\n", 1)[0].lower() and "<access denied>" in b]
    on = [b.split(" ", 1)[0] for b in blocks if re.search(r"ACSCtl:[^\n]*SrcValid\+", b)]
    if on:
        return Check(
            "acs",
            "warn",
            f"ACS source validation/redirect on at {len(on)} PCIe bridge(s) ({', '.join(on[:4])}"
            f"{'...' if len(on) > 4 else ''}): peer-to-peer goes up to the root complex, and NCCL can hang "
            "(NVIDIA/nccl#2079)",
            ACS_FIXES + "; until then NCCL_P2P_DISABLE=1 in glm5.env, at a bandwidth cost",
        )
    if denied:
        return Check(
            "acs",
            "unknown",
            f"lspci cannot read {len(denied)} bridge(s) capabilities without root",
            host_mode,
        )
    return Check("acs", "pass", "no PCIe bridge has ACS redirection on")


def check_power(box: Box) -> Check:
    rows = box.query("index,name,power.limit,power.default_limit,enforced.power.limit")
    if rows is None:
        return unreadable("power", "nvidia-smi", box)
    capped, max_q = [], []
    for r in rows:
        enforced = number(r.get("enforced.power.limit")) or number(r.get("power.limit"))
        default = number(r.get("power.default_limit"))
        if "Max-Q" in r.get("name", ""):
            max_q.append(r.get("index", "?"))
        if enforced is not None and default is not None and enforced < default:
            capped.append(f"GPU {r.get('index')} limited to {enforced} W of its default {default} W")
    note = (
        f"; GPU {', '.join(max_q)}: Max-Q edition, {MAX_Q_WATTS} W by design (Workstation and Server editions "
        f"{FULL_WATTS} W), its throughput effect here unknown until measured"
        if max_q
        else ""
    )
    if capped:
        return Check(
            "power",
            "warn",
            "; ".join(capped) + note,
            "restore the default limit on the host: sudo nvidia-smi -i N -pl <default W> (and find what set it)",
        )
    return Check("power", "pass", "every GPU at its default power limit" + note)


def check_shm(box: Box, values: Mapping[str, Any]) -> Check:
    """/dev/shm holds what TP8's NCCL needs. On the host: the host's own, which compose gives the container (ipc: host;
    a pod has its own, a Memory emptyDir)."""
    if box.host:
        remedy = "compose runs the container with ipc: host, so this is its /dev/shm"
        fix = (
            f"sudo mount -o remount,size={2 * values['min_shm_gib']}G /dev/shm (a tmpfs: half the RAM by default; "
            "add the size to its /etc/fstab line to keep it); a Kubernetes node needs none (the pod has its own)"
        )
        where = "the host's /dev/shm (the container's, under compose's ipc: host)"
    else:
        remedy, fix, where = SHM_REMEDY, "compose: ipc: host; k8s: a Memory emptyDir at /dev/shm", "/dev/shm"
    problems = shm_problems(values, box.root / "dev/shm", remedy)
    if problems:
        return Check("shm", "fail", problems[0].message, fix)
    return Check("shm", "pass", f"{where} holds {values['min_shm_gib']} GiB or more")


def check_kernels(box: Box, values: Mapping[str, Any]) -> Check:
    """The image's record of its prebuilt FlashInfer kernels (kernels/build): what a start would still compile."""
    if box.host:
        return Check(
            "kernels", "pass", "not applicable on the host (the image's prebuilt kernels are checked inside)"
        )
    path = f"{values['home']}/KERNELS-PREBUILT.json"
    text = box.read(path)
    if text is None:
        return unreadable(
            "kernels", path, box, "run the image the kit's Dockerfile builds (its kernels step writes it)"
        )
    record = json.loads(text)
    missing = list(record["not_built"])
    if missing:
        return Check(
            "kernels",
            "warn",
            f"{len(missing)} FlashInfer module(s) not prebuilt (built with GLM5_KERNELS={record['selection']}): "
            f"{', '.join(missing)}; a start compiles them before it serves, minutes to hours by core count",
            "build with GLM5_KERNELS=all, the default (docker compose build)",
        )
    return Check(
        "kernels",
        "pass",
        f"{len(record['built'])} FlashInfer modules prebuilt for sm_{record['arch_list'].replace('.', '')}: "
        "a start compiles none of them",
    )


def check_nccl(box: Box) -> Check:
    kit = str(Path(__file__).resolve().parent.parent)
    env = box.environ | {"PYTHONPATH": kit, "NCCL_NVLS_ENABLE": box.environ.get("NCCL_NVLS_ENABLE", "0")}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "entrypoint.allreduce", "--json", "--timeout", "120"],
            capture_output=True, text=True, timeout=300, check=False, env=env,
        )  # fmt: skip
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as err:
        return Check(
            "nccl_allreduce",
            "fail",
            f"the all-reduce did not run: {err}",
            "run python3 -m entrypoint.allreduce with NCCL_DEBUG=INFO to see where it stops",
        )
    if not result.get("ok"):
        return Check(
            "nccl_allreduce",
            "fail",
            f"{result.get('error')} ({result.get('gpus')} GPUs)",
            "a hang: see the acs, iommu and p2p checks; NCCL_P2P_DISABLE=1 in glm5.env works around it",
        )
    big = result["sizes"][-1]
    return Check(
        "nccl_allreduce",
        "pass",
        f"{result['gpus']} GPUs, sums correct; bus bandwidth "
        + ", ".join(f"{r['bytes'] // 2**20} MiB {r['busbw_gbps']} GB/s" for r in result["sizes"])
        + f" (largest message {big['seconds'] * 1e3:.2f} ms)",
    )


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with what the server compiles and tunes under: glm5.toml's [[env]] (SGLANG_CACHE_DIR on the cache
    volume, in this image build's folder; CUDA_HOME; the operator's own values win, as launch gives them), and
    FlashInfer's workspace where SGLang 0.5.23 points it before the server imports FlashInfer (srt/environ.py
    third_party_cache_defaults: FLASHINFER_WORKSPACE_BASE = SGLANG_CACHE_DIR). Under that base FlashInfer keeps its JIT
    modules and the PCIe-IPC tune cache (flashinfer/jit/env.py, comm/pcie_ipc_tuning.py default_cache_path), so the
    check's compile and tuning are the ones the server's first PCIe-IPC start finds."""
    try:
        server, _ = config.resolve(environ).server_env(environ)
    except Problems:
        return dict(
            environ
        )  # an invalid setting: the doctor already said so; the check runs in the plain one
    env = dict(environ) | server
    if "SGLANG_CACHE_DIR" in env:
        env.setdefault("FLASHINFER_WORKSPACE_BASE", os.path.expanduser(env["SGLANG_CACHE_DIR"]))
    return env


def measure_pcie_ipc(box: Box) -> dict[str, Any]:
    """`python3 -m entrypoint.allreduce --backend pcie_ipc --json`, in the server's cache environment: its report, or
    one saying why there is none. The workers' hang bound is 120 s; the first run also compiles the kernels (not
    prebuilt), hence the wider bound."""
    kit = str(Path(__file__).resolve().parent.parent)
    env = server_environment(box.environ) | {
        "PYTHONPATH": kit,
        "NCCL_NVLS_ENABLE": box.environ.get("NCCL_NVLS_ENABLE", "0"),
    }
    argv = [
        sys.executable,
        "-m",
        "entrypoint.allreduce",
        "--backend",
        "pcie_ipc",
        "--json",
        "--timeout",
        "120",
    ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=IPC_BOUND_SECONDS, check=False, env=env
        )
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as err:
        return {"ok": False, "error": f"the PCIe-IPC all-reduce did not run: {err}"}
    return found if isinstance(found, dict) else {"ok": False, "error": f"an unreadable report: {found!r}"}


def box_fingerprint(box: Box, values: Mapping[str, Any]) -> allreduce_choice.Fingerprint | None:
    text = box.smi(f"--query-gpu={allreduce_choice.FINGERPRINT_QUERY}", "--format=csv")
    return None if text is None else allreduce_choice.parse_fingerprint(text, build_id(values["home"]))


def ipc_summary(result: Mapping[str, Any]) -> str:
    sizes = result.get("sizes") or []
    served = [r for r in sizes if r.get("served")]
    if not served:
        return f"{result.get('gpus')} GPUs, no decode size served by the kernels (each stays on NCCL)"
    widest, narrowest = served[-1], served[0]
    return (
        f"{result.get('gpus')} GPUs, {len(served)} of {len(sizes)} decode sizes served by the kernels and equal to "
        f"NCCL's within the bf16 bound; rows {narrowest['rows']}: {narrowest['ipc_seconds'] * 1e6:.1f} us vs NCCL "
        f"{narrowest['nccl_seconds'] * 1e6:.1f} us, rows {widest['rows']}: {widest['ipc_seconds'] * 1e6:.1f} us vs "
        f"{widest['nccl_seconds'] * 1e6:.1f} us"
    )


def ipc_record(
    result: Mapping[str, Any], found: Check, fingerprint: allreduce_choice.Fingerprint | None
) -> dict[str, Any]:
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {
        "check": found.name,
        "ok": found.status == "pass",
        "at": at,
        "fingerprint": None if fingerprint is None else fingerprint.as_json(),
        "detail": found.detail,
        "error": result.get("error"),
        "gpus": result.get("gpus"),
        "sizes": result.get("sizes", []),
    }


def check_pcie_ipc(box: Box, values: Mapping[str, Any], measure: Callable[[Box], dict[str, Any]]) -> Check:
    """FlashInfer's PCIe-IPC all-reduce against NCCL (entrypoint/allreduce --backend pcie_ipc), kept on the cache
    volume (configuration/state.py PCIE_IPC_CHECK) with this box's fingerprint, passed or failed."""
    result = measure(box)
    if result.get("ok"):
        found = Check("pcie_ipc_allreduce", "pass", ipc_summary(result))
    else:
        found = Check(
            "pcie_ipc_allreduce",
            "fail",
            f"{result.get('error')} ({result.get('gpus')} GPUs): the start keeps NCCL (GLM5_ALLREDUCE=auto)",
            "a hang or a wrong result: see the acs, iommu and p2p checks; GLM5_ALLREDUCE=nccl keeps NCCL whatever "
            "the check says",
        )
    fingerprint = box_fingerprint(box, values)
    try:
        kept = state.write_pcie_ipc_check(values["cache_dir"], ipc_record(result, found, fingerprint))
    except OSError as err:
        found.detail += f"; not kept ({values['cache_dir']}: {err.strerror or err}): the start cannot use it"
        return found
    unmatched = (
        "" if fingerprint is not None else " without the GPUs' fingerprint (nvidia-smi unreadable): stale"
    )
    found.detail += f"; kept in {kept}{unmatched}"
    return found


COMPOSE_MIN = (2, 24)  # README: Needs (the compose file's `env_file: required: false`, `create_host_path`)
TOOLKIT_HOOK = "nvidia-container-runtime-hook"  # what Docker looks for to register its "nvidia" device driver
TOOLKIT_URL = "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"


def check_compose(box: Box) -> Check:
    """`docker compose version`: the Compose plugin the quick start runs, at the version its compose file needs."""
    want = ".".join(map(str, COMPOSE_MIN))
    text = box.command("docker", "compose", "version", "--short", timeout=20)
    if text is None:
        missing = "docker" in box.notes
        said = (box.notes.get("docker compose version --short") or "no output").splitlines()[0]
        # Docker 28 without the plugin reads `compose` as no command and its flag as its own: "unknown flag: --short"
        # (exit 125); `docker compose version` then says "docker: unknown command: docker compose".
        no_plugin = said.startswith("unknown flag") or "unknown command" in said
        return Check(
            "compose",
            "fail",
            "docker is not installed here"
            if missing
            else f"Docker has no Compose plugin (`docker compose version --short` answered: {said})"
            if no_plugin
            else f"`docker compose version` failed: {said}",
            f"install Docker Engine 25 or newer with its Compose plugin {want}+ (https://docs.docker.com/engine/install/)"
            if missing
            else f"install the Compose plugin {want}+ (docker-compose-plugin: https://docs.docker.com/compose/install/linux/)",
        )
    version = text.strip().removeprefix("v")
    found = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    if len(found) < 2 or found < COMPOSE_MIN:
        return Check(
            "compose",
            "fail",
            f"Docker Compose {version}: the kit's compose file needs {want} or newer",
            f"upgrade the Compose plugin to {want}+ (https://docs.docker.com/compose/install/linux/)",
        )
    return Check("compose", "pass", f"Docker Compose {version}")


def check_container_toolkit(box: Box) -> Check:
    """The NVIDIA Container Toolkit: without its hook on PATH Docker registers no "nvidia" device driver, and the
    compose file's GPU request fails (moby/moby daemon/nvidia_linux.go)."""
    hook = shutil.which(TOOLKIT_HOOK, path=box.environ.get("PATH"))
    if hook is None:
        return Check(
            "container_toolkit",
            "fail",
            f"the NVIDIA Container Toolkit is not installed ({TOOLKIT_HOOK} is not on PATH): Docker then has no "
            '"nvidia" device driver, and `docker compose up` fails with `could not select device driver "nvidia" '
            "with capabilities: [[gpu]]`",
            f"install it ({TOOLKIT_URL}), then `sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl "
            "restart docker`",
        )
    version = (box.command("nvidia-ctk", "--version", timeout=20) or "").strip().splitlines()
    return Check("container_toolkit", "pass", f"{hook}" + (f" ({version[0]})" if version else ""))


def check_weights_disk(box: Box, values: Mapping[str, Any]) -> Check:
    """GLM5_MODEL_HOST_DIR (.env or the shell, as compose reads it): room for the weights where they will be."""
    folder = Path(values["model_host_dir"])
    if not folder.is_absolute():
        folder = KIT / folder  # compose reads it relative to the compose file, the kit's folder
    need = values["weights_gb"] * 10**9
    held = (
        sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
        if folder.is_dir()
        else 0
    )
    near = next(p for p in (folder, *folder.parents) if p.exists())
    free = shutil.disk_usage(near).free
    state_of = "holds" if folder.is_dir() else "does not exist yet (quick start step 1 makes it);"
    detail = (
        f"GLM5_MODEL_HOST_DIR {folder} {state_of} {held / 1e9:.0f} GB of the {values['weights_gb']} GB of weights; "
        f"{free / 1e9:.0f} GB free at {near}"
    )
    if held + free < need:
        return Check(
            "weights_disk",
            "fail",
            detail + f": {(need - held - free) / 1e9:.0f} GB short",
            "point GLM5_MODEL_HOST_DIR in .env at a disk with room for the weights, or free that much",
        )
    return Check("weights_disk", "pass", detail)


IPC_BOUND_SECONDS = 900  # the kernels' first compile (minutes) and the workers' 120 s
FAST = ("gpus", "mig", "pcie_link", "topology", "p2p", "iommu", "acs", "power", "shm", "kernels")
# --host alone: what the quick start needs before anything is built
HOST = ("compose", "container_toolkit", "weights_disk")
ALL = (*FAST, *HOST, "nccl_allreduce", "pcie_ipc_allreduce")
KIT = Path(__file__).resolve().parent.parent


def checks_for(values: Mapping[str, Any]) -> dict[str, Callable[[Box], Check]]:
    return {
        "gpus": lambda box: check_gpus(box, values),
        "mig": check_mig,
        "pcie_link": check_pcie_link,
        "topology": check_topology,
        "p2p": check_p2p,
        "iommu": check_iommu,
        "acs": check_acs,
        "power": check_power,
        "shm": lambda box: check_shm(box, values),
        "kernels": lambda box: check_kernels(box, values),
        "compose": check_compose,
        "container_toolkit": check_container_toolkit,
        "weights_disk": lambda box: check_weights_disk(box, values),
        "nccl_allreduce": check_nccl,
        "pcie_ipc_allreduce": lambda box: check_pcie_ipc(box, values, measure_pcie_ipc),
    }


def run(box: Box, values: Mapping[str, Any], names: tuple[str, ...] = FAST) -> list[Check]:
    table = checks_for(values)
    found = []
    for name in names:
        try:
            found.append(table[name](box))
        except Exception as err:  # noqa: BLE001 (a parser meeting an output it does not know: unknown, never a crash)
            found.append(
                Check(
                    name,
                    "unknown",
                    f"could not interpret the reading ({type(err).__name__}: {err})",
                    UNINTERPRETED_FIX,
                )
            )
    return found


def report(found: list[Check]) -> dict[str, Any]:
    return {"checks": [asdict(c) for c in found], "ok": not any(c.status == "fail" for c in found)}


def line(c: Check) -> str:
    return f"doctor: {c.status.upper():7} {c.name}: {c.detail}" + (
        f"; fix: {c.fix}" if c.fix and c.status != "pass" else ""
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="entrypoint/doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help='print {"checks": [...], "ok": ...}')
    parser.add_argument(
        "--host",
        action="store_true",
        help="on the host, before anything is built: also Docker Compose, the NVIDIA Container Toolkit and the "
        "weights' disk (as root, lspci reads ACS too)",
    )
    parser.add_argument(
        "--nccl", action="store_true", help="also run a real all-reduce over every GPU (~1 min)"
    )
    parser.add_argument(
        "--ipc",
        action="store_true",
        help="also check FlashInfer's PCIe-IPC all-reduce against NCCL, with the server stopped, kept on the cache "
        "volume (minutes the first time: its kernels compile and tune there, where the server reads them)",
    )
    parser.add_argument("--only", help=f"comma list of checks ({', '.join(ALL)})")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="read /proc, /sys and /dev/shm under this folder (recorded boxes)",
    )
    args = parser.parse_args(argv)
    names = FAST + (HOST if args.host else ())
    names += (("nccl_allreduce",) if args.nccl else ()) + (("pcie_ipc_allreduce",) if args.ipc else ())
    if args.only:
        names = tuple(n.strip() for n in args.only.split(",") if n.strip())
        unknown = [n for n in names if n not in ALL]
        if unknown:
            parser.error(f"--only: unknown check(s) {', '.join(unknown)}; use {', '.join(ALL)}")
    try:
        # on the host the settings compose reads too: the kit's .env, then the shell (GLM5_MODEL_HOST_DIR)
        environ = settings.host_environment(os.environ, KIT) if args.host else os.environ
        values = settings.resolve(environ, where="ci" if args.host else "container")
    except Problems as err:
        Log("doctor").problems(err.problems)
        return INVALID_SETTING
    found = run(Box(host=args.host, root=args.root), values, names)
    if args.json:
        print(json.dumps(report(found)))
    else:
        for c in found:
            print(line(c))
    return 0 if report(found)["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
