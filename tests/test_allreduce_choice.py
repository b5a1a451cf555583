"""The box decides the all-reduce (issue 42): entrypoint/allreduce's pcie_ipc mode as a CLI, the doctor's
`pcie_ipc_allreduce` check kept on the cache volume with the box's fingerprint, the pure decision from it
(configuration/allreduce_choice.py), and SGLang 0.5.23's PCIe-IPC lines in the log scan. All on the CPU: the GPU
program is replaced by a stand-in report, nvidia-smi by tests/doubles/nvidia_smi_double.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from configuration import allreduce_choice as choice
from configuration import state
from configuration.batch_sizes import decode_batch_sizes
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


# ---- the decision -------------------------------------------------------------------------------------------


def test_a_passing_check_of_this_very_box_turns_the_kernels_on_and_nothing_else_does(tmp_path: Path) -> None:
    here = fingerprint_of(tmp_path, box_gpus())
    run_check(tmp_path, ipc_report())
    record = state.read_pcie_ipc_check(tmp_path / "cache")
    on = choice.decide("auto", "latency", record, here)
    assert on.backend == "pcie_ipc" and on.env() == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert on.why.startswith("PCIe-IPC all-reduce: the doctor's check passed on these GPUs at ")
    assert on.why.endswith(f"(build {BUILD})")
    # a GPU moved to another slot, a GPU swapped, another driver, another image: stale, NCCL, the check named
    for other, part in (
        (fingerprint_of(tmp_path, box_gpus(pci__bus_id=lambda i: f"00000000:{i + 2:02X}:00.0")), "GPUs"),
        (fingerprint_of(tmp_path, box_gpus(uuid=lambda i: UUIDS[(i + 1) % 8])), "GPUs"),
        (fingerprint_of(tmp_path, box_gpus(driver_version="600.10")), "driver"),
        (fingerprint_of(tmp_path, box_gpus(), build="77aa00bb11cc22dd"), "image"),
    ):
        off = choice.decide("auto", "latency", record, other)
        assert off == (
            "nccl",
            f"NCCL: the record is from other {part} than this box's; run `entrypoint/doctor --ipc`",
        )
        assert off.env() == {}
    assert choice.decide("auto", "latency", None, here).why == (
        "NCCL: no all-reduce check recorded for this box; run `entrypoint/doctor --ipc`"
    )
    assert choice.decide("nccl", "latency", record, here) == ("nccl", "NCCL: GLM5_ALLREDUCE=nccl")
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
    assert off.why.startswith("NCCL: the check failed on these GPUs at ")
    assert off.why.endswith(": ranks [3] did not finish within 120 s: a hang")
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
    assert choice.decide("auto", "latency", record, current, unread).why == (
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
