"""The box decides the all-reduce (issue 42): entrypoint/allreduce's pcie_ipc mode as a CLI, the doctor's
`pcie_ipc_allreduce` check kept on the cache volume with the box's fingerprint, the pure decision from it
(configuration/allreduce_choice.py), and SGLang 0.5.23's PCIe-IPC lines in the log scan. All on the CPU: the GPU
program is replaced by a stand-in report, nvidia-smi by tests/doubles/nvidia_smi_double.py."""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from ci import allreduce_check
from configuration import allreduce_choice as choice
from configuration import state
from configuration.batch_sizes import decode_batch_sizes
from conftest import installed_site
from entrypoint import allreduce, doctor
from healthcheck import logscan, phase
from test_doctor import gpus, install_box
from test_launch import launch

# The UUIDs of a real 8x RTX PRO 6000 Server box (tests/fixtures/doctor/smi-L-8x-rtx-pro-6000-server.txt:1-8).
UUIDS = [
    "GPU-8b89b58e-b427-108d-ac50-06138d78fe78", "GPU-03a041b7-8abf-360a-d1a2-dfd70188cd5f",
    "GPU-ba09367f-dd50-32ca-e988-7ff66bece885", "GPU-30512c46-708b-f374-5698-ee24be6cd626",
    "GPU-4c395b7a-a7e6-d90f-1ced-d96e8dd68288", "GPU-04dc48d7-7048-aef5-ad36-f5db716e7668",
    "GPU-f4f5db98-143f-0a8d-47ce-956fab39a736", "GPU-f4c61521-240a-da09-2787-e576034e197e",
]  # fmt: skip
BUILD = "3f9a0c1d2e4b5a68"  # configuration/config.py BUILD_ID_FORM: 16 hex digits


def box_gpus(**changes: Any) -> list[dict[str, str]]:
    return gpus(8, **({"uuid": lambda i: UUIDS[i]} | changes))


def smi_box(tmp_path: Path, box: list[dict[str, str]]) -> doctor.Box:
    bin_dir, readings = install_box(tmp_path, box, {})
    return doctor.Box({"PATH": f"{bin_dir}:/usr/bin:/bin", "NVIDIA_SMI_DOUBLE_BOX": str(readings)})


def fingerprint_of(tmp_path: Path, box: list[dict[str, str]], build: str = BUILD) -> choice.Fingerprint:
    found = doctor.box_fingerprint(smi_box(tmp_path, box), {"home": str(home_with(tmp_path, build))})
    assert found is not None
    return found


def home_with(tmp_path: Path, build: str) -> Path:
    home = tmp_path / f"home-{build}"
    home.mkdir(exist_ok=True)
    (home / "BUILD-ID").write_text(build + "\n")
    return home


# ---- the stand-in GPU program: entrypoint/allreduce --backend pcie_ipc --json's report (its run_ipc) ----------


def ipc_report(ok: bool = True, error: str | None = None) -> dict[str, Any]:
    rows = [1, 2, 4, 512]
    sizes = [
        {"rows": r, "bytes": r * 6144 * 2, "served": r < 512, "nccl_seconds": 2e-4, "correct": ok,
         "ipc_seconds": 5e-6 if r < 512 else None, "max_error": 0.0 if r < 512 else None}
        for r in rows
    ]  # fmt: skip
    report: dict[str, Any] = {"backend": "pcie_ipc", "gpus": 8, "hidden": 6144, "dtype": "bfloat16", "ok": ok}
    report |= {"sizes": sizes}
    return report | ({"error": error} if error else {})


def run_check(
    tmp_path: Path, report: dict[str, Any], box: list[dict[str, str]] | None = None
) -> doctor.Check:
    values = {"cache_dir": str(tmp_path / "cache"), "home": str(home_with(tmp_path, BUILD))}
    return doctor.check_pcie_ipc(smi_box(tmp_path, box or box_gpus()), values, lambda _box: report)


