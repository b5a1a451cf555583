"""Which all-reduce a start uses: FlashInfer's PCIe-IPC kernels or NCCL, decided from the doctor's kept check.

SGLang 0.5.23 runs the tensor-parallel group's reductions on FlashInfer's PCIe-IPC kernels when
SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 (srt/environ.py:1539; srt/distributed/device_communicators/pcie_ipc_ar.py),
else on NCCL. The kernels spin on peer flags with no timeout, so on a box whose peer-to-peer is broken a start would
hang rather than fail: the kit turns them on only where `entrypoint/doctor --ipc` (the `pcie_ipc_allreduce` check)
saw them finish and agree with NCCL on the same GPUs, driver and image build. That check is kept on the cache volume
(configuration/state.py PCIE_IPC_CHECK) with the fingerprint of the box it ran on; a record of another fingerprint
is stale and the check must run again.

    decide(choice, layout, record, current) -> Choice(backend, why)

`choice` is the operator's GLM5_ALLREDUCE (auto, nccl, pcie_ipc), `layout` the attention layout (latency: TP
attention, throughput: DP attention). The caller sets Choice.env() in the server's environment and logs `why`.

The kernels' case rests on SGLang 0.5.23's docstring (srt/distributed/device_communicators/pcie_ipc_ar.py:21): one
decode row's all-reduce (12 KiB: hidden 6144 in bf16) in 5.3 us against NCCL's 205.1 us, on one 8x SM120 host. Other
8x RTX PRO 6000 boxes measured NCCL near 24 us there, so every `why` ends with NCCL's 12 KiB time as the kept check
measured it beside the docstring's (`small_message`), or says that none was measured: the premise judged on the box.
Pure: no GPU; `current_fingerprint` reads nvidia-smi (one query), and says why when it cannot.
Stdlib only, cheap to import.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any, NamedTuple

CHOICES = ("auto", "nccl", "pcie_ipc")
LAYOUTS = ("latency", "throughput")  # TP attention, DP attention
SERVER_ENV = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"  # srt/environ.py:1539, read in pcie_ipc_ar.py:103
FINGERPRINT_QUERY = "index,name,pci.bus_id,uuid,driver_version"
RUN_CHECK = "run `entrypoint/doctor --ipc`"
# SGLang 0.5.23's measured premise for the kernels, in the pinned wheel's sglang/ (tests/test_allreduce_choice.py
# reads the line): 12 KiB, the kernels 5.3 us, NCCL 205.1 us.
PREMISE_FILE = "srt/distributed/device_communicators/pcie_ipc_ar.py"
PREMISE_LINE = 21
PREMISE_KERNELS_US = 5.3
PREMISE_NCCL_US = 205.1
PREMISE = (
    f"SGLang 0.5.23's premise: {PREMISE_NCCL_US} us "
    f"(the kernels {PREMISE_KERNELS_US} us, {PREMISE_FILE}:{PREMISE_LINE})"
)
SMALL_MESSAGE_BYTES = 6144 * 2  # one decode row of GLM-5 (hidden 6144) in bf16: 12 KiB, batch 1's all-reduce
DP_ATTENTION = (
    "DP attention leaves the kernels only the tp group's DP-gather all-reduces (pcie_ipc_ar.py "
    "_ELIGIBLE_GROUP_NAMES; dp_attention.py SUM_LEN), which the check does not measure"
)


class Fingerprint(NamedTuple):
    """What the check's verdict depends on: each GPU (name, PCI bus id, UUID, by index), the driver, the image."""

    gpus: tuple[str, ...]
    driver: str
    build_id: str

    def as_json(self) -> dict[str, Any]:
        return {"gpus": list(self.gpus), "driver": self.driver, "build_id": self.build_id}


