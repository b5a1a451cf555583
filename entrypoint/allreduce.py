"""A real all-reduce over every visible GPU: torch.distributed with NCCL, one process per GPU.

    python3 -m entrypoint.allreduce [--sizes 1M,16M,256M,1G] [--iters 20] [--timeout 120] [--json]
    python3 -m entrypoint.allreduce --backend pcie_ipc [--rows 1,2,4,...,512] [--hidden 6144] [--tune] [--json]

Each process fills a float32 tensor with (rank + 1); after the all-reduce every element must be
n(n+1)/2. It reports, per message size, the time of one all-reduce and the bus bandwidth as nccl-tests
defines it (algbw x 2(n-1)/n). A collective that does not finish within --timeout is a hang (the known
failure of NCCL peer-to-peer on PCIe hosts with ACS or IOMMU redirection): the run fails instead of
waiting. The doctor's `nccl_allreduce` check runs this; it needs the GPUs, so it is opt-in (--nccl).

`--backend pcie_ipc` checks FlashInfer's PCIe-IPC all-reduce as SGLang 0.5.23 runs it when
SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 (srt/distributed/device_communicators/pcie_ipc_ar.py): bf16 rows x hidden
(GLM-5's 6144) for each decode batch size, one workspace per process built on the NCCL group with
max_numel = widest rows x hidden, the tune rows and the tune cache SGLang gives it (pcie_ipc_ar.py:276-285). Each
rank's input is random; the kernels' result must match NCCL's all-reduce of the same input within the bf16
bound of `tolerance` below, on every rank. A row count the kernels decline (`supports`) is one SGLang leaves on
NCCL (pcie_ipc_ar.py:404): reported, not a failure. The kernels spin on peer flags with no timeout, so a hang
is the likely failure on a box whose peer-to-peer is broken: past --timeout the processes are killed and the
run fails. The doctor's `pcie_ipc_allreduce` check runs this (--ipc). The kernels are compiled first, in this
process, when the image did not prebuild them (kernels/sm120.toml: pcie_ipc_comm is not requested): that time is
reported apart and not counted against --timeout. A size that differs is named with the ranks whose result
differs (`wrong_ranks`), so one bad peer path shows as one rank.

The fault hook (issue 55): `run_ipc(..., fault=Fault(rank, rows))` corrupts that rank's kernel result at that row
count before it is compared with NCCL's (the rank's own input taken out of its sum, as a kernel that lost a push
would leave it), so a run can show the check refusing a wrong rank and naming it. It is off by default (None) and
a Python argument alone: no flag of this CLI, no environment variable, so the doctor (`measure_pcie_ipc` runs this
CLI) can never pass it. Only the tests (tests/test_allreduce_choice.py, on the CPU through `rank_input`,
`Fault.corrupt`, `compare` and `verdict`) and ci/allreduce-check (the GPU run) pass one.
Exit codes: 0 every size correct, 1 a wrong sum, a hang or a failed process, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from configuration.batch_sizes import decode_batch_sizes

UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}
BACKENDS = ("nccl", "pcie_ipc")
MODEL_HIDDEN = (
    6144  # GLM-5's hidden_size (the model's config.json): the trailing dimension of every reduction
)
DECODE_MAX_BS = (
    512  # the kit's decode capture bound (GLM5_CUDA_GRAPH_MAX_BS_DECODE's default): 52 batch sizes
)
IPC_WORLD_SIZES = (2, 4, 8)  # the kernels build IPC channels for these alone (pcie_ipc_ar.py:77)
BF16_UNIT_ROUNDOFF = 2.0**-8  # bf16 keeps 8 significant bits: round to nearest errs by at most 2^-8 relative


class Fault(NamedTuple):
    """Corrupt `rank`'s PCIe-IPC result at `rows` (a row count of the run), for the tests and the GPU run alone."""

    rank: int
    rows: int

    def corrupt(self, out: Any, x: Any, rank: int, rows: int) -> None:
        """On the faulted rank and row count, take the rank's own input `x` out of the kernels' result `out`, in
        place; elsewhere nothing."""
        if (rank, rows) == (self.rank, self.rows):
            out.sub_(x)

    def refusal(self, world: int, rows: list[int]) -> str | None:
        """Why this fault cannot show anything in a run of `world` ranks over `rows`, or None."""
        if not 0 <= self.rank < world:
            return f"the fault names rank {self.rank}, outside ranks 0-{world - 1}"
        if self.rows not in rows:
            return f"the fault names rows {self.rows}, not one of the run's row counts"
        return None


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = UNITS.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in UNITS else text
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: use a size like 1M or 256M")
    return int(number) * scale


