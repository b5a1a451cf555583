"""entrypoint/doctor on real outputs of real boxes (tests/fixtures/doctor/, cited in SOURCES.md), printed by a
stand-in nvidia-smi (tests/doubles/nvidia_smi_double.py) and lspci on PATH; the doctor itself is the real one."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from configuration import config, settings
from conftest import ROOT, kit_env
from entrypoint import doctor
from kernels.modules import load

FIX = ROOT / "tests" / "fixtures" / "doctor"
DOUBLE = ROOT / "tests" / "doubles" / "nvidia_smi_double.py"
DEVICE = FIX / "h200x2-device"

# One RTX PRO 6000 Blackwell Server Edition as nvidia-smi -q printed it (smi-q-rtx-pro-6000-server-600w-first-gpu.txt:
# driver 595.58.03, 97887 MiB, MIG Disabled/Disabled, PCIe Max 5, Device Max 5, Host Max 5, width 16x, power limit
# 600 W current and default), with the eight bus ids of query-gpu-8x-rtx-pro-6000-server-pcie-power-noheader.txt.
BUS = ["01", "11", "61", "71", "81", "91", "E1", "F1"]
SERVER_GPU = {
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "compute_cap": "12.0",
    "memory.total": "97887 MiB",
    "driver_version": "595.58.03",
    "pcie.link.gen.current": "1",
    "pcie.link.gen.max": "5",
    "pcie.link.gen.gpumax": "5",
    "pcie.link.gen.hostmax": "5",
    "pcie.link.width.max": "16",
    "mig.mode.current": "Disabled",
    "mig.mode.pending": "Disabled",
    "power.limit": "600.00 W",
    "power.default_limit": "600.00 W",
    "power.max_limit": "600.00 W",
    "enforced.power.limit": "600.00 W",
}


def gpus(n: int = 8, **changes: Any) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        gpu = SERVER_GPU | {"index": str(i), "pci.bus_id": f"00000000:{BUS[i % 8]}:00.0"}
        for field, value in changes.items():
            gpu[field.replace("__", ".")] = value(i) if callable(value) else value
        out.append(gpu)
    return out


GOOD_FILES = {
    "topo -m": FIX / "topo-m-8x-rtx-pro-6000-server-two-sockets-broadcom.txt",
    # An 8-GPU `topo -p2p r` with every pair OK (8x H100; the same matrix format for any 8 GPUs).
    "topo -p2p r": FIX / "topo-p2p-r-8x-h100-all-ok.txt",
    "-L": FIX / "smi-L-8x-rtx-pro-6000-server.txt",
}


KERNELS = load()


def install_box(tmp_path: Path, box_gpus: list[dict[str, str]], files: dict[str, Path]) -> tuple[Path, Path]:
    """The box's readings in box.json, and the nvidia-smi stand-in that prints them, in tmp_path/bin."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    box = tmp_path / "box.json"
    box.write_text(json.dumps({"gpus": box_gpus, "files": {k: str(v) for k, v in files.items()}}))
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec '{os.sys.executable}' '{DOUBLE}' \"$@\"\n")
    smi.chmod(0o755)
    return bin_dir, box