class Choice(NamedTuple):
    backend: str  # "pcie_ipc" or "nccl"
    why: str  # one sentence for the log and the dry run

    def env(self) -> dict[str, str]:
        """The server environment this choice sets: SGLang's switch for pcie_ipc alone (NCCL is its default)."""
        return {SERVER_ENV: "1"} if self.backend == "pcie_ipc" else {}


def fingerprint_from_json(data: object) -> Fingerprint | None:
    """A record's fingerprint, or None when it has none or a malformed one (then it matches no box)."""
    if not isinstance(data, dict):
        return None
    gpus, driver, build = data.get("gpus"), data.get("driver"), data.get("build_id")
    if not (isinstance(gpus, list) and gpus and all(isinstance(g, str) for g in gpus)):
        return None
    if not (isinstance(driver, str) and isinstance(build, str)):
        return None
    return Fingerprint(tuple(gpus), driver, build)


def parse_fingerprint(csv_text: str, build_id: str) -> Fingerprint | None:
    """nvidia-smi --query-gpu=FINGERPRINT_QUERY --format=csv as a Fingerprint; None when it lists no GPU."""
    rows = list(csv.reader(io.StringIO(csv_text.strip()), skipinitialspace=True))
    if len(rows) < 2:
        return None
    header = [h.split(" [")[0].strip() for h in rows[0]]
    if header != FINGERPRINT_QUERY.split(","):
        return None
    gpus = [dict(zip(header, (v.strip() for v in r), strict=False)) for r in rows[1:] if r]
    drivers = sorted({g.get("driver_version", "") for g in gpus})
    return Fingerprint(
        tuple(f"{g.get('name')} {g.get('pci.bus_id')} {g.get('uuid')}" for g in gpus),
        ",".join(drivers),
        build_id,
    )


