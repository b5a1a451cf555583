"""SGLang 0.5.23's own resolution of the server command line, asked at preflight, before the weights load: whether it
accepts the flags, and what a rank will capture (the prefill chunk, the prefill shapes, the decode batches), which the
kit's expectation (configuration/config.py, batch_sizes.py: the counts the healthcheck waits for) must equal.

The resolution runs in its own process (entrypoint/resolve_flags.py, stand-alone: torch and sglang only), by the
server's Python (in the image /opt/venv/bin/python3, the kit's own) and in the server's environment (SGLANG_* variables
change what it settles), with the checkpoint's config.json in the model folder; about 10 s of CPU, mostly sglang's
import. The dry run has no checkpoint and keeps the kit's own arithmetic.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from configuration import batch_sizes, config

RUNNER = Path(__file__).resolve().parent / "resolve_flags.py"
RESOLVED = "RESOLVED "  # the runner's line on stdout (resolve_flags.RESOLVED)
TIMEOUT_SECONDS = 300
# The box's KV capacity is measured only after the load. SGLang's request pool is min(its estimate, capacity / 2) and
# its estimate at least 2048 (mem_cache/kv_cache_configurator.py resolve_max_num_reqs): a rank holding 4096 tokens has
# the pool the kit's arithmetic assumes (batch_sizes.POOL_FLOOR, or max running requests / D when smaller). Every
# layout the kit allows holds far more (the dry run's table), and a pool above the largest decode batch clamps nothing.
KV_TOKENS = 2 * batch_sizes.POOL_FLOOR
# The runner's exit codes (resolve_flags.py)
REFUSED, USAGE, UNREADABLE = 1, 2, 3


@dataclass(frozen=True)
class Captures:
    """What a rank captures: its prefill chunk (tokens a step), the prefill token shapes and the decode batch sizes."""

    chunk: int
    prefill: tuple[int, ...]
    decode: tuple[int, ...]

    @classmethod
    def expected(cls, effective: config.Effective) -> Captures:
        """The kit's expectation: what launch records and the healthcheck waits for."""
        return cls(effective.prefill_chunk, tuple(effective.prefill_sizes), tuple(effective.decode_sizes))


@dataclass(frozen=True)
class Resolved:
    """SGLang's answer: what a rank captures, for a request pool of `pool` (resolve_max_num_reqs of KV_TOKENS)."""

    captures: Captures
    pool: int


@dataclass(frozen=True)
class Failed:
    """No answer. `kind`: "refused" (sglang refused the flags: its resolution or check_server_args), "usage" (its
    argument parser refused them), "unreadable" (resolved, but what it settled could not be read), "not_run" (the
    runner did not start, finish or answer); `reason`: the runner's last line, or why it did not run."""

    kind: str
    reason: str


@dataclass(frozen=True)
class Difference:
    """One value SGLang settles otherwise than the kit expects."""

    what: str  # "prefill chunk", "prefill shapes", "decode batches"
    expected: int | tuple[int, ...]
    resolved: int | tuple[int, ...]


def runner_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The server's environment, offline (a local model folder needs no network) and without Python's warnings."""
    return dict(environ) | {"HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def last_line(text: str) -> str:
    """The reason a runner gives: its last line that is not SGLang's own log (`[date time] ...`)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("[")]
    return (lines or ["(no output)"])[-1]


def resolve(
    server_args: Sequence[str],
    python: str,
    environ: Mapping[str, str],
    kv_tokens: int = KV_TOKENS,
    timeout: float = TIMEOUT_SECONDS,
) -> Resolved | Failed:
    """SGLang's resolution of `server_args` (the argv after `python3 -m sglang.launch_server`), run by `python` in
    `environ` (the server's)."""
    try:
        done = subprocess.run(
            [python, str(RUNNER), "--kv-tokens", str(kv_tokens), *server_args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env=runner_env(environ),
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return Failed("not_run", str(err))
    return answer(done.returncode, done.stdout, done.stderr)


def answer(returncode: int, stdout: str, stderr: str) -> Resolved | Failed:
    """The runner's answer, from its exit code and output."""
    if returncode in (REFUSED, USAGE, UNREADABLE):
        kind = {REFUSED: "refused", USAGE: "usage", UNREADABLE: "unreadable"}[returncode]
        return Failed(kind, last_line(stderr))
    answers = [ln for ln in stdout.splitlines() if ln.startswith(RESOLVED)]
    if returncode != 0 or not answers:
        return Failed("not_run", f"exit {returncode}: {last_line(stderr)}")
    try:
        found = json.loads(answers[-1].removeprefix(RESOLVED))
        captures = Captures(int(found["chunk"]), tuple(found["prefill"]), tuple(found["decode"]))
        return Resolved(captures, int(found["pool"]))
    except (ValueError, KeyError, TypeError) as err:
        return Failed("unreadable", f"{answers[-1][:300]} ({err})")


def differences(expected: Captures, resolved: Captures) -> list[Difference]:
    """Each value of `resolved` that is not `expected`'s."""
    pairs: tuple[tuple[str, int | tuple[int, ...], int | tuple[int, ...]], ...] = (
        ("prefill chunk", expected.chunk, resolved.chunk),
        ("prefill shapes", expected.prefill, resolved.prefill),
        ("decode batches", expected.decode, resolved.decode),
    )
    return [Difference(what, mine, theirs) for what, mine, theirs in pairs if mine != theirs]


def shown(value: int | tuple[int, ...]) -> str:
    """A value for a message: a list as its count and ends."""
    if isinstance(value, int):
        return str(value)
    return f"{len(value)} ({value[0]}..{value[-1]})" if value else "0"