def parse_rows(text: str) -> list[int]:
    """A comma list of row counts (decode batch sizes), each a positive integer."""
    rows = []
    for item in (t.strip() for t in text.split(",")):
        if not item.isdigit() or int(item) <= 0:
            raise argparse.ArgumentTypeError(f"{item!r}: rows are positive integers, e.g. 1,2,4,512")
        rows.append(int(item))
    if not rows:
        raise argparse.ArgumentTypeError("no rows given")
    return rows


def tune_rows(widest: int) -> tuple[int, ...]:
    """The row counts SGLang asks the workspace to tune for (pcie_ipc_ar.py:181-192): the powers of two up to 512
    that fit the workspace, and the widest row count itself."""
    powers = [2**k for k in range(10) if 2**k <= widest]
    return tuple(powers if widest in powers else [*powers, widest])


def tolerance(world: int) -> float:
    """How far apart two bf16 all-reduces of the same inputs may be, per element, as a multiple of the sum of the
    inputs' magnitudes there (S). Each addition rounded to bf16 errs by at most u = 2^-8 of a partial sum, and no
    partial sum exceeds S; a ring (NCCL) rounds world - 1 times, the kernels at most as often; so each result
    lies within (world - 1) u S of the exact sum, and the two within 2 (world - 1) u S of each other. 2 world u S
    leaves room for the second-order terms. A lost or misplaced rank's input (about S / world) is far above it."""
    return 2 * world * BF16_UNIT_ROUNDOFF


