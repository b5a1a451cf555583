"""A real all-reduce over every visible GPU: torch.distributed with NCCL, one process per GPU.

    python3 -m entrypoint.allreduce [--sizes 1M,16M,256M,1G] [--iters 20] [--timeout 120] [--json]

Each process fills a float32 tensor with (rank + 1); after the all-reduce every element must be
n(n+1)/2. It reports, per message size, the time of one all-reduce and the bus bandwidth as nccl-tests
defines it (algbw x 2(n-1)/n). A collective that does not finish within --timeout is a hang (the known
failure of NCCL peer-to-peer on PCIe hosts with ACS or IOMMU redirection): the run fails instead of
waiting. The doctor's `nccl_allreduce` check runs this; it needs the GPUs, so it is opt-in (--nccl).
Exit codes: 0 every size correct, 1 a wrong sum, a hang or a failed process, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = UNITS.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in UNITS else text
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: use a size like 1M or 256M")
    return int(number) * scale


def worker(rank: int, world: int, port: int, sizes: list[int], iters: int, queue: Any) -> None:
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


def run(sizes: list[int], iters: int, timeout: float) -> dict[str, Any]:
    import socket

    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    if world < 2:
        return {"ok": False, "gpus": world, "error": f"{world} GPU(s) visible: an all-reduce needs 2 or more"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, port, sizes, iters, queue)) for r in range(world)]
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
        return out | {"ok": False, "error": f"ranks {hung} did not finish within {timeout:g} s: a hang"}
    failed = [i for i, p in enumerate(procs) if p.exitcode != 0]
    reports = dict(queue.get(timeout=30) for _ in range(world)) if not failed else {}
    if failed or len(reports) != world:
        return out | {"ok": False, "error": f"ranks {failed} exited {[procs[i].exitcode for i in failed]}"}
    rows = reports[0]
    for rank_rows in reports.values():  # a size is correct only where every rank got the right sum
        for row, theirs in zip(rows, rank_rows, strict=True):
            row["correct"] = row["correct"] and theirs["correct"]
    wrong = [r["bytes"] for r in rows if not r["correct"]]
    out |= {"sizes": rows, "ok": not wrong}
    if wrong:
        out["error"] = f"wrong sum for message sizes {wrong}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m entrypoint.allreduce", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sizes", default="1M,16M,256M,1G", help="message sizes, comma list (K, M, G)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=120, help="seconds before the run counts as a hang")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    result = run(sizes, args.iters, args.timeout)
    if args.json:
        print(json.dumps(result))
    else:
        for r in result.get("sizes", []):
            print(
                f"allreduce {r['bytes'] / 2**20:8.0f} MiB  {r['seconds'] * 1e3:9.3f} ms  busbw {r['busbw_gbps']:7.2f} GB/s"
                f"  {'ok' if r['correct'] else 'WRONG SUM'}"
            )
        print(f"allreduce: {'ok' if result['ok'] else 'FAILED: ' + result['error']} ({result['gpus']} GPUs)")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