def reason(decided: choice.Choice) -> str:
    """The decision's reason before the 12 KiB figures every reason ends with (tested apart below)."""
    return decided.why.split("; NCCL at 12 KiB: ")[0]


# ---- the decision -------------------------------------------------------------------------------------------


def test_a_passing_check_of_this_very_box_turns_the_kernels_on_and_nothing_else_does(tmp_path: Path) -> None:
    here = fingerprint_of(tmp_path, box_gpus())
    run_check(tmp_path, ipc_report())
    record = state.read_pcie_ipc_check(tmp_path / "cache")
    on = choice.decide("auto", "latency", record, here)
    assert on.backend == "pcie_ipc" and on.env() == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert reason(on).startswith("PCIe-IPC all-reduce: the doctor's check passed on these GPUs at ")
    assert reason(on).endswith(f"(build {BUILD})")
    # a GPU moved to another slot, a GPU swapped, another driver, another image: stale, NCCL, the check named
    for other, part in (
        (fingerprint_of(tmp_path, box_gpus(pci__bus_id=lambda i: f"00000000:{i + 2:02X}:00.0")), "GPUs"),
        (fingerprint_of(tmp_path, box_gpus(uuid=lambda i: UUIDS[(i + 1) % 8])), "GPUs"),
        (fingerprint_of(tmp_path, box_gpus(driver_version="600.10")), "driver"),
        (fingerprint_of(tmp_path, box_gpus(), build="77aa00bb11cc22dd"), "image"),
    ):
        off = choice.decide("auto", "latency", record, other)
        assert (off.backend, reason(off)) == (
            "nccl",
            f"NCCL: the record is from other {part} than this box's; run `entrypoint/doctor --ipc`",
        )
        assert off.env() == {}
    assert reason(choice.decide("auto", "latency", None, here)) == (
        "NCCL: no all-reduce check recorded for this box; run `entrypoint/doctor --ipc`"
    )
    forced_nccl = choice.decide("nccl", "latency", record, here)
    assert (forced_nccl.backend, reason(forced_nccl)) == ("nccl", "NCCL: GLM5_ALLREDUCE=nccl")
    dp = choice.decide("auto", "throughput", record, here)
    assert dp.backend == "nccl" and "_ELIGIBLE_GROUP_NAMES" in dp.why


def test_a_failed_check_keeps_nccl_with_its_reason_unless_the_operator_forces_the_kernels(
    tmp_path: Path,
) -> None:
    here = fingerprint_of(tmp_path, box_gpus())
    found = run_check(
        tmp_path, {"ok": False, "gpus": 8, "error": "ranks [3] did not finish within 120 s: a hang"}
    )
    assert found.status == "fail" and "a hang (8 GPUs)" in found.detail
    record = state.read_pcie_ipc_check(tmp_path / "cache")
    off = choice.decide("auto", "latency", record, here)
    assert off.backend == "nccl"
    assert reason(off).startswith("NCCL: the check failed on these GPUs at ")
    assert reason(off).endswith(": ranks [3] did not finish within 120 s: a hang")
    forced = choice.decide("pcie_ipc", "latency", record, here)
    assert forced.backend == "pcie_ipc" and forced.env() == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert "forces it (not checked: the check failed" in forced.why
    assert (
        "forces it (not checked: no all-reduce check recorded"
        in choice.decide("pcie_ipc", "latency", None, here).why
    )
    with pytest.raises(ValueError, match="one of auto, nccl, pcie_ipc"):
        choice.decide("ipc", "latency", record, here)


