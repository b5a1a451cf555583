"""Opt-in download of the checkpoint into the model folder (GLM5_DOWNLOAD=1).

By default the weights are a mounted folder and nothing is fetched; preflight names the exact
download command when the folder is missing or incomplete.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from config import read_secret

DOWNLOAD_VAR = "GLM5_DOWNLOAD"


def wanted(environ: Mapping[str, str]) -> tuple[bool, str | None]:
    raw = environ.get(DOWNLOAD_VAR, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False, None
    if raw in ("1", "true", "yes"):
        return True, None
    return False, f"{DOWNLOAD_VAR}={raw!r}: expected 1 (download the weights at start) or 0"


def download(
    values: Mapping[str, Any],
    environ: Mapping[str, str],
    log: Callable[[str], None],
    snapshot_download: Callable[..., str] | None = None,
) -> list[str]:
    """Fetch values['model_repo'] into values['model_dir'], resuming; returns errors."""
    token, errors = read_secret(environ, "HF_TOKEN")
    if errors:
        return errors
    if snapshot_download is None:
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            return [f"{DOWNLOAD_VAR}=1 needs huggingface_hub in the image: pip install huggingface_hub"]
    log(
        f"weights: downloading {values['model_repo']} into {values['model_dir']} (resumes a partial download)"
    )
    try:
        snapshot_download(repo_id=values["model_repo"], local_dir=values["model_dir"], token=token)
    except Exception as err:  # noqa: BLE001 - any hub failure is reported, then the start stops
        return [
            f"{DOWNLOAD_VAR}=1: downloading {values['model_repo']} failed: {err}; check HF_TOKEN(_FILE), "
            "network access and free disk under the model folder"
        ]
    log(f"weights: {values['model_repo']} is in {values['model_dir']}")
    return []