def join(rank: int, world: int, port: int) -> None:
    """This process's GPU and its place in the NCCL group of every rank (a minute to meet the others)."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
        device_id=torch.device("cuda", rank),
    )


def worker(rank: int, world: int, port: int, sizes: list[int], iters: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    join(rank, world, port)
    rows = []
    for size in sizes:
        n = size // 4
        x = torch.full((n,), float(rank + 1), device="cuda", dtype=torch.float32)
        dist.all_reduce(x)  # warm-up (and the correctness check below)
        torch.cuda.synchronize()
        expected = world * (world + 1) / 2
        correct = bool(torch.all(x == expected).item())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000 / iters
        algbw = size / seconds / 1e9
        rows.append(
            {
                "bytes": size,
                "seconds": round(seconds, 6),
                "algbw_gbps": round(algbw, 2),
                "busbw_gbps": round(algbw * 2 * (world - 1) / world, 2),
                "correct": correct,
            }
        )
    dist.destroy_process_group()
    queue.put((rank, rows))  # every rank checks its own copy of the sum


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(
    target: Callable[..., None], world: int, args: tuple[Any, ...], timeout: float
) -> tuple[dict[str, Any], dict[int, Any]]:
    """One process per GPU running target(rank, world, port, *args, queue); each puts (rank, rows). Returns what
    every report has (gpus, nccl_env, seconds, and ok/error when a rank hung or failed) and the rows by rank. A
    rank not done within `timeout` is a hang: every process is killed."""
    import torch.multiprocessing as mp

    port = free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, queue)) for r in range(world)]
    began = time.monotonic()
    for p in procs:
        p.start()
    deadline = began + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    env = {k: os.environ[k] for k in sorted(os.environ) if k.startswith("NCCL_")}
    out: dict[str, Any] = {"gpus": world, "nccl_env": env, "seconds": round(time.monotonic() - began, 1)}
    if hung:
        return out | {"ok": False, "error": f"ranks {hung} did not finish within {timeout:g} s: a hang"}, {}
    failed = [i for i, p in enumerate(procs) if p.exitcode != 0]
    reports = dict(queue.get(timeout=30) for _ in range(world)) if not failed else {}
    if failed or len(reports) != world:
        return out | {
            "ok": False,
            "error": f"ranks {failed} exited {[procs[i].exitcode for i in failed]}",
        }, {}
    return out, reports


def run(sizes: list[int], iters: int, timeout: float) -> dict[str, Any]:
    import torch

    world = torch.cuda.device_count()
    if world < 2:
        return {"ok": False, "gpus": world, "error": f"{world} GPU(s) visible: an all-reduce needs 2 or more"}
    out, reports = spawn(worker, world, (sizes, iters), timeout)
    if not reports:
        return out
    rows = reports[0]
    for rank_rows in reports.values():  # a size is correct only where every rank got the right sum
        for row, theirs in zip(rows, rank_rows, strict=True):
            row["correct"] = row["correct"] and theirs["correct"]
    wrong = [r["bytes"] for r in rows if not r["correct"]]
    out |= {"sizes": rows, "ok": not wrong}
    if wrong:
        out["error"] = f"wrong sum for message sizes {wrong}"
    return out


# ---- --backend pcie_ipc: FlashInfer's PCIe-IPC all-reduce against NCCL's ----------------------------------------


def cuda_seconds(step: Callable[[], Any], iters: int) -> float:
    """The mean time of one step on the current stream, by CUDA events (after one untimed step)."""
    import torch

    step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1000 / iters


def rank_input(rows: int, hidden: int, rank: int, device: str) -> Any:
    """This rank's input at a row count: rows x hidden bf16, random, the same for a rank and row count each run."""
    import torch

    generator = torch.Generator(device=device).manual_seed(1000 * rows + rank)
    x = torch.randn((rows, hidden), generator=generator, device=device, dtype=torch.float32)
    return x.to(torch.bfloat16)


def compare(out: Any, nccl: Any, magnitude: Any, world: int) -> dict[str, Any]:
    """The kernels' result `out` against NCCL's `nccl` (bf16), within `tolerance` of `magnitude` (S, fp32)."""
    error = (out.float() - nccl.float()).abs()
    outside = int((error > tolerance(world) * magnitude).sum().item())
    largest = float(error.max().item())
    return {
        "max_error": round(largest, 6),
        "outside_bound": outside,
        "exact": largest == 0,
        "correct": outside == 0,
    }


def ipc_row(
    workspace: Any, rows: int, hidden: int, rank: int, world: int, iters: int, fault: Fault | None = None
) -> dict[str, Any]:
    """One row count: the kernels' result against NCCL's on the same random input, and both times."""
    import torch
    import torch.distributed as dist

    x = rank_input(rows, hidden, rank, "cuda")
    nccl = x.clone()
    dist.all_reduce(nccl)
    magnitude = x.abs().float()
    dist.all_reduce(magnitude)  # S: the sum over ranks of |input|, per element (fp32)
    scratch = x.clone()
    row: dict[str, Any] = {"rows": rows, "bytes": x.numel() * x.element_size()}
    row["nccl_seconds"] = round(cuda_seconds(lambda: dist.all_reduce(scratch), iters), 7)
    served = bool(workspace.supports(x))  # a pure function of shape: every rank answers alike
    row["served"] = served
    if not served:  # SGLang keeps this reduction on NCCL (pcie_ipc_ar.py:404)
        return row | {"ipc_seconds": None, "max_error": None, "correct": True}
    out = workspace.all_reduce(x)
    torch.cuda.synchronize()
    if fault is not None:
        fault.corrupt(out, x, rank, rows)
    judged = compare(out, nccl, magnitude, world)
    row["ipc_seconds"] = round(cuda_seconds(lambda: workspace.all_reduce(x, out=out), iters), 7)
    return row | judged


