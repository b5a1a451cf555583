#!/usr/bin/env python3
"""TEST DOUBLE of nvidia-smi: not NVIDIA's tool. It prints real outputs of real boxes (tests/fixtures/doctor/,
each cited in SOURCES.md) for the commands the doctor runs, and answers --query-gpu for whatever fields are
asked, as nvidia-smi does: the header is the field names, comma-separated, with the unit in brackets for
fields that have one (`memory.total [MiB]`, `power.limit [W]`: as in the real outputs quoted there), one row
per GPU, `[N/A]` for a field the GPU does not report (query-gpu-gb10-memory-total-na-noheader.txt), and exit 2
with `Field "X" is not a valid field to query.` and a blank line on stdout for a name nvidia-smi does not know
(as quoted in github.com/CoHDI/composable-resource-operator/issues/37: "command terminated with exit code 2",
stdout 'Field \"device_minor\" is not a valid field to query.\n\n').

The box is a JSON file named by NVIDIA_SMI_DOUBLE_BOX: {"gpus": [{field: value}], "files": {"topo -m": path,
"topo -p2p r": path, "topo -p2p w": path, "-L": path}}; a command without a file exits 1 as a box without
that reading would.
"""

from __future__ import annotations

import json
import os
import sys

UNITS = {
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "power.limit": "W",
    "power.default_limit": "W",
    "power.max_limit": "W",
    "power.min_limit": "W",
    "enforced.power.limit": "W",
    "power.draw": "W",
}
VALID = set(UNITS) | {
    "index",
    "name",
    "pci.bus_id",
    "compute_cap",
    "driver_version",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.gen.gpumax",
    "pcie.link.gen.hostmax",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "mig.mode.current",
    "mig.mode.pending",
    # The GPU's UUID, as `nvidia-smi -L` prints it (tests/fixtures/doctor/smi-L-8x-rtx-pro-6000-server.txt:1,
    # "GPU-8b89b58e-...") and -q as "GPU UUID" (smi-q-rtx-pro-6000-server-600w-first-gpu.txt:27); a --query-gpu
    # property in nvidia-smi(1) (manpages.ubuntu.com/manpages/plucky/man1/nvidia-smi.1.html), no unit.
    "uuid",
}


def main(argv: list[str]) -> int:
    with open(os.environ["NVIDIA_SMI_DOUBLE_BOX"]) as fh:
        box = json.load(fh)
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is not None:
        fields = query.split(",")
        bad = [f for f in fields if f not in VALID]
        if bad:
            print(f'Field "{bad[0]}" is not a valid field to query.\n')
            return 2
        print(", ".join(f"{f} [{UNITS[f]}]" if f in UNITS else f for f in fields))
        for gpu in box["gpus"]:
            print(", ".join(str(gpu.get(f, "[N/A]")) for f in fields))
        return 0
    path = box.get("files", {}).get(" ".join(argv))
    if path is None:
        print(f"(no reading of `nvidia-smi {' '.join(argv)}` for this box)", file=sys.stderr)
        return 1
    with open(path, "rb") as fh:
        sys.stdout.buffer.write(fh.read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
