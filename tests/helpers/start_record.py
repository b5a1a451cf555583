"""A whole start record (configuration/start.py Start) as entrypoint/launch --serve writes it, from glm5.toml's
defaults with the fields a test names over them: tests hand the probe, the gate and the lifecycle listener the typed
record they read."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

from configuration import config, state
from configuration.start import Start

START_FACTS = {"start": 1, "pid": 1, "started_at": "", "allreduce": {"backend": "nccl"},
               "max_jobs_sized": None, "doctor_warnings": [], "context_tokens": 16384}  # fmt: skip


def record(**fields: Any) -> Start:
    """The record of a start under glm5.toml's defaults, begun now, `fields` over it; counts as lists of that length:
    decode_expected=N and prefill_expected=N give N sizes."""
    fields.setdefault("started_at", datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    decode, prefill = fields.pop("decode_expected", None), fields.pop("prefill_expected", None)
    made = Start.of(config.resolve({}).state({}) | START_FACTS)
    assert made is not None
    if decode is not None:
        fields.setdefault("decode_batch_sizes", tuple(range(1, decode + 1)))
    if prefill is not None:
        fields.setdefault("prefill_token_sizes", tuple(range(1, prefill + 1)))
    return dataclasses.replace(made, **fields)


def write(state_dir: str | Path, **fields: Any) -> Start:
    """Write the record to `state_dir`'s launch.json, as launch does, and return it."""
    made = record(**fields)
    state.write_launch(state_dir, made)
    return made
