"""Run a script that asks the real sglang 0.5.23 (CPU, triton stubbed) and prints `ORACLE-JSON {...}`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

STUBS = Path(__file__).resolve().parents[1] / "stubs"


def ask(
    script: Path, request: dict[str, Any], python: str | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The script's answer to `request` (JSON on its stdin): run by the test venv's python with the triton stub on
    PYTHONPATH, or by `python` as it is (another venv, with its own triton); `env` on top."""
    done = subprocess.run(
        [python or sys.executable, str(script)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": "" if python else str(STUBS)} | (env or {}),
        check=False,
        timeout=300,
    )
    for line in done.stdout.splitlines():
        if line.startswith("ORACLE-JSON "):
            result: dict[str, Any] = json.loads(line.removeprefix("ORACLE-JSON "))
            return result
    raise AssertionError(done.stderr[-3000:])