def test_without_nvidia_smi_the_decision_still_says_why(tmp_path: Path) -> None:
    """A laptop's dry run: no nvidia-smi, so no fingerprint, so no record can speak for the box."""
    current, unread = choice.current_fingerprint(BUILD, {"PATH": str(tmp_path)})
    assert (current, unread) == (None, "nvidia-smi is not installed here")
    record = {"ok": True, "at": "2026-12-03T09:00:00+00:00", "fingerprint": None}
    assert reason(choice.decide("auto", "latency", record, current, unread)) == (
        "NCCL: this box's GPUs cannot be read (nvidia-smi is not installed here), so no check can be matched"
    )
    bin_dir, readings = install_box(tmp_path, box_gpus(), {})
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NVIDIA_SMI_DOUBLE_BOX": str(readings)}
    read, _ = choice.current_fingerprint(BUILD, env)
    assert read is not None and read == fingerprint_of(tmp_path, box_gpus())
    assert read.gpus[0] == f"NVIDIA RTX PRO 6000 Blackwell Server Edition 00000000:01:00.0 {UUIDS[0]}"
    assert read.driver == "595.58.03" and read.build_id == BUILD


# ---- the doctor's check and its record ----------------------------------------------------------------------


def test_the_check_is_kept_on_the_cache_volume_with_the_fingerprint(tmp_path: Path) -> None:
    found = run_check(tmp_path, ipc_report())
    assert found.status == "pass", found
    assert found.detail.startswith("8 GPUs, 3 of 4 decode sizes served by the kernels and equal to NCCL's")
    assert "rows 1: 5.0 us vs NCCL 200.0 us" in found.detail
    kept = tmp_path / "cache" / state.PCIE_IPC_CHECK
    assert found.detail.endswith(f"; kept in {kept}")
    record = json.loads(kept.read_text())
    assert record["ok"] is True and record["check"] == "pcie_ipc_allreduce" and len(record["sizes"]) == 4
    assert choice.fingerprint_from_json(record["fingerprint"]) == fingerprint_of(tmp_path, box_gpus())
    # a cache volume that cannot be written: the check still reports, and says it was not kept
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    values = {"cache_dir": str(blocked / "cache"), "home": str(tmp_path)}
    unkept = doctor.check_pcie_ipc(smi_box(tmp_path, box_gpus()), values, lambda _box: ipc_report())
    assert unkept.status == "pass" and "; not kept (" in unkept.detail


def test_doctor_ipc_runs_the_check_and_only_with_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = smi_box(tmp_path, box_gpus())
    monkeypatch.setattr(doctor, "measure_pcie_ipc", lambda _box: ipc_report())
    monkeypatch.setattr(doctor, "Box", lambda **_kw: box)
    for key, value in {"GLM5_CACHE_DIR": str(tmp_path / "cache"), "GLM5_STATE_DIR": str(tmp_path / "run"),
                       "GLM5_LOG_DIR": str(tmp_path / "log")}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    doctor.main(["--json"])  # the other checks read this machine: their verdicts do not matter here
    assert state.read_pcie_ipc_check(tmp_path / "cache") is None
    doctor.main(["--json", "--ipc"])
    assert state.read_pcie_ipc_check(tmp_path / "cache")["ok"] is True  # type: ignore[index]
    assert doctor.main(["--json", "--only", "pcie_ipc_allreduce"]) == 0
    assert "pcie_ipc_allreduce" in doctor.ALL and "pcie_ipc_allreduce" not in doctor.FAST


# ---- entrypoint/allreduce's arguments -----------------------------------------------------------------------


def test_the_allreduce_cli_keeps_its_nccl_mode_and_takes_the_pcie_ipc_one() -> None:
    nccl = allreduce.parse_args(["--sizes", "1M,16M", "--json"])
    assert (nccl.backend, nccl.sizes, nccl.json) == ("nccl", [2**20, 2**24], True)
    assert allreduce.parse_args([]).sizes == [2**20, 2**24, 2**28, 2**30]
    ipc = allreduce.parse_args(["--backend", "pcie_ipc"])
    assert ipc.rows == decode_batch_sizes(512) and len(ipc.rows) == 52 and ipc.hidden == 6144
    assert allreduce.parse_args(["--backend", "pcie_ipc", "--rows", "1,8,64"]).rows == [1, 8, 64]
    for bad in (["--rows", "1,2"], ["--backend", "pcie_ipc", "--sizes", "1M"], ["--backend", "pcie_ipc",
                "--rows", "1,0"], ["--backend", "pcie_ipc", "--hidden", "6145"], ["--backend", "gloo"]):  # fmt: skip
        with pytest.raises(SystemExit) as refused:
            allreduce.parse_args(bad)
        assert refused.value.code == 2, bad