def current_fingerprint(
    build_id: str, environ: Mapping[str, str] | None = None, nvidia_smi: str = "nvidia-smi"
) -> tuple[Fingerprint | None, str]:
    """This box's fingerprint from one nvidia-smi query (a fraction of a second), or None and why not (a laptop's
    dry run: nvidia-smi is not installed here)."""
    path = None if environ is None else environ.get("PATH")
    if shutil.which(nvidia_smi, path=path) is None:
        return None, f"{nvidia_smi} is not installed here"
    try:
        done = subprocess.run(
            [nvidia_smi, f"--query-gpu={FINGERPRINT_QUERY}", "--format=csv"],
            capture_output=True, text=True, timeout=30, check=False,
            env=None if environ is None else dict(environ),
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"{nvidia_smi} did not answer ({err})"
    if done.returncode != 0:
        return (
            None,
            f"{nvidia_smi} failed (exit {done.returncode}): {(done.stdout + done.stderr).strip()[:200]}",
        )
    found = parse_fingerprint(done.stdout, build_id)
    return (found, "") if found is not None else (None, f"{nvidia_smi} lists no GPU")


def changed(recorded: Fingerprint, current: Fingerprint) -> list[str]:
    """What differs between the record's box and this one: gpus, driver, image."""
    parts = (("GPUs", recorded.gpus != current.gpus), ("driver", recorded.driver != current.driver),
             ("image", recorded.build_id != current.build_id))  # fmt: skip
    return [name for name, differs in parts if differs]


def stale(record: Mapping[str, Any] | None, current: Fingerprint | None, unread: str = "") -> str | None:
    """Why the kept check does not speak for this box (the check must run), or None when it does."""
    if record is None:
        return f"no all-reduce check recorded for this box; {RUN_CHECK}"
    if current is None:
        return f"this box's GPUs cannot be read ({unread or 'no nvidia-smi reading'}), so no check can be matched"
    recorded = fingerprint_from_json(record.get("fingerprint"))
    if recorded is None:
        return f"the recorded check names no GPUs; {RUN_CHECK}"
    differs = changed(recorded, current)
    if differs:
        return f"the record is from other {'/'.join(differs)} than this box's; {RUN_CHECK}"
    return None


def passed_on(record: Mapping[str, Any]) -> str:
    build = (record.get("fingerprint") or {}).get("build_id", "?")
    return f"the doctor's check passed on these GPUs at {record.get('at', '?')} (build {build})"


def failed_because(record: Mapping[str, Any]) -> str:
    return f"the check failed on these GPUs at {record.get('at', '?')}: {record.get('error') or record.get('detail')}"


def small_row(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The kept check's 12 KiB size (one decode row) with NCCL's time, or None when it has none."""
    for row in record.get("sizes") or []:
        if (
            isinstance(row, dict)
            and row.get("bytes") == SMALL_MESSAGE_BYTES
            and isinstance(row.get("nccl_seconds"), int | float)
        ):
            return row
    return None


def microseconds(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us"


def small_message(record: Mapping[str, Any] | None, current: Fingerprint | None, unread: str = "") -> str:
    """NCCL's 12 KiB all-reduce as the kept check timed it (its slowest rank), the kernels' beside it, and the
    docstring's premise; never a figure the check did not measure."""
    if record is None:
        return f"NCCL at 12 KiB: not measured on this box (no check kept); {PREMISE}"
    row = small_row(record)
    if row is None:
        return f"NCCL at 12 KiB: not in the kept check; {PREMISE}"
    where = (
        "this box's check"
        if stale(record, current, unread) is None
        else "a kept check that is not this box's"
    )
    ipc = row.get("ipc_seconds")
    kernels = (
        f"the kernels {microseconds(ipc)}" if isinstance(ipc, int | float) else "not served by the kernels"
    )
    return f"NCCL at 12 KiB: {microseconds(row['nccl_seconds'])} in {where} ({kernels}); {PREMISE}"


def decide(
    choice: str,
    layout: str,
    record: Mapping[str, Any] | None,
    current: Fingerprint | None,
    unread: str = "",
) -> Choice:
    """The start's all-reduce. nccl: always NCCL. pcie_ipc: the kernels, the operator's call, the why saying whether
    a check stands behind it. auto: the kernels only with TP attention and a passing check of this very box. With DP
    attention the kernels serve the "tp" group alone (pcie_ipc_ar.py:86 _ELIGIBLE_GROUP_NAMES), whose all-reduces
    are then the DP gathers of the summed batch (srt/layers/dp_attention.py:155, 713), not the per-layer reductions
    of hidden-wide decode rows the check measures: auto keeps NCCL there. Each `why` ends with `small_message`."""
    if choice not in CHOICES:
        raise ValueError(f"GLM5_ALLREDUCE={choice!r}: one of {', '.join(CHOICES)}")
    if layout not in LAYOUTS:
        raise ValueError(f"attention layout {layout!r}: one of {', '.join(LAYOUTS)}")
    backend, why = choose(choice, layout, record, current, unread)
    return Choice(backend, f"{why}; {small_message(record, current, unread)}")


def choose(
    choice: str, layout: str, record: Mapping[str, Any] | None, current: Fingerprint | None, unread: str
) -> tuple[str, str]:
    """decide's backend and reason, before the 12 KiB figures."""
    if choice == "nccl":
        return ("nccl", "NCCL: GLM5_ALLREDUCE=nccl")
    why_not = stale(record, current, unread)
    if why_not is None and record is not None and not record.get("ok"):
        why_not = failed_because(record)
    if choice == "pcie_ipc":
        backing = passed_on(record) if why_not is None and record is not None else f"not checked: {why_not}"
        return ("pcie_ipc", f"PCIe-IPC all-reduce: GLM5_ALLREDUCE=pcie_ipc forces it ({backing})")
    if layout == "throughput":
        return ("nccl", f"NCCL: {DP_ATTENTION}")
    if why_not is not None or record is None:
        return ("nccl", f"NCCL: {why_not}")
    return ("pcie_ipc", f"PCIe-IPC all-reduce: {passed_on(record)}")