def ipc_worker(
    rank: int,
    world: int,
    port: int,
    rows: list[int],
    hidden: int,
    iters: int,
    tune: bool,
    fault: Fault | None,
    queue: Any,
) -> None:
    import torch
    import torch.distributed as dist
    from flashinfer.comm import PcieIpcAllReduceWorkspace
    from flashinfer.comm.pcie_ipc_tuning import default_cache_path

    join(rank, world, port)
    widest = max(rows)
    # As SGLang builds it (pcie_ipc_ar.py:276-285): on a CUDA (NCCL) group of every rank, the tp group's
    # device_group (parallel_state.py:495-499), for the widest decode reduction.
    workspace = PcieIpcAllReduceWorkspace(
        group=dist.new_group(list(range(world)), backend="nccl"),
        max_numel=widest * hidden,
        dtype=torch.bfloat16,
        tune_batches=tune_rows(widest),
        tune_cache=default_cache_path(world),
    )
    if tune:  # as SGLang's prepare() does at warm-up (pcie_ipc_ar.py:359-361): timed on a host (gloo) group
        workspace.tune([hidden], dtype=torch.bfloat16, tune_group=dist.new_group(backend="gloo"))
    found = [ipc_row(workspace, r, hidden, rank, world, iters, fault) for r in rows]
    workspace.destroy()
    dist.destroy_process_group()
    queue.put((rank, found))


def compile_ipc_kernels() -> float:
    """Build (or load) FlashInfer's pcie_ipc_comm module here, once, before the timed processes: seconds taken."""
    from flashinfer.comm.pcie_ipc_ar import get_pcie_ipc_comm_module

    began = time.monotonic()
    get_pcie_ipc_comm_module()
    return round(time.monotonic() - began, 1)