def test_the_tune_rows_and_the_bf16_bound() -> None:
    assert allreduce.tune_rows(512) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    assert allreduce.tune_rows(48) == (1, 2, 4, 8, 16, 32, 48)
    # 8 ranks: 2 x 8 x 2^-8 = 1/16 of the summed magnitudes; one rank's input lost (~1/8 of them) is outside it
    assert allreduce.tolerance(8) == 1 / 16


# ---- SGLang's PCIe-IPC lines in the log ---------------------------------------------------------------------

MARKER = b"===== glm5-serve: server start #1 at 2026-12-03T09:00:00+00:00 pid 7: decode graphs expected 2, prefill 0 =====\n"
# 0.5.23's formats: pcie_ipc_ar.py:241-245 (enabled), :287-291 (workspace failed), :227-230 (no pcie_ipc_comm),
# :120-121 (bf16 only), parallel_state.py:501 (setup failed); the `[time TPn]` prefix of utils/common.py's logger.
ENABLED = b"".join(
    b"[2026-12-03 09:00:30 TP%d] FlashInfer PCIe-IPC all-reduce enabled (world=8, workspace sized on first "
    b"reduction)\n" % rank
    for rank in range(8)
)
WORKSPACE_FAILED = (
    b"[2026-12-03 09:03:10 TP0] FlashInfer PCIe-IPC workspace (max_numel=3145728) failed: RuntimeError: CUDA out "
    b"of memory while binding the workspace; reductions stay on NCCL\n"
)
CAPTURED_READY = (
    b"[2026-12-03 09:03:00 TP0] Capture target decode CUDA graph begin. This can take up to several minutes.\n"
    b"[2026-12-03 09:05:00 TP0] Capture target decode CUDA graph end. bs=[2, 1] Time elapsed: 12.00 s.\n"
    b"[2026-12-03 09:06:00] The server is fired up and ready to roll!\n"
)


def test_the_scan_names_the_all_reduce_in_use_and_no_fallback_fails_the_start() -> None:
    on = logscan.scan(MARKER + ENABLED + CAPTURED_READY)
    assert (on.allreduce, on.failure) == ("pcie_ipc", None)
    fell_back = logscan.scan(MARKER + ENABLED + WORKSPACE_FAILED + CAPTURED_READY)
    assert fell_back.allreduce == "nccl" and fell_back.failure is None
    assert fell_back.allreduce_why is not None and fell_back.allreduce_why.endswith("reductions stay on NCCL")
    assert phase.log_says_ready(fell_back)
    for line in (
        b"[2026-12-03 09:00:30 TP3] Setup FlashInfer PCIe-IPC allreduce failed with CUDA error: peer access is not "
        b"supported between these two devices.\n",
        b"[2026-12-03 09:00:30 TP0] SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no "
        b"pcie_ipc_comm; falling back to NCCL all-reduce.\n",
    ):
        found = logscan.scan(MARKER + line + CAPTURED_READY)
        assert (found.allreduce, found.failure) == ("nccl", None), line
    dtype = logscan.scan(
        MARKER + ENABLED + b"[2026-12-03 09:03:20 TP0] FlashInfer PCIe-IPC all-reduce serves bf16 only; "
        b"torch.float32 reductions stay on NCCL.\n" + CAPTURED_READY
    )
    assert dtype.allreduce == "pcie_ipc" and "pcie_ipc_dtype" in dtype.seen
    assert logscan.scan(MARKER + CAPTURED_READY).allreduce is None  # no line: SGLang's default, NCCL


