"""The container as entrypoint.sh runs it (the real supervisord, the kit's launch), with the REAL SGLang 0.5.23
server on the CPU as its server program (tests/helpers/sglang_cpu_server.py) serving a tiny random Llama; its sglang
patched as the image's (patches/series, applied by ci/setup-test-env), checked before the first start.

Every start runs with GLM5_ACCEPT_PARTIAL_CAPTURE=1 (a CPU start captures no CUDA graph) and GLM5_VERIFY=off (a
random model answers nothing rightly): the capturing and verifying phases stay with the recorded logs and the
double. A start takes 20-70 s (about 90% imports), 1.8 GiB over its four processes.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ci import readiness
from conftest import ROOT
from helpers import container

PYTHON = ROOT / ".venv-sglang-cpu" / "bin" / "python"
PROGRAM = ROOT / "tests" / "helpers" / "sglang_cpu_server.py"
TINY_LLAMA = ROOT / "tests" / "helpers" / "tiny_llama.py"
MISSING = f"{PYTHON} is missing: run ci/setup-test-env (or ci/setup-test-env sglang-cpu)"
START_TIMEOUT = (
    300  # seconds: 19-42 s measured on 2 cores, 70 s with other jobs on them; generous, never waited out
)


@dataclass
class RealContainer(container.Container):
    booted_at: datetime.datetime
    was_ready: bool = False

    def wait_ready(self, timeout: float = START_TIMEOUT) -> readiness.Readiness:
        """Until the kit's healthcheck calls this start ready (or failed, or the entrypoint exited); a poll a second:
        each runs the healthcheck, a Python process, on the cores the server's imports need."""
        waited = readiness.wait_until_ready(self.target, timeout, 1.0, self.booted_at, lambda _line: None)
        assert waited.ready, f"not ready: {waited.reason}\n{self.target.log_tail(60)}"
        self.was_ready = True
        return waited


def make_model(folder: Path) -> Path:
    """The tiny Llama, written now (tests/helpers/tiny_llama.py): no weights are stored."""
    assert PYTHON.exists(), MISSING
    subprocess.run([str(PYTHON), str(TINY_LLAMA), str(folder)], check=True, capture_output=True, timeout=300)
    return folder


@functools.cache
def patched() -> None:
    """The venv's sglang carries the series' sglang patches, as the image's does (ci/setup-test-env applies them):
    patches/verify's SGLang checks, with the venv's python (about 0.3 s, once per worker)."""
    done = subprocess.run(
        [str(PYTHON), "-m", "patches.verify", "--package", "sglang", "--skip-compile", "--json"],
        capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)}, check=False, timeout=120,
    )  # fmt: skip
    failed = [c["detail"] for c in json.loads(done.stdout or '{"checks": []}')["checks"] if not c["ok"]]
    assert done.returncode == 0 and not failed, (
        f"{PYTHON}'s sglang is not patched as the image's ({'; '.join(failed) or done.stderr[-400:]}): "
        "run ci/setup-test-env sglang-cpu"
    )


def start(tmp: Path, model: Path, stop_timeout: float = 60, **env: str) -> RealContainer:
    """The container on a free port, booted now; `stop_timeout` bounds Local.stop (then the group is killed)."""
    assert PYTHON.exists(), MISSING
    patched()
    port = container.free_port()
    real = {
        "GLM5_SERVER_PROGRAM": f"{sys.executable} {PROGRAM}",
        "SGLANG_CPU_MODEL": str(model),
        "GLM5_ACCEPT_PARTIAL_CAPTURE": "1",
        "GLM5_VERIFY": "off",
        "GLM5_CACHE_DIR": str(tmp / "cache"),  # SGLANG_CACHE_DIR and the JIT caches under it, never /cache
    }
    full = container.environment(tmp, port, **(real | env))
    conn = readiness.Connection(f"http://127.0.0.1:{port}", None)
    target = readiness.Local(conn, full, tmp / "entrypoint.out", stop_timeout=stop_timeout)
    booted_at = readiness.now()
    target.boot({})
    return RealContainer(target, port, tmp, booted_at)