def run_doctor(
    tmp_path: Path,
    box_gpus: list[dict[str, str]],
    files: dict[str, Path],
    *args: str,
    lspci: Path | None = None,
    cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro iommu=pt\n",
    iommu_units: tuple[str, ...] = ("dmar0",),
    kernels: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    bin_dir, box = install_box(tmp_path, box_gpus, files)
    if lspci is not None:
        stand_in = bin_dir / "lspci"
        stand_in.write_text(f"#!/bin/sh\ncat '{lspci}'\n")
        stand_in.chmod(0o755)
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "cmdline").write_text(cmdline)
    (root / "dev" / "shm").mkdir(parents=True, exist_ok=True)  # this machine's disk: more than 16 GiB
    for unit in iommu_units:
        (root / "sys" / "class" / "iommu" / unit).mkdir(parents=True, exist_ok=True)
    # the image's record of its prebuilt kernels (kernels/build.py's format), all of the list built unless given
    record = root / "opt" / "glm5" / "KERNELS-PREBUILT.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(kernels or kernels_record(KERNELS.names, "all")))
    env = kit_env() | {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "NVIDIA_SMI_DOUBLE_BOX": str(box),
    }
    done = subprocess.run(
        [str(ROOT / "entrypoint" / "doctor"), "--json", "--root", str(root), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def kernels_record(built: tuple[str, ...], selection: str) -> dict[str, Any]:
    return {
        "selection": selection,
        "arch_list": KERNELS.arch_list,
        "built": [{"name": n} for n in built],
        "not_built": [n for n in KERNELS.names if n not in built],
    }


def by_name(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in report["checks"]}


def test_a_good_8x_rtx_pro_6000_server_passes_with_the_socket_split_named(tmp_path: Path) -> None:
    code, report = run_doctor(tmp_path, gpus(), GOOD_FILES)
    checks = by_name(report)
    assert code == 0 and report["ok"] is True
    assert list(checks) == [
        "gpus",
        "mig",
        "pcie_link",
        "topology",
        "p2p",
        "iommu",
        "acs",
        "power",
        "shm",
        "kernels",
    ]
    assert {k: v["status"] for k, v in checks.items()} == {
        "gpus": "pass", "mig": "pass", "pcie_link": "pass", "topology": "warn", "p2p": "pass", "iommu": "pass",
        "acs": "unknown", "power": "pass", "shm": checks["shm"]["status"], "kernels": "pass",
    }  # fmt: skip
    assert "16 GPU pair(s) cross the CPU sockets (SYS, e.g. GPU0-GPU4)" in checks["topology"]["detail"]
    assert "NUMA 0: GPU0 GPU1 GPU2 GPU3, 1: GPU4 GPU5 GPU6 GPU7" in checks["topology"]["detail"]
    # no lspci here: unknown, with how to read it
    assert 'sudo env "PATH=$PATH" entrypoint/doctor --host' in checks["acs"]["fix"]
    for c in report["checks"]:
        assert set(c) == {"name", "status", "detail", "fix"} and c["status"] in doctor.STATUSES


def test_mig_on_any_gpu_fails_with_the_fix(tmp_path: Path) -> None:
    files = GOOD_FILES | {"-L": FIX / "smi-L-8x-rtx-pro-6000-server-mig-32x-1g24gb.txt"}
    code, report = run_doctor(
        tmp_path, gpus(mig__mode__current=lambda i: "Enabled" if i < 4 else "Disabled"), files
    )
    mig = by_name(report)["mig"]
    assert code == 1 and report["ok"] is False and mig["status"] == "fail"
    assert "MIG mode enabled on GPU 0 (current Enabled, pending Disabled)" in mig["detail"]
    assert "MIG slice(s) visible here (MIG 1g.24gb     Device  0:" in mig["detail"]
    assert mig["fix"].startswith("on the host: sudo nvidia-smi -i 0,1,2,3 -mig 0")


@pytest.mark.boots
def test_a_slot_that_cannot_train_gen5_x16_is_a_warning_not_the_idle_link(tmp_path: Path) -> None:
    # Every card idles at Gen1 (pcie.link.gen.current 1, as the real -q shows): never the test.
    code, report = run_doctor(tmp_path, gpus(pcie__link__gen__hostmax=lambda i: "4" if i == 3 else "5",
                                             pcie__link__width__max=lambda i: "8" if i == 5 else "16"), GOOD_FILES)  # fmt: skip
    link = by_name(report)["pcie_link"]
    assert code == 0 and link["status"] == "warn"
    assert "GPU 3 trains to Gen4 x16 at most (GPU Gen5, slot Gen4)" in link["detail"]
    assert "GPU 5 trains to Gen5 x8 at most" in link["detail"]
    _, idle_only = run_doctor(tmp_path, gpus(), GOOD_FILES)
    assert by_name(idle_only)["pcie_link"]["status"] == "pass"


@pytest.mark.boots
def test_pairs_without_p2p_are_named(tmp_path: Path) -> None:
    files = {
        "topo -m": FIX / "topo-m-2x-rtx-pro-6000-ws-phb.txt",
        "topo -p2p r": FIX / "topo-p2p-rw-2x-rtx-5090-gns.txt",
    }
    code, report = run_doctor(tmp_path, gpus(2), files)
    checks = by_name(report)
    assert checks["p2p"]["status"] == "warn"
    assert "GPU0-GPU1 read GNS (GPU not supported)" in checks["p2p"]["detail"]
    assert checks["gpus"]["status"] == "fail" and "2 GPU(s) visible" in checks["gpus"]["detail"]
    assert code == 1


@pytest.mark.boots
def test_acs_redirect_above_the_gpus_and_a_translating_iommu_are_warnings(tmp_path: Path) -> None:
    lspci = FIX / "lspci-pex890xx-switch-port-above-rtx-pro-6000-acs-on.txt"
    _, report = run_doctor(
        tmp_path, gpus(), GOOD_FILES, lspci=lspci, cmdline="BOOT_IMAGE=/vmlinuz intel_iommu=on\n"
    )
    checks = by_name(report)
    assert checks["acs"]["status"] == "warn" and "at 1 PCIe bridge(s) (02:03.0)" in checks["acs"]["detail"]
    assert checks["iommu"]["status"] == "warn" and "iommu=pt" in checks["iommu"]["fix"]
    # The real kernel command line of an 8x RTX PRO 6000 box with the IOMMU off: pass.
    cmdline = (FIX / "cmdline-8x-rtx-pro-6000-asus-iommu-off.txt").read_text()
    _, off = run_doctor(tmp_path, gpus(), GOOD_FILES, cmdline=cmdline, iommu_units=())
    assert by_name(off)["iommu"]["status"] == "pass"


@pytest.mark.boots
def test_power_capped_is_a_warning_and_max_q_is_reported_not_failed(tmp_path: Path) -> None:
    capped = gpus(enforced__power__limit=lambda i: "450.00 W" if i == 2 else "600.00 W")
    _, report = run_doctor(tmp_path, capped, GOOD_FILES)
    power = by_name(report)["power"]
    assert power["status"] == "warn" and "GPU 2 limited to 450 W of its default 600 W" in power["detail"]
    max_q = gpus(name="NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", power__limit="300.00 W",
                 power__default_limit="300.00 W", enforced__power__limit="300.00 W")  # fmt: skip
    _, report = run_doctor(tmp_path, max_q, GOOD_FILES)
    power = by_name(report)["power"]
    assert power["status"] == "pass" and "Max-Q edition, 300 W by design" in power["detail"]
    assert "unknown until measured" in power["detail"]


@pytest.mark.boots
def test_unreadable_is_unknown_never_a_crash(tmp_path: Path) -> None:
    code, report = run_doctor(tmp_path, [], {}, cmdline="", iommu_units=())
    checks = by_name(report)
    assert checks["gpus"]["status"] == "fail"  # no GPU at all is a failure
    for name in ("topology", "p2p", "pcie_link", "power"):
        assert checks[name]["status"] == "unknown", checks[name]
    missing = doctor.run(doctor.Box({"PATH": "/nonexistent"}), {}, ("p2p", "topology", "mig"))
    assert [c.status for c in missing] == ["unknown"] * 3  # no nvidia-smi at all: unknown, not pass
    assert code == 1


@pytest.mark.boots
def test_the_real_h200_device_outputs_parse(tmp_path: Path) -> None:
    """This project's own run on two NVLink H200s (h200x2-device/): ANSI escapes, NV18, [N/A] host max."""
    rows = [ln.split(", ") for ln in (DEVICE / "query-gpu.csv").read_text().splitlines()]
    header = [h.split(" [")[0] for h in rows[0]]
    device_gpus = [dict(zip(header, r, strict=True)) for r in rows[1:]]
    files = {
        "topo -m": DEVICE / "topo-m.txt",
        "topo -p2p r": DEVICE / "topo-p2p-r.txt",
        "-L": DEVICE / "smi-L.txt",
    }
    _, report = run_doctor(tmp_path, device_gpus, files, "--only", "mig,pcie_link,topology,p2p,power")
    checks = by_name(report)
    assert {k: v["status"] for k, v in checks.items()} == {
        "mig": "pass", "pcie_link": "pass", "topology": "pass", "p2p": "pass", "power": "pass"
    }  # fmt: skip
    assert "NV18 1" in checks["topology"]["detail"]


def test_the_stand_in_answers_queries_as_nvidia_smi_does(tmp_path: Path) -> None:
    box = tmp_path / "box.json"
    box.write_text(json.dumps({"gpus": gpus(1, pcie__link__gen__hostmax="[N/A]")}))
    env = os.environ | {"NVIDIA_SMI_DOUBLE_BOX": str(box)}
    done = subprocess.run([os.sys.executable, str(DOUBLE), "--query-gpu=index,memory.total,power.limit,pcie.link.gen.hostmax",
                           "--format=csv"], env=env, capture_output=True, text=True, check=True)  # fmt: skip
    assert (
        done.stdout
        == "index, memory.total [MiB], power.limit [W], pcie.link.gen.hostmax\n0, 97887 MiB, 600.00 W, [N/A]\n"
    )
    bad = subprocess.run([os.sys.executable, str(DOUBLE), "--query-gpu=index,device_minor", "--format=csv"], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert (bad.returncode, bad.stdout) == (2, 'Field "device_minor" is not a valid field to query.\n\n')


@pytest.mark.parametrize("name", doctor.ALL)
def test_every_check_is_documented(name: str) -> None:
    assert name in (ROOT / "docs" / "reference.md").read_text()


def prepare_with_box(
    tmp_path: Path, box_gpus: list[dict[str, str]], files: dict[str, Path]
) -> subprocess.CompletedProcess[str]:
    bin_dir, box = install_box(tmp_path, box_gpus, files)
    env = kit_env("FLASHINFER_") | {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "NVIDIA_SMI_DOUBLE_BOX": str(box),
        "GLM5_STATE_DIR": str(tmp_path / "run"),
        "GLM5_SKIP_PREFLIGHT": "shm,model,flashinfer,flags",
    }
    (tmp_path / "run").mkdir(exist_ok=True)
    return subprocess.run(
        [str(ROOT / "entrypoint/launch"), "--prepare"], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.boots
def test_preflight_stops_on_the_doctors_failures_and_records_its_warnings(tmp_path: Path) -> None:
    from configuration import state

    done = prepare_with_box(tmp_path, gpus(), GOOD_FILES)
    assert done.returncode == 0, done.stderr
    assert "doctor: topology: 16 GPU pair(s) cross the CPU sockets" in done.stderr
    recorded = state.read_doctor(tmp_path / "run")
    assert [w["name"] for w in recorded] == ["topology"] and recorded[0]["status"] == "warn"
    mig = prepare_with_box(tmp_path, gpus(mig__mode__current="Enabled"), GOOD_FILES)
    assert mig.returncode == doctor.GPU_MIG, mig.stderr
    assert (
        "mig: MIG mode enabled on GPU 0" in mig.stderr
        and "sudo nvidia-smi -i 0,1,2,3,4,5,6,7 -mig 0" in mig.stderr
    )
    assert state.read_failed(tmp_path / "run")["code"] == doctor.GPU_MIG


@pytest.mark.boots
def test_the_allreduce_refuses_without_two_gpus_and_parses_sizes() -> None:
    from entrypoint import allreduce

    assert [allreduce.parse_size(s) for s in ("1M", "256M", "1G", "4096")] == [2**20, 2**28, 2**30, 4096]
    with pytest.raises(Exception, match="use a size like"):
        allreduce.parse_size("0M")
    found = allreduce.run([2**20], 1, 5)  # this machine has no GPU (CPU torch)
    assert found == {"ok": False, "gpus": 0, "error": "0 GPU(s) visible: an all-reduce needs 2 or more"}
    check = doctor.check_nccl(doctor.Box())
    assert (
        check.status == "fail" and check.detail == "0 GPU(s) visible: an all-reduce needs 2 or more (0 GPUs)"
    )


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIX.glob("topo-*.txt")))
def test_every_real_topology_matrix_is_read(tmp_path: Path, fixture: str) -> None:
    """Tabs or none, ANSI underlines, NIC rows and columns, no trailing newline: each real matrix reads."""
    kind = "topo -m" if fixture.startswith("topo-m-") else "topo -p2p r"
    name = "topology" if kind == "topo -m" else "p2p"
    _, report = run_doctor(tmp_path, gpus(), {kind: FIX / fixture}, "--only", name)
    (found,) = report["checks"]
    assert found["status"] in ("pass", "warn"), found
    sys_pairs = (FIX / fixture).read_text().count("SYS") > 1 and kind == "topo -m"
    assert (found["status"] == "warn") == (
        sys_pairs or (kind != "topo -m" and "NS" in (FIX / fixture).read_text().split("Legend")[0])
    ), found


@pytest.mark.boots
def test_an_image_built_without_its_kernels_warns_what_a_start_will_compile(tmp_path: Path) -> None:
    code, report = run_doctor(tmp_path, gpus(), GOOD_FILES, kernels=kernels_record((), "none"))
    kernels = by_name(report)["kernels"]
    assert code == 0 and kernels["status"] == "warn"
    assert (
        f"{len(KERNELS.names)} FlashInfer module(s) not prebuilt (built with GLM5_KERNELS=none)"
        in kernels["detail"]
    )
    assert "fused_moe_120" in kernels["detail"] and "GLM5_KERNELS=all" in kernels["fix"]


def test_without_the_record_the_kernels_are_unknown_not_a_crash(tmp_path: Path) -> None:
    box = doctor.Box(environ={}, root=tmp_path)
    found = doctor.check_kernels(box, {"home": "/opt/glm5"})
    assert found.status == "unknown" and "KERNELS-PREBUILT.json" in found.detail


def test_the_support_bundle_holds_the_box_and_the_run_and_no_secret(tmp_path: Path) -> None:
    """`doctor --bundle -`: one archive on stdout; a key and a hub token planted in every file it reads, and in the
    environment, appear nowhere in it, and the server's private config file (the key's home) is not in it at all."""
    key, token = "planted-api-key-0123456789abcdef", "hf_plantedHubToken0123456789"
    bin_dir, box = install_box(tmp_path, gpus(), GOOD_FILES)
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    env = kit_env(GLM5_API_KEY_FILE=str(key_file), HF_TOKEN=token) | {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "NVIDIA_SMI_DOUBLE_BOX": str(box),
    }
    run_dir, log_dir = Path(env["GLM5_STATE_DIR"]), Path(env["GLM5_LOG_DIR"])
    run_dir.mkdir(parents=True)
    log_dir.mkdir(parents=True)
    (run_dir / "launch.json").write_text(json.dumps({"start": 1, "argv": ["--api-key", key], "pid": 1}))
    (run_dir / "failed.json").write_text(
        json.dumps({"code": 70, "reason": f"token {token} refused", "at": "now"})
    )
    (run_dir / "server-config.yaml").write_text(f"api-key: {key}\n")
    (log_dir / "server.log").write_text(
        f"server_args=ServerArgs(api_key='{key}')\nAuthorization: Bearer some-client-key-987\nthe last line\n"
    )
    done = subprocess.run(
        [str(ROOT / "entrypoint" / "doctor"), "--bundle", "-"], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(done.stdout), mode="r:gz") as archive:
        texts = {m.name.removeprefix("glm5-bundle/"): archive.extractfile(m).read().decode() for m in archive}  # type: ignore[union-attr]
    assert {"versions.txt", "configuration.json", "doctor.json", "healthcheck.json", "server.log.tail",
            "nvidia-smi-topo.txt", "state/launch.json", "state/failed.json", "missing.txt"} <= set(texts)  # fmt: skip
    assert "state/server-config.yaml" not in texts
    for name, text in texts.items():
        assert key not in text and token not in text and "some-client-key-987" not in text, name
    assert "[redacted]" in texts["state/launch.json"] and "[redacted]" in texts["state/failed.json"]
    assert texts["server.log.tail"].endswith("the last line\n")
    assert json.loads(texts["doctor.json"])["checks"] and "nvidia-smi-q.txt" in texts["missing.txt"]
    assert "GPU0" in texts["nvidia-smi-topo.txt"]
    assert (
        json.loads(texts["image.json"])["version"]
        == settings.load_config()["deployment"]["image"].rsplit(":", 1)[1]
    )


def test_the_bundle_refuses_a_terminal() -> None:
    main, follower = pty.openpty()
    done = subprocess.run(
        [str(ROOT / "entrypoint" / "doctor"), "--bundle", "-"], env=kit_env(), stdout=follower,
        stderr=subprocess.PIPE, timeout=60,
    )  # fmt: skip
    os.close(follower)
    os.close(main)
    assert done.returncode == 2 and b"redirect it" in done.stderr


def test_every_unknown_check_names_a_fix_other_than_the_command_just_run(tmp_path: Path) -> None:
    """No nvidia-smi and no readable /proc: each check that cannot read its input says what to do instead."""
    root = tmp_path / "root"
    root.mkdir()
    env = kit_env() | {"PATH": f"{tmp_path}:/usr/bin:/bin"}  # no nvidia-smi there
    done = subprocess.run(
        [str(ROOT / "entrypoint" / "doctor"), "--json", "--root", str(root)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    checks = json.loads(done.stdout)["checks"]
    unknown = [c for c in checks if c["status"] == "unknown"]
    assert len(unknown) >= 5, checks
    for check in unknown:
        assert check["fix"], check
        assert not check["fix"].startswith(("run nvidia-smi", "nvidia-smi")), check
    # and a parser meeting an output it does not know: unknown with the fix, never a crash
    broken = doctor.run(doctor.Box({"PATH": "/nonexistent"}, root), {"home": str(root)} | {}, ("kernels",))
    assert broken[0].status == "unknown" and broken[0].fix


def test_the_bundle_records_the_version_and_the_digest_when_known() -> None:
    from entrypoint import bundle

    digest = "sha256:" + "3" * 64
    known = json.loads(bundle.image_identity({"GLM5_IMAGE": f"ghcr.io/o/glm5-serve@{digest}"}))
    version = settings.load_config()["deployment"]["image"].rsplit(":", 1)[1]
    assert (known["version"], known["digest"]) == (version, digest) and "digest_unknown" not in known
    unknown = json.loads(bundle.image_identity({}))
    assert unknown["digest"] is None and "docker image inspect" in unknown["digest_unknown"]


def host_doctor(tmp_path: Path, *tools: tuple[str, str]) -> tuple[int, dict[str, dict[str, str]], float]:
    """`entrypoint/doctor --host --json` as the quick start's first step runs it, on this CPU machine: PATH holds only
    the system's programs and the stand-ins given as (name, shell body); the weights folder is one that is not there."""
    bin_dir = tmp_path / "host-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools:
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = kit_env(GLM5_MODEL_HOST_DIR=str(tmp_path / "models" / "GLM-5-NVFP4")) | {
        "PATH": f"{bin_dir}:/usr/bin:/bin"
    }
    began = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "entrypoint" / "doctor"), "--host", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - began
    assert done.stdout, done.stderr
    return done.returncode, by_name(json.loads(done.stdout)), took


def test_the_host_check_refuses_a_cpu_machine_in_seconds_naming_each_missing_part(tmp_path: Path) -> None:
    """The quick start's first step on this machine (no GPU, no driver, no Docker, no container toolkit): exit 1 in
    seconds, each missing part a failure with its fix, before anything is built."""
    code, checks, took = host_doctor(tmp_path)
    assert code == 1 and took < 10, took
    assert (
        checks["gpus"]["status"] == "fail" and "nvidia-smi is not installed here" in checks["gpus"]["detail"]
    )
    assert "install the NVIDIA driver, R580 or newer, on the host" in checks["gpus"]["fix"]
    assert "container has no working GPU runtime" not in json.dumps(checks)  # the host has no container
    assert checks["compose"] == {
        "name": "compose",
        "status": "fail",
        "detail": "docker is not installed here",
        "fix": "install Docker Engine 25 or newer with its Compose plugin 2.24+ (https://docs.docker.com/engine/install/)",
    }
    toolkit = checks["container_toolkit"]
    assert toolkit["status"] == "fail" and "nvidia-container-runtime-hook is not on PATH" in toolkit["detail"]
    assert 'could not select device driver "nvidia" with capabilities: [[gpu]]' in toolkit["detail"]
    assert "container-toolkit/latest/install-guide.html" in toolkit["fix"]
    weights = checks["weights_disk"]
    assert f"{tmp_path / 'models' / 'GLM-5-NVFP4'} does not exist yet" in weights["detail"]


def test_the_host_check_reads_the_compose_version_and_the_toolkit(tmp_path: Path) -> None:
    # Docker 28.2.2 without the Compose plugin, as it answers (stderr, exit 125)
    bare = (
        "docker",
        'echo "unknown flag: --short\n\nUsage:  docker [OPTIONS] COMMAND [ARG...]" >&2; exit 125',
    )
    code, checks, _ = host_doctor(tmp_path, bare)
    assert checks["compose"]["detail"] == (
        "Docker has no Compose plugin (`docker compose version --short` answered: unknown flag: --short)"
    )
    assert "install the Compose plugin 2.24+" in checks["compose"]["fix"] and code == 1
    old = ("docker", '[ "$*" = "compose version --short" ] && echo v2.20.3')
    code, checks, _ = host_doctor(tmp_path, old)
    assert checks["compose"]["status"] == "fail" and code == 1
    assert checks["compose"]["detail"] == "Docker Compose 2.20.3: the kit's compose file needs 2.24 or newer"
    new = ("docker", '[ "$*" = "compose version --short" ] && echo 2.29.1')
    hook = ("nvidia-container-runtime-hook", "exit 0")
    ctk = ("nvidia-ctk", "echo 'NVIDIA Container Toolkit CLI version 1.17.8'")
    _, checks, _ = host_doctor(tmp_path, new, hook, ctk)
    assert checks["compose"] == {
        "name": "compose",
        "status": "pass",
        "detail": "Docker Compose 2.29.1",
        "fix": "",
    }
    assert checks["container_toolkit"]["status"] == "pass"
    assert "(NVIDIA Container Toolkit CLI version 1.17.8)" in checks["container_toolkit"]["detail"]


def test_the_weights_disk_fails_short_of_the_weights_and_passes_with_them(tmp_path: Path) -> None:
    box = doctor.Box(environ={"PATH": "/usr/bin:/bin"}, host=True)
    folder = tmp_path / "weights"
    short = doctor.check_weights_disk(box, {"model_host_dir": str(folder), "weights_gb": 10**9})
    assert short.status == "fail" and "GB short" in short.detail and "GLM5_MODEL_HOST_DIR" in short.fix
    folder.mkdir()
    (folder / "model-00001.safetensors").write_bytes(b"x" * 2_000_000)
    held = doctor.check_weights_disk(box, {"model_host_dir": str(folder), "weights_gb": 0})
    assert held.status == "pass" and "holds 0 GB of the 0 GB" in held.detail


def test_acs_and_iommu_warnings_name_both_known_fixes(tmp_path: Path) -> None:
    lspci = FIX / "lspci-pex890xx-switch-port-above-rtx-pro-6000-acs-on.txt"
    _, report = run_doctor(
        tmp_path, gpus(), GOOD_FILES, lspci=lspci, cmdline="BOOT_IMAGE=/vmlinuz intel_iommu=on\n"
    )
    checks = by_name(report)
    for name in ("acs", "iommu"):
        assert checks[name]["status"] == "warn"
        fix = checks[name]["fix"]
        assert "sudo setpci -s BDF ECAP_ACS+0x6.w=0000" in fix and "root-complex" in fix, fix
        assert "pci=noacs" in fix and "NVIDIA/nccl#2079" in fix, fix


def test_the_ipc_check_compiles_and_tunes_where_the_server_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`doctor --ipc` runs its all-reduce in the server's cache environment: FlashInfer's own resolution (its JIT
    folder and the PCIe-IPC tune cache), read in a process given that environment, lands under the SGLANG_CACHE_DIR
    the server gets (the cache volume, this image build's folder), not under HOME, a tmpfs gone with the container."""
    seen: dict[str, str] = {}

    def fake_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(
            argv, 0, stdout='{"ok": false, "error": "no GPU here"}\n', stderr=""
        )

    cache = tmp_path / "cache"
    environ = kit_env(GLM5_CACHE_DIR=str(cache)) | {"HOME": str(tmp_path / "home")}
    monkeypatch.setattr(doctor.subprocess, "run", fake_run)
    assert doctor.measure_pcie_ipc(doctor.Box(environ)) == {"ok": False, "error": "no GPU here"}
    monkeypatch.undo()
    server = config.resolve(environ).server_env(environ)[0]["SGLANG_CACHE_DIR"]
    assert server.startswith(f"{cache}/build-") and seen.get("SGLANG_CACHE_DIR") == server, seen.get(
        "SGLANG_CACHE_DIR"
    )
    probe = "\n".join(
        [
            "import pathlib, sys, types",
            "import flashinfer",
            "from flashinfer.jit import env",
            # flashinfer.comm's __init__ needs cuda-python (no GPU here): its tuning module alone does not
            "comm = types.ModuleType('flashinfer.comm')",
            "comm.__path__ = [str(pathlib.Path(flashinfer.__file__).parent / 'comm')]",
            "sys.modules['flashinfer.comm'] = comm",
            "from flashinfer.comm.pcie_ipc_tuning import default_cache_path",
            "print(env.FLASHINFER_CACHE_DIR)",
            "print(default_cache_path(8))",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=seen, capture_output=True, text=True, check=True, timeout=120
    )
    jit_dir, tune_cache = done.stdout.split()
    assert jit_dir == f"{server}/.cache/flashinfer", done.stdout
    assert tune_cache.startswith(f"{server}/"), done.stdout
    # the operator's own FLASHINFER_WORKSPACE_BASE wins, as it does for the server (SGLang only sets a default)
    mine = doctor.server_environment(environ | {"FLASHINFER_WORKSPACE_BASE": "/elsewhere"})
    assert mine["FLASHINFER_WORKSPACE_BASE"] == "/elsewhere"


def test_the_host_check_reads_the_hosts_shared_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compose runs the container with ipc: host, so the host's /dev/shm is the one TP8's NCCL gets: the host check
    reads it (a 4 GiB tmpfs fails, naming the remount) instead of passing it as not applicable."""
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    values = {"min_shm_gib": 16}
    real = os.statvfs

    def small(path: Any) -> Any:
        found = real(path)
        if str(path) == str(tmp_path / "dev" / "shm"):
            return os.statvfs_result((4096, 4096, 2**20, *found[3:]))  # 4 GiB
        return found

    monkeypatch.setattr(os, "statvfs", small)
    found = doctor.check_shm(doctor.Box({}, root=tmp_path, host=True), values)
    assert found.status == "fail" and "is 4.00 GiB, TP8 needs 16 GiB" in found.detail
    assert "ipc: host" in found.detail and "sudo mount -o remount,size=32G /dev/shm" in found.fix
    monkeypatch.setattr(os, "statvfs", real)
    assert doctor.check_shm(doctor.Box({}, root=tmp_path, host=True), values).status == "pass"