# ---- the start: entrypoint/launch decides, the dry run and launch.json say it --------------------------------


def test_the_start_runs_the_ipc_all_reduce_only_where_this_box_passed_the_check(tmp_path: Path) -> None:
    """GLM5_ALLREDUCE=auto, both ways, through entrypoint/launch on the CPU: nvidia-smi is the stand-in (the box's
    GPUs), the cache volume holds the doctor's record. Only a passing check of these GPUs, driver and image turns the
    kernels on; a new driver sends the start back to NCCL until the check runs again."""
    bin_dir, readings = install_box(tmp_path, box_gpus(), {})
    cache = tmp_path / "cache"
    here, _ = choice.current_fingerprint("dev", {"PATH": f"{bin_dir}:/usr/bin:/bin",
                                                 "NVIDIA_SMI_DOUBLE_BOX": str(readings)})  # fmt: skip
    assert here is not None  # outside an image the build is "dev" (configuration/config.py build_id)
    state.write_pcie_ipc_check(
        cache, {"ok": True, "at": "2026-12-05T06:00:00+00:00", "fingerprint": here.as_json()}
    )
    program = tmp_path / "fake-server"
    program.write_text('#!/bin/sh\necho "ipc: ${SGLANG_ENABLE_PCIE_IPC_ALLREDUCE:-unset}"\n')
    program.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NVIDIA_SMI_DOUBLE_BOX": str(readings),
           "GLM5_CACHE_DIR": str(cache), "GLM5_STATE_DIR": str(tmp_path / "run"),
           "GLM5_SERVER_PROGRAM": str(program)}  # fmt: skip
    dry = launch("--dry-run", **env)
    assert "# SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 (GLM5_ALLREDUCE)" in dry.stdout, dry.stderr
    assert (
        "# all-reduce: PCIe-IPC all-reduce: the doctor's check passed on these GPUs at 2026-12-05T06:00"
        in dry.stdout
    )
    served = launch("--serve", **env)
    assert "ipc: 1" in served.stdout and "all-reduce: PCIe-IPC all-reduce" in served.stderr, served.stderr
    record = json.loads((tmp_path / "run" / "launch.json").read_text())
    assert record["allreduce"]["backend"] == "pcie_ipc"
    assert record["env"]["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    # The driver changed since the check: NCCL, and why.
    install_box(tmp_path, box_gpus(driver_version=lambda _i: "600.10.01"), {})
    served = launch("--serve", **env)
    assert "ipc: unset" in served.stdout
    assert "all-reduce: NCCL: the record is from other driver than this box's" in served.stderr
    assert json.loads((tmp_path / "run" / "launch.json").read_text())["allreduce"]["backend"] == "nccl"
    # DP attention keeps NCCL under auto; GLM5_ALLREDUCE=nccl always does.
    for setting in ({"GLM5_PROFILE": "throughput"}, {"GLM5_ALLREDUCE": "nccl"}):
        assert "ipc: unset" in launch("--serve", **env, **setting).stdout


# ---- NCCL's 12 KiB time beside SGLang's premise (issue 55, item 3) -------------------------------------------

PREMISE = "SGLang 0.5.23's premise: 205.1 us (the kernels 5.3 us, srt/distributed/device_communicators/pcie_ipc_ar.py:21)"


def measured_report(nccl_seconds: float = 2.34e-5, ipc_seconds: float = 5.1e-6) -> dict[str, Any]:
    """The stand-in report with NCCL and the kernels timed at 1 row (12 KiB) as a box might time them."""
    report = ipc_report()
    report["sizes"][0] |= {"nccl_seconds": nccl_seconds, "ipc_seconds": ipc_seconds}
    return report


def test_the_decision_shows_nccls_12_kib_time_beside_sglangs_docstring(tmp_path: Path) -> None:
    here = fingerprint_of(tmp_path, box_gpus())
    run_check(tmp_path, measured_report())
    record = state.read_pcie_ipc_check(tmp_path / "cache")
    measured = f"NCCL at 12 KiB: 23.4 us in this box's check (the kernels 5.1 us); {PREMISE}"
    on = choice.decide("auto", "latency", record, here)
    assert on.backend == "pcie_ipc" and on.why.endswith(f"(build {BUILD}); {measured}"), on.why
    assert choice.decide("nccl", "latency", record, here).why == f"NCCL: GLM5_ALLREDUCE=nccl; {measured}"
    # another driver: the figure is the record's, said to be of no check of this box
    other = fingerprint_of(tmp_path, box_gpus(driver_version="600.10"))
    assert choice.decide("auto", "latency", record, other).why.endswith(
        f"; NCCL at 12 KiB: 23.4 us in a kept check that is not this box's (the kernels 5.1 us); {PREMISE}"
    )
    # no record: no figure but the docstring's
    assert choice.decide("auto", "latency", None, here).why == (
        "NCCL: no all-reduce check recorded for this box; run `entrypoint/doctor --ipc`; "
        f"NCCL at 12 KiB: not measured on this box (no check kept); {PREMISE}"
    )
    # a check that hung measured nothing; one that left 1 row out has no 12 KiB figure either
    run_check(tmp_path, {"ok": False, "gpus": 8, "error": "ranks [3] did not finish within 120 s: a hang"})
    hung = choice.decide("auto", "latency", state.read_pcie_ipc_check(tmp_path / "cache"), here)
    assert hung.why.endswith(f"a hang; NCCL at 12 KiB: not in the kept check; {PREMISE}"), hung.why
    wide = ipc_report()
    wide["sizes"] = wide["sizes"][1:]
    run_check(tmp_path, wide)
    assert (
        "NCCL at 12 KiB: not in the kept check; "
        in choice.decide("auto", "latency", state.read_pcie_ipc_check(tmp_path / "cache"), here).why
    )


def test_the_premise_cited_is_the_pinned_sglangs_docstring() -> None:
    """The figures and the line cited are those of the sglang the kit installs (.venv: the image's pin)."""
    site = installed_site("sglang")
    assert (site / "sglang-0.5.23.dist-info").is_dir()
    source = site / "sglang" / choice.PREMISE_FILE
    line = source.read_text().splitlines()[choice.PREMISE_LINE - 1].split()
    assert line == [
        "12",
        "KiB",
        str(choice.PREMISE_KERNELS_US),
        "us",
        str(choice.PREMISE_NCCL_US),
        "us",
        "38.8x",
    ]
    assert (
        choice.SMALL_MESSAGE_BYTES == 12 * 2**10 == allreduce.MODEL_HIDDEN * 2
    )  # one bf16 row of hidden 6144


def test_the_dry_run_shows_nccls_12_kib_time_or_that_none_was_measured(tmp_path: Path) -> None:
    bin_dir, readings = install_box(tmp_path, box_gpus(), {})
    smi = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NVIDIA_SMI_DOUBLE_BOX": str(readings)}
    here, _ = choice.current_fingerprint("dev", smi)
    assert here is not None
    cache = tmp_path / "cache"
    dry = launch("--dry-run", **smi, GLM5_CACHE_DIR=str(cache))
    assert (
        "# all-reduce: NCCL: no all-reduce check recorded for this box; run `entrypoint/doctor --ipc`; "
        f"NCCL at 12 KiB: not measured on this box (no check kept); {PREMISE}\n"
    ) in dry.stdout, dry.stdout + dry.stderr
    record = {"ok": True, "at": "2026-12-05T06:00:00+00:00", "fingerprint": here.as_json()}
    state.write_pcie_ipc_check(cache, record | {"sizes": measured_report()["sizes"]})
    dry = launch("--dry-run", **smi, GLM5_CACHE_DIR=str(cache))
    assert (
        "(build dev); NCCL at 12 KiB: 23.4 us in this box's check (the kernels 5.1 us); " + PREMISE + "\n"
    ) in dry.stdout, dry.stdout + dry.stderr


# ---- the fault hook: one rank's result corrupted, the check refuses (issue 55, item 2) ----------------------

HIDDEN = allreduce.MODEL_HIDDEN


def cpu_world(rows: list[int], world: int, fault: allreduce.Fault | None = None) -> dict[str, Any]:
    """The GPU program's report (run_ipc's), each rank's part made on the CPU by entrypoint/allreduce's own steps:
    its input (rank_input), the fault (Fault.corrupt), the comparison (compare), the merge and the verdict (verdict).
    The stand-ins: NCCL's sum is the ranks' inputs added in ring order in bf16 (rounded at each step), the kernels'
    is their exact sum rounded once; the times are fixed."""
    reports: dict[int, list[dict[str, Any]]] = {rank: [] for rank in range(world)}
    for r in rows:
        inputs = [allreduce.rank_input(r, HIDDEN, rank, "cpu") for rank in range(world)]
        ring = inputs[0].clone()
        for x in inputs[1:]:
            ring = ring + x
        magnitude = torch.stack([x.abs().float() for x in inputs]).sum(0)
        for rank in range(world):
            kernels = torch.stack([x.float() for x in inputs]).sum(0).to(torch.bfloat16)
            if fault is not None:
                fault.corrupt(kernels, inputs[rank], rank, r)
            row = {
                "rows": r,
                "bytes": r * HIDDEN * 2,
                "served": True,
                "nccl_seconds": 2e-5,
                "ipc_seconds": 5e-6,
            }
            reports[rank].append(row | allreduce.compare(kernels, ring, magnitude, world))
    base = {"backend": "pcie_ipc", "gpus": world, "hidden": HIDDEN, "dtype": "bfloat16"}
    return base | allreduce.verdict(reports, world)


def test_a_corrupted_rank_fails_the_check_naming_the_size_and_the_rank(tmp_path: Path) -> None:
    here = fingerprint_of(tmp_path, box_gpus())
    clean = cpu_world([1, 2, 64], 8)
    assert clean["ok"] is True and all(r["correct"] and r["wrong_ranks"] == [] for r in clean["sizes"])
    assert run_check(tmp_path, clean).status == "pass"
    faulted = cpu_world([1, 2, 64], 8, allreduce.Fault(rank=3, rows=1))
    assert faulted["ok"] is False
    assert [(r["rows"], r["correct"], r["wrong_ranks"]) for r in faulted["sizes"]] == [
        (1, False, [3]), (2, True, []), (64, True, [])
    ]  # fmt: skip
    assert faulted["error"].startswith(
        "PCIe-IPC result differs from NCCL's beyond the bf16 bound: rows 1 (12 KiB) on rank 3 ("
    ), faulted["error"]
    found = run_check(tmp_path, faulted)
    assert found.status == "fail" and "rows 1 (12 KiB) on rank 3 (" in found.detail, found.detail
    record = state.read_pcie_ipc_check(tmp_path / "cache")
    assert record is not None and record["ok"] is False and record["sizes"][0]["wrong_ranks"] == [3]
    off = choice.decide("auto", "latency", record, here)
    assert off.backend == "nccl" and "beyond the bf16 bound: rows 1 (12 KiB) on rank 3 (" in off.why, off.why
    # two ranks wrong at a wider size: each named
    two = cpu_world([1, 64], 4, allreduce.Fault(rank=0, rows=64))
    assert [r["wrong_ranks"] for r in two["sizes"]] == [[], [0]] and "rows 64 (768 KiB) on rank 0 (" in two[
        "error"
    ]


def test_the_fault_hook_is_off_by_default_and_out_of_the_doctors_reach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The doctor runs `python3 -m entrypoint.allreduce --backend pcie_ipc --json` (measure_pcie_ipc): no flag and no
    environment variable reaches the fault; only a caller of run_ipc passing one (the tests, ci/allreduce-check)."""
    assert inspect.signature(allreduce.run_ipc).parameters["fault"].default is None
    seen: dict[str, Any] = {}

    def stand_in(*args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(args=args, kwargs=kwargs)
        return {"ok": True, "gpus": 8, "sizes": []}

    monkeypatch.setattr(allreduce, "run_ipc", stand_in)
    assert allreduce.main(["--backend", "pcie_ipc", "--json"]) == 0
    assert "fault" not in seen["kwargs"] and len(seen["args"]) == 5
    with pytest.raises(SystemExit):
        allreduce.parse_args(["--backend", "pcie_ipc", "--fault", "3"])
    # a fault that names no rank or size of the run would test nothing: refused before any process starts
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    for fault, said in (
        (allreduce.Fault(rank=8, rows=1), "rank 8"),
        (allreduce.Fault(rank=1, rows=3), "rows 3"),
    ):
        found = allreduce.run_ipc([1, 2, 4], HIDDEN, 1, 5, fault=fault)
        assert found["ok"] is False and said in found["error"] and "fault" in found["error"], found


# ---- ci/allreduce-check, the GPU run's script, on the CPU stand-ins -----------------------------------------


def test_the_gpu_runs_script_needs_the_fault_refused_naming_its_size_and_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its two checks with the CPU world in place of the GPUs: exit 0 only when the clean check passes and the faulted
    one is refused for the faulted size and rank alone; each record kept in its own folder, each decision printed."""
    box = smi_box(tmp_path, box_gpus())
    values = {"home": str(home_with(tmp_path, BUILD))}
    fault = allreduce.Fault(rank=7, rows=1)
    rows = [1, 2, 64]

    def clean(_box: doctor.Box) -> dict[str, Any]:
        return cpu_world(rows, 8)

    def faulted(_box: doctor.Box) -> dict[str, Any]:
        return cpu_world(rows, 8, fault)

    code, summary = allreduce_check.run_both(box, values, tmp_path / "out", clean, faulted, fault)
    printed = capsys.readouterr().out
    assert code == 0 and summary["ok"] is True, printed
    assert "rows    1    12 KiB  within the bf16 bound (max diff " in printed
    assert "rows    1    12 KiB  DIFFERS on rank(s) 7: " in printed
    assert "nccl      20.0 us" in printed and "ipc       5.0 us" in printed
    assert (
        "decision: pcie_ipc: PCIe-IPC all-reduce: the doctor's check passed on these GPUs at " in printed
        and "NCCL at 12 KiB: 20.0 us in this box's check (the kernels 5.0 us); " + PREMISE in printed
    )
    assert "decision: nccl: NCCL: the check failed on these GPUs at " in printed
    assert "beyond the bf16 bound: rows 1 (12 KiB) on rank 7 (" in summary["faulted"]["decision"]["why"]
    assert printed.rstrip().endswith(
        "allreduce-check: ok: the clean check passed and the faulted one was refused, naming its size and rank"
    )
    assert state.read_pcie_ipc_check(tmp_path / "out" / "clean")["ok"] is True  # type: ignore[index]
    assert state.read_pcie_ipc_check(tmp_path / "out" / "fault")["ok"] is False  # type: ignore[index]
    # a fault the check let through (or one that hit another rank or size) fails the run
    code, summary = allreduce_check.run_both(box, values, tmp_path / "again", clean, clean, fault)
    assert code == 1 and summary["ok"] is False
    assert (
        "allreduce-check: FAILED: clean: pass; faulted: pass, expected a refusal of rows 1 on rank 7 alone"
        in (capsys.readouterr().out)
    )
    other = allreduce.Fault(rank=2, rows=1)
    code, _ = allreduce_check.run_both(
        box, values, tmp_path / "other", clean, lambda _b: cpu_world(rows, 8, other), fault
    )
    assert code == 1
