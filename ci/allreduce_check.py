"""The all-reduce check on N local GPUs, clean and with one rank's result corrupted: the multi-GPU run (issue 55).

    ci/allreduce-check [--gpus N] [--fault-rank R] [--fault-rows ROWS] [--out DIR] [--json]

Two runs of entrypoint/allreduce.py's PCIe-IPC check (FlashInfer's kernels against NCCL at bf16, hidden 6144, the
kit's 52 decode batch sizes), each kept as the doctor keeps it and decided from as a start decides:
1. clean: the doctor's own check, unchanged (`entrypoint/doctor --ipc`: doctor.check_pcie_ipc with
   measure_pcie_ipc, which runs `python3 -m entrypoint.allreduce --backend pcie_ipc --json` in the server's cache
   environment);
2. faulted: the same check, with entrypoint/allreduce.run_ipc(..., fault=Fault(R, ROWS)) run in this process: rank
   R's result corrupted at ROWS rows (default: the last rank, 1 row = 12 KiB). The check must refuse it, naming that
   size and that rank alone.
Each record goes to DIR/clean or DIR/fault (default: a new folder under /tmp), never to the box's cache volume, where
a faulted record would keep the start on NCCL. Per size it prints whether the kernels' sums equal NCCL's (bit-exact),
lie within the bf16 bound (the largest difference) or differ (on which ranks), the kernels' time and NCCL's; then the
doctor's verdict, the start's decision from the record (GLM5_ALLREDUCE=auto, TP attention) and `entrypoint/launch
--dry-run`'s all-reduce line against the clean record: NCCL's 12 KiB time beside SGLang 0.5.23's premise.

Needs: 2, 4 or 8 GPUs (--gpus takes the first N visible); a python3 first on PATH whose torch sees them and whose
site-packages hold flashinfer-python 0.7.2 with flashinfer/comm/pcie_ipc* (the doctor gives its child PYTHONPATH = the
kit alone, so FlashInfer on PYTHONPATH is not found there: install it, e.g. into a venv made with
--system-site-packages over the machine's torch); nvidia-smi. Nothing is installed or compiled here but FlashInfer's
pcie_ipc_comm module, by the check itself. entrypoint/README.md says how to run it.
Exit codes: 0 the clean check passed and the faulted one was refused naming its size and rank, 1 otherwise, 2 bad
usage, 3 an invalid GLM5_* setting.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from common.report import FAILED, INVALID_SETTING, OK, USAGE, Log, Problems
from configuration import allreduce_choice, settings, state
from entrypoint import allreduce, doctor

LOG = Log("ci/allreduce-check")
Measure = Callable[[doctor.Box], dict[str, Any]]


def size_line(row: Mapping[str, Any]) -> str:
    """One decode size of a record: the sums' verdict, the kernels' time, NCCL's."""
    head = f"rows {row['rows']:4}  {allreduce.size_text(row['bytes']):>8}"
    nccl = f"nccl {row['nccl_seconds'] * 1e6:9.1f} us"
    if not row.get("served"):
        return f"{head}  {'not served by the kernels (NCCL)':42}  {'':17}  {nccl}"
    if not row["correct"]:
        ranks = ", ".join(map(str, row.get("wrong_ranks", [])))
        sums = f"DIFFERS on rank(s) {ranks}: {row['outside_bound']} outside, max {row['max_error']:g}"
    elif row.get("exact"):
        sums = "sums equal NCCL's (bit-exact)"
    else:
        sums = f"within the bf16 bound (max diff {row['max_error']:g})"
    return f"{head}  {sums:42}  ipc {row['ipc_seconds'] * 1e6:9.1f} us  {nccl}"


def check(
    name: str, box: doctor.Box, values: Mapping[str, Any], measure: Measure
) -> tuple[doctor.Check, dict[str, Any], allreduce_choice.Choice]:
    """The doctor's check with `measure`, kept under values["cache_dir"], its report and the start's decision."""
    seen: dict[str, Any] = {}

    def kept(measured_box: doctor.Box) -> dict[str, Any]:
        seen.update(measure(measured_box))
        return seen

    found = doctor.check_pcie_ipc(box, values, kept)
    record = state.read_pcie_ipc_check(values["cache_dir"])
    current = doctor.box_fingerprint(box, values)
    unread = "" if current is not None else "; ".join(box.notes.values()) or "nvidia-smi lists no GPU"
    decided = allreduce_choice.decide("auto", "latency", record, current, unread)
    print(
        f"== {name}: {seen.get('gpus')} GPUs, compile {seen.get('compile_seconds')} s, run {seen.get('seconds')} s"
    )
    if "tolerance" in seen:
        print(
            f"   bound: |kernels - NCCL| <= {seen['tolerance']:g} x the sum of the ranks' |inputs|, per element"
        )
    for row in seen.get("sizes", []):
        print(f"   {size_line(row)}")
    print(f"   {doctor.line(found)}")
    print(f"   decision: {decided.backend}: {decided.why}")
    return found, seen, decided


def refused(result: Mapping[str, Any], fault: allreduce.Fault) -> bool:
    """The faulted run was refused for the faulted size, on the faulted rank alone, and for nothing else, and its
    error names both."""
    wrong = [(r["rows"], r.get("wrong_ranks")) for r in result.get("sizes", []) if not r["correct"]]
    named = f"rows {fault.rows} (" in str(result.get("error")) and f" on rank {fault.rank} (" in str(
        result.get("error")
    )
    return result.get("ok") is False and wrong == [(fault.rows, [fault.rank])] and named


