"""The container's /tmp, where SGLang writes a script and runs every scheduler through it: the compose file's tmpfs
options, mounted by the real kernel (a user and mount namespace) with Docker's defaults underneath, and SGLang
0.5.23's own `_create_numactl_executable` (srt/utils/numa_utils.py, taken from the installed source: importing the
module needs triton). Docker mounts a tmpfs `noexec,nosuid,nodev` unless told (docker/docs#8138; moby/moby#35890:
"Permission denied" running a file there); Kubernetes' emptyDir allows exec."""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

pytestmark = pytest.mark.boots  # mounts in a namespace and runs processes

DOCKER_TMPFS_DEFAULTS = "noexec,nosuid,nodev"
SGLANG = importlib.util.find_spec("sglang")  # its package folder alone: importing sglang needs triton
NUMA_UTILS = Path(SGLANG.origin or "").parent / "srt" / "utils" / "numa_utils.py"


def can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    return done.returncode == 0


NEEDS_MOUNT = pytest.mark.skipif(not can_mount(), reason="needs unshare with user namespaces")


def tmp_options() -> str:
    tmpfs = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["glm5"]["tmpfs"]
    (entry,) = [e for e in tmpfs if e.split(":")[0] == "/tmp"]
    return entry.split(":", 1)[1]


def sglang_script_runs(options: str) -> subprocess.CompletedProcess[str]:
    """Inside a fresh mount namespace, /tmp as Docker would mount it with OPTIONS; SGLang's function writes its
    launcher script there and the launcher runs the interpreter (through a stand-in numactl that drops its options)."""
    source = NUMA_UTILS.read_text()
    (fn,) = [
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef) and n.name == "_create_numactl_executable"
    ]
    program = (
        "import multiprocessing, multiprocessing.spawn, os, random, subprocess, sys, time\nfrom pathlib import Path\n"
        + ast.get_source_segment(source, fn)
        + "\npath, _ = _create_numactl_executable(numactl_args='--cpunodebind=0 --membind=0')\n"
        "try:\n"
        "    done = subprocess.run([path, '-c', 'print(42)'], capture_output=True, text=True)\n"
        "    result = [path, done.returncode, done.stdout.strip(), done.stderr.strip()]\n"
        "except OSError as err:  # what multiprocessing's spawn meets: the exec refused\n"
        "    result = [path, 126, '', str(err)]\n"
        "print(json.dumps(result))\n"
    ).replace("import multiprocessing", "import json, multiprocessing", 1)
    # Everything under the host's /tmp (pytest's folders, a clone made with mktemp) is hidden once the tmpfs is
    # mounted over it: the stand-in numactl goes into the new /tmp, and the base interpreter runs the stdlib program.
    numactl = '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n'
    mount = (
        f"mount -t tmpfs -o {DOCKER_TMPFS_DEFAULTS},{options} tmpfs /tmp && findmnt -n -o OPTIONS /tmp >&2"
        f" && mkdir /tmp/bin && printf '{numactl}' > /tmp/bin/numactl && chmod 755 /tmp/bin/numactl"
    )
    python = str(Path(sys.base_prefix) / "bin" / "python3")
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", f'{mount} && exec "$0" -c "$1"', python, program],
        capture_output=True, text=True, check=False, timeout=60, env={"PATH": "/tmp/bin:/usr/bin:/bin"},
    )  # fmt: skip


@NEEDS_MOUNT
def test_sglangs_launcher_script_runs_from_the_compose_tmp() -> None:
    options = tmp_options()
    assert "exec" in options.split(","), options
    done = sglang_script_runs(options)
    assert done.returncode == 0, done.stderr
    path, code, out, err = json.loads(done.stdout)
    assert path.startswith("/tmp/sglang_temp_file_") and (code, out) == (0, "42"), err


@NEEDS_MOUNT
def test_a_docker_tmpfs_without_exec_refuses_it() -> None:
    """The rule the option defends: without `exec`, the scheduler launch fails (exit 126, Permission denied)."""
    options = ",".join(o for o in tmp_options().split(",") if o != "exec")
    done = sglang_script_runs(options)
    assert "noexec" in done.stderr  # findmnt: what the kernel mounted
    _, code, _, err = json.loads(done.stdout)
    assert code == 126 or "Permission denied" in err, (code, err)
