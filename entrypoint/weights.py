"""Download the checkpoint into the model folder as a step of its own, then check it as preflight does.

    entrypoint/download           (`docker compose run --rm download`; the Kubernetes weights Job)
    entrypoint/download --wait    download nothing: wait until the folder is complete (the pod's init container)

Runs the real `hf download REPO --local-dir DIR` of the image's huggingface_hub: resumable (complete
files are skipped, partial ones continued), with the token from HF_TOKEN or HF_TOKEN_FILE passed in its
environment, never on its command line. Then preflight's checkpoint check, so "done" means what the
server's start will find. The server never downloads: a 410 GB download inside a start would outlast
a start's budget, and the server pods need no egress.

Exit codes (common/report.py): 0 complete, 3 an invalid setting, 30 the folder cannot be written or the
download failed, 31-35 incomplete afterwards (preflight's codes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.report import INVALID_SETTING, Log, Problem, Problems
from configuration import config
from entrypoint import preflight

LOG = Log("glm5-serve download")
HF = "hf"


def writable_problem(model_dir: Path) -> Problem | None:
    """The model folder (or, when it does not exist yet, the nearest folder above it) must be writable."""
    probe = model_dir
    while not os.access(probe, os.F_OK) and probe != probe.parent:
        probe = probe.parent  # (a folder it cannot search reads as missing: the walk stops above it)
    if os.access(probe, os.W_OK | os.X_OK):
        return None
    if os.statvfs(probe).f_flag & os.ST_RDONLY:
        return Problem(
            "download",
            f"{probe} is mounted read-only (the glm5 service serves the weights read-only)",
            "download with the service that mounts them writable: `docker compose run --rm download`",
            preflight.MODEL_DIR_MISSING,
        )
    return Problem(
        "GLM5_MODEL_HOST_DIR",
        f"{probe} is not writable by UID {os.getuid()} (Docker creates a missing host folder owned by root)",
        "on the host: `sudo install -d -o 1000 -g 0 <GLM5_MODEL_HOST_DIR>` (or chown -R 1000:0 an existing one); "
        "Kubernetes: the weights Job's fsGroup (0) must be honoured by the volume's storage class",
        preflight.MODEL_DIR_MISSING,
    )


def command(values: Mapping[str, Any]) -> list[str]:
    return [HF, "download", values["model_repo"], "--local-dir", values["model_dir"]]


def child_env(environ: Mapping[str, str], token: str | None) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in ("HF_TOKEN", "HF_TOKEN_FILE")}
    if token:
        env["HF_TOKEN"] = token  # hf reads it from there: never in argv (ps, the pod spec, the logs)
    return env


def download(values: Mapping[str, Any], environ: Mapping[str, str]) -> list[Problem]:
    model_dir = Path(values["model_dir"])
    problem = writable_problem(model_dir)
    if problem is not None:
        return [problem]
    if shutil.which(HF) is None:
        return [
            Problem(
                "download",
                "the `hf` command of huggingface_hub is not on PATH",
                "use the kit's image",
                preflight.MODEL_DIR_MISSING,
            )
        ]
    model_dir.mkdir(parents=True, exist_ok=True)
    argv = command(values)
    LOG.info(
        f"downloading {values['model_repo']} into {model_dir} (resumes a partial download): {' '.join(argv)}"
    )
    status = subprocess.run(argv, env=child_env(environ, values["hf_token"]), check=False).returncode
    if status != 0:
        return [
            Problem(
                "download",
                f"`hf download` exited {status} (its output is above)",
                "check network access to huggingface.co, HF_TOKEN(_FILE) for a gated repository and free disk "
                "under the model folder; run it again to resume",
                preflight.MODEL_DIR_MISSING,
            )
        ]
    return preflight.check_model(values)


def wait(values: Mapping[str, Any], interval: float) -> int:
    """Until the model folder is complete; says what is missing whenever that changes."""
    said = None
    while problems := preflight.check_model(values):
        now = "; ".join(p.message for p in problems)
        if now != said:
            LOG.info(f"waiting for the weights (checked every {interval:g} s): {now}")
            said = now
        time.sleep(interval)
    LOG.info(f"{values['model_dir']} is complete: the server can start")
    return 0


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="entrypoint/download",
        description="Download the weights into GLM5_MODEL_DIR with `hf download` (resumable), then check them "
        "as preflight does. Token: HF_TOKEN or HF_TOKEN_FILE.",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="download nothing; wait until the folder passes the check (exit 0)",
    )
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between checks with --wait")
    args = parser.parse_args(argv)
    try:
        values = config.resolve(environ).values
    except Problems as err:
        LOG.problems(err.problems)
        return INVALID_SETTING
    if args.wait:
        return wait(values, args.interval)
    problems = download(values, environ)
    if problems:
        return LOG.problems(problems, "the weights are not complete")
    LOG.info(f"{values['model_repo']} is complete in {values['model_dir']}: the server can start")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