def dry_run_lines(cache_dir: Path, environ: Mapping[str, str]) -> list[str]:
    """entrypoint/launch --dry-run's all-reduce lines with the clean record as the cache volume's."""
    env = {**environ, "GLM5_CACHE_DIR": str(cache_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "entrypoint.launch", "--dry-run"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("# all-reduce")]
    return lines or [
        f"(the dry run printed no all-reduce line; exit {done.returncode}: {done.stderr.strip()[-300:]})"
    ]


def run_both(
    box: doctor.Box,
    values: Mapping[str, Any],
    out: Path,
    clean: Measure,
    faulted: Measure,
    fault: allreduce.Fault,
) -> tuple[int, dict[str, Any]]:
    """Both checks, printed; the exit code and a summary for the run's note."""
    passed, clean_result, clean_choice = check(
        "clean", box, {**values, "cache_dir": str(out / "clean")}, clean
    )
    print(
        f"== faulted: rank {fault.rank}'s result corrupted at rows {fault.rows} (entrypoint/allreduce.Fault)"
    )
    failed, fault_result, fault_choice = check(
        "faulted", box, {**values, "cache_dir": str(out / "fault")}, faulted
    )
    good = passed.status == "pass" and refused(fault_result, fault)
    verdict = (
        "the clean check passed and the faulted one was refused, naming its size and rank"
        if good
        else f"clean: {passed.status}; faulted: {failed.status}, expected a refusal of rows {fault.rows} on rank "
        f"{fault.rank} alone"
    )
    print(f"allreduce-check: {'ok' if good else 'FAILED'}: {verdict}")
    summary = {
        "ok": good,
        "fault": fault._asdict(),
        "clean": {"check": passed.status, "detail": passed.detail, "report": clean_result,
                  "decision": clean_choice._asdict()},
        "faulted": {"check": failed.status, "detail": failed.detail, "report": fault_result,
                    "decision": fault_choice._asdict()},
    }  # fmt: skip
    return (OK if good else FAILED), summary


def versions() -> dict[str, str]:
    found = {}
    for package in ("torch", "flashinfer-python", "sglang"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def first_gpus(count: int, environ: Mapping[str, str]) -> str:
    """CUDA_VISIBLE_DEVICES for the first `count` GPUs of those visible now."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in visible.split(",") if i.strip()] if visible else [str(i) for i in range(count)]
    if len(ids) < count:
        raise ValueError(f"--gpus {count}: CUDA_VISIBLE_DEVICES={visible} names fewer GPUs")
    return ",".join(ids[:count])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ci/allreduce-check", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gpus", type=int, choices=allreduce.IPC_WORLD_SIZES, help="the first N GPUs (default: all)"
    )
    parser.add_argument(
        "--fault-rank", type=int, help="the rank whose result is corrupted (default: the last)"
    )
    parser.add_argument(
        "--fault-rows",
        type=int,
        default=1,
        help="the decode batch size corrupted, one the kernels serve (default 1: 12 KiB)",
    )
    parser.add_argument(
        "--out", type=Path, help="where both records and summary.json go (default: a new /tmp folder)"
    )
    parser.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.gpus is not None:
        try:
            os.environ["CUDA_VISIBLE_DEVICES"] = first_gpus(args.gpus, os.environ)
        except ValueError as err:
            LOG.error(str(err))
            return USAGE
    original = dict(os.environ)
    try:
        values = settings.resolve(os.environ, where="container")
    except Problems as err:
        LOG.problems(err.problems)
        return INVALID_SETTING
    # As doctor.measure_pcie_ipc gives its child: the server's cache environment, NVLink SHARP off unless set.
    os.environ.update(doctor.server_environment(os.environ))
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    box = doctor.Box()
    current = doctor.box_fingerprint(box, values)
    visible = [i for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i.strip()]
    world = len(visible) or (len(current.gpus) if current is not None else 0)
    last = max(world - 1, 0)
    fault = allreduce.Fault(rank=last if args.fault_rank is None else args.fault_rank, rows=args.fault_rows)
    out = args.out or Path(tempfile.mkdtemp(prefix="allreduce-check-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"allreduce-check: {versions()}; GPUs: {current.gpus if current else 'nvidia-smi unreadable'}")
    print(f"allreduce-check: driver {current.driver if current else '?'}; records under {out}")
    # The run doctor.measure_pcie_ipc asks for: the kit's decode sizes, hidden 6144, the default iterations, 120 s.
    ipc = allreduce.parse_args(["--backend", "pcie_ipc", "--timeout", "120"])

    def faulted(_box: doctor.Box) -> dict[str, Any]:
        return allreduce.run_ipc(ipc.rows, ipc.hidden, ipc.iters, ipc.timeout, fault=fault)

    code, summary = run_both(box, values, out, doctor.measure_pcie_ipc, faulted, fault)
    dry = dry_run_lines(out / "clean", original)
    for line in dry:
        print(f"dry run (clean record): {line}")
    summary |= {
        "versions": versions(),
        "fingerprint": None if current is None else current.as_json(),
        "dry_run": dry,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary))
    return code


if __name__ == "__main__":
    sys.exit(main())
