"""Opt-in download of the checkpoint into the model folder (GLM5_DOWNLOAD=1).

By default the weights are a mounted folder and nothing is fetched; preflight names the exact
download command when the folder is missing or incomplete.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from common.report import Log, Problem

MODEL_DIR_MISSING = 30  # preflight's code: the start stops as if the folder were missing


def download(
    values: Mapping[str, Any], log: Log, snapshot_download: Callable[..., str] | None = None
) -> None:
    """Fetch values['model_repo'] into values['model_dir'], resuming; raises a Problem."""
    if snapshot_download is None:
        try:
            from huggingface_hub import snapshot_download
        except ImportError as err:
            raise Problem(
                "GLM5_DOWNLOAD",
                "needs huggingface_hub in the image",
                "pip install huggingface_hub",
                MODEL_DIR_MISSING,
            ) from err
    log.info(
        f"weights: downloading {values['model_repo']} into {values['model_dir']} (resumes a partial download)"
    )
    try:
        snapshot_download(
            repo_id=values["model_repo"], local_dir=values["model_dir"], token=values["hf_token"]
        )
    except Exception as err:
        raise Problem(
            "GLM5_DOWNLOAD",
            f"downloading {values['model_repo']} failed: {err}",
            "check HF_TOKEN(_FILE), network access and free disk under the model folder",
            MODEL_DIR_MISSING,
        ) from err
    log.info(f"weights: {values['model_repo']} is in {values['model_dir']}")
