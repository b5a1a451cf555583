"""Observations for the judgement's tests (healthcheck/phase.py), as healthcheck/probe.py observe builds them, with
the image's defaults as the run's settings (glm5.toml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from healthcheck import logscan, phase
from healthcheck.verdict import Counts, Observation, Recorded, Run, Stop, Verdict, Verification

RUN = Run(
    state_dir=Path("/run/glm5"),
    log_path=Path("/var/log/glm5/server.log"),
    port=30000,
    timeout=25.0,
    stall_seconds=1800.0,
    autotune_stall_seconds=900.0,
    accept_partial=False,
    verify="enforce",
    on_failure="wait",
)


def observation(
    scan: logscan.Scan | bytes,
    expected: tuple[int | None, int | None] = (52, 58),
    alive: bool | None = None,
    http: int | str | None = None,
    quiet: float | None = None,
    stopped: Stop | None = None,
    verification: Verification | None = None,
    failed: Recorded | None = None,
    **run: Any,
) -> Observation:
    found = logscan.scan(scan) if isinstance(scan, bytes) else scan
    return Observation(
        RUN._replace(**run), found, Counts(*expected), alive, http, quiet, stopped, verification, failed
    )


def decided(scan: logscan.Scan | bytes, *args: Any, **kwargs: Any) -> Verdict:
    """The log's phase alone (phase.decide)."""
    return phase.decide(observation(scan, *args, **kwargs))


def judged(scan: logscan.Scan | bytes, *args: Any, **kwargs: Any) -> Verdict:
    """The whole judgement (phase.judge): the log, then the gate, then a recorded failure."""
    return phase.judge(observation(scan, *args, **kwargs))