def merge_ranks(reports: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per row count: correct (and exact) only where every rank's was, the ranks whose was not, times and error the
    slowest and largest rank's."""
    merged = [dict(row) | {"wrong_ranks": []} for row in reports[0]]
    for rank, rank_rows in sorted(reports.items()):
        for row, theirs in zip(merged, rank_rows, strict=True):
            row["correct"] = row["correct"] and theirs["correct"]
            if not theirs["correct"]:
                row["wrong_ranks"].append(rank)
            if "exact" in theirs:
                row["exact"] = row["exact"] and theirs["exact"]
            for key in ("ipc_seconds", "nccl_seconds", "max_error", "outside_bound"):
                if theirs.get(key) is not None:
                    row[key] = max(row[key], theirs[key])
    return merged


def size_text(size: int) -> str:
    return f"{size / 2**10:g} KiB" if size < 2**20 else f"{size / 2**20:g} MiB"


def verdict(reports: dict[int, list[dict[str, Any]]], world: int) -> dict[str, Any]:
    """The report's verdict from every rank's rows: each size that differs named with its ranks."""
    merged = merge_ranks(reports)
    wrong = [r for r in merged if not r["correct"]]
    found: dict[str, Any] = {"tolerance": tolerance(world), "sizes": merged, "ok": not wrong}
    if wrong:
        found["error"] = "PCIe-IPC result differs from NCCL's beyond the bf16 bound: " + "; ".join(
            f"rows {r['rows']} ({size_text(r['bytes'])}) on rank{'s' if len(r['wrong_ranks']) > 1 else ''} "
            f"{', '.join(map(str, r['wrong_ranks']))} ({r['outside_bound']} elements outside, max {r['max_error']})"
            for r in wrong
        )
    return found


def run_ipc(
    rows: list[int], hidden: int, iters: int, timeout: float, tune: bool = False, fault: Fault | None = None
) -> dict[str, Any]:
    """The check on every visible GPU; `fault` (off: None) for the tests and the GPU run alone (the docstring)."""
    import torch

    world = torch.cuda.device_count()
    base: dict[str, Any] = {"backend": "pcie_ipc", "gpus": world, "hidden": hidden, "dtype": "bfloat16"}
    if world not in IPC_WORLD_SIZES:
        return base | {
            "ok": False,
            "error": f"{world} GPU(s) visible: FlashInfer's PCIe-IPC all-reduce runs on 2, 4 or 8 "
            "(pcie_ipc_ar.py:77)",
        }
    refused = None if fault is None else fault.refusal(world, rows)
    if refused is not None:
        return base | {"ok": False, "error": refused}
    try:
        base["compile_seconds"] = compile_ipc_kernels()
    except Exception as err:  # noqa: BLE001 (no kernels: what SGLang would fall back from, reported)
        return base | {
            "ok": False,
            "error": f"FlashInfer's pcie_ipc_comm did not build: {type(err).__name__}: {err}",
        }
    out, reports = spawn(ipc_worker, world, (rows, hidden, iters, tune, fault), timeout)
    if not reports:
        return base | out
    return base | out | verdict(reports, world)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python3 -m entrypoint.allreduce", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--backend", choices=BACKENDS, default="nccl", help="nccl (the default) or pcie_ipc")
    parser.add_argument("--sizes", help="nccl: message sizes, comma list (K, M, G); default 1M,16M,256M,1G")
    parser.add_argument(
        "--rows",
        type=parse_rows,
        help="pcie_ipc: decode batch sizes, comma list; default the kit's 52 (1-512)",
    )
    parser.add_argument(
        "--hidden", type=int, default=MODEL_HIDDEN, help="pcie_ipc: the hidden size (GLM-5: 6144)"
    )
    parser.add_argument(
        "--tune", action="store_true", help="pcie_ipc: tune the kernels first, as SGLang's warm-up"
    )
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=120, help="seconds before the run counts as a hang")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.backend == "nccl" and (args.rows is not None or args.tune or args.hidden != MODEL_HIDDEN):
        parser.error("--rows, --hidden and --tune go with --backend pcie_ipc")
    if args.backend == "pcie_ipc" and args.sizes is not None:
        parser.error("--sizes goes with --backend nccl (pcie_ipc takes --rows)")
    if args.hidden <= 0 or args.hidden % 8:
        parser.error(f"--hidden {args.hidden}: a positive multiple of 8 (the kernels move 16-byte packs)")
    if args.iters <= 0 or args.timeout <= 0:
        parser.error("--iters and --timeout are positive")
    if args.backend == "nccl":
        args.sizes = [parse_size(s) for s in (args.sizes or "1M,16M,256M,1G").split(",") if s.strip()]
    elif args.rows is None:
        args.rows = decode_batch_sizes(DECODE_MAX_BS)
    return args


def print_nccl(result: dict[str, Any]) -> None:
    for r in result.get("sizes", []):
        print(
            f"allreduce {r['bytes'] / 2**20:8.0f} MiB  {r['seconds'] * 1e3:9.3f} ms  busbw {r['busbw_gbps']:7.2f} GB/s"
            f"  {'ok' if r['correct'] else 'WRONG SUM'}"
        )


def print_ipc(result: dict[str, Any]) -> None:
    for r in result.get("sizes", []):
        nccl = f"nccl {r['nccl_seconds'] * 1e3:8.3f} ms"
        if not r["served"]:
            print(f"pcie_ipc rows {r['rows']:4}  not served by the kernels (NCCL)  {nccl}")
            continue
        verdict = "ok" if r["correct"] else f"DIFFERS ({r['outside_bound']} elements, max {r['max_error']})"
        print(f"pcie_ipc rows {r['rows']:4}  ipc {r['ipc_seconds'] * 1e3:8.3f} ms  {nccl}  {verdict}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend == "pcie_ipc":
        result = run_ipc(args.rows, args.hidden, args.iters, args.timeout, args.tune)
    else:
        result = run(args.sizes, args.iters, args.timeout)
    if args.json:
        print(json.dumps(result))
    else:
        (print_ipc if args.backend == "pcie_ipc" else print_nccl)(result)
        print(f"allreduce: {'ok' if result['ok'] else 'FAILED: ' + result['error']} ({result['gpus']} GPUs)")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
