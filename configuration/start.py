"""The start record (launch.json in the state folder): what one start of the server runs with, decided once by
`entrypoint/launch --serve` and read by every later reader in the container (the healthcheck and the exporter through
healthcheck/probe.py, the lifecycle listener, the gate, the support bundle) instead of resolving the configuration
again. Its one writer is launch (configuration/state.py write_launch); no secret is in it (those go to the server's
private config file).

The file's keys are a format other tools read (ci/bench, people): extended, never renamed. `Start.of` reads it back:
a record that lacks a field or holds one of the wrong type is no record (None), and the reader says so rather than
guessing. Stdlib only, cheap to import: every probe reads it.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

# The modules that resolve the configuration (configuration/config.py `resolve`, layout.py `resolve`), each with why:
# launch, which writes the record, and what runs before any start or outside one. Every other reader takes a start's
# facts from its record; tests/test_state_records.py holds the product code to this table.
RESOLVERS = {
    "entrypoint/launch.py": "the record's one writer: --prepare, --serve and --dry-run resolve",
    "entrypoint/weights.py": "the weights download, before any start",
    "entrypoint/doctor.py": "the box check and `doctor --ipc`, an operator's command before a start: the environment the "
    "server will compile under",
    "gateway/launch.py": "the gateway's own flags: the admission bound it holds before any replica's /ready answers "
    "(a replica's facts come from its /ready)",
    "healthcheck/saved_log.py": "`healthcheck --log FILE`: a saved log judged outside any start, by what this "
    "environment's configuration expects where the log names no counts",
    "ci/render.py": "renders the kit's files and docs from glm5.toml, outside any start",
}


@dataclass(frozen=True)
class Start:
    """One start's facts. The configuration's part comes from configuration/config.py Effective.state; the start's own
    (number, pid, time, the doctor's warnings, the all-reduce chosen) from entrypoint/launch."""

    start: int  # the start's number (state.next_start), named in the log's marker line
    pid: int  # launch --serve's process: the start lives while it does
    started_at: str  # ISO 8601, UTC
    argv: tuple[str, ...]  # the server's command line; the secrets are in its --config file
    env: Mapping[str, str]  # the server's environment the kit sets (the operator's values won)
    env_from: Mapping[str, str]  # where each of those came from
    overrides: Mapping[str, str]  # the GLM5_* settings the operator set
    served_model_name: str
    port: int
    log_dir: str
    cache_dir: str  # the cache volume
    build_id: str  # the image build (its BUILD-ID; "dev" outside an image)
    cache_root: str  # this build's folder on the cache volume
    health_timeout_seconds: float
    stall_seconds: float
    autotune_stall_seconds: float | None
    accept_partial_capture: bool
    verify: str  # GLM5_VERIFY: enforce, report or off
    on_failure: str  # GLM5_ON_FAILURE
    decode_batch_sizes: tuple[int, ...]  # what a rank captures: the healthcheck waits for all of them
    prefill_token_sizes: tuple[int, ...]
    prefill_chunk: int  # a rank's prefill chunk (tokens a step)
    speculative: str
    profile: str  # latency or throughput
    attn_dp_size: int  # attention-DP groups (1: plain tensor parallelism)
    context_tokens: int  # what the gateway sizes a request at ([gateway].context_tokens)
    allreduce: Mapping[str, str | None]  # {"backend": nccl or pcie_ipc, "why": the reason}
    max_jobs_sized: str | None  # how the kit sized MAX_JOBS, None when the operator set it
    doctor_warnings: tuple[Mapping[str, str], ...]  # the doctor's warnings about this box at preflight

    @property
    def decode_expected(self) -> int:
        return len(self.decode_batch_sizes)

    @property
    def prefill_expected(self) -> int:
        return len(self.prefill_token_sizes)

    def as_json(self) -> dict[str, Any]:
        """The file's form: every field, lists for tuples, and the two counts (readers of the format take them)."""
        found = asdict(self)
        for name, value in found.items():
            if isinstance(value, tuple):
                found[name] = list(value)
            elif isinstance(value, Mapping):
                found[name] = dict(value)
        return found | {"decode_expected": self.decode_expected, "prefill_expected": self.prefill_expected}

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> Start | None:
        """The record `data` holds (launch.json's JSON), or None when it is not a whole record of this kit: a field
        missing, or a value not of its field's type (the annotations above, `conforms`)."""
        if data is None:
            return None
        hints = typing.get_type_hints(cls)
        try:
            given = {f.name: data[f.name] for f in fields(cls)}
        except KeyError:
            return None
        for name, value in given.items():
            if typing.get_origin(hints[name]) is tuple and isinstance(value, list):
                given[name] = tuple(value)  # JSON's lists are the record's tuples
        if not all(conforms(value, hints[name]) for name, value in given.items()):
            return None
        return cls(**given)


def conforms(value: object, hint: Any) -> bool:
    """`value` is of the annotated type `hint`: a union's member, a tuple of its elements' type, a Mapping (its keys and
    values unchecked), or a plain type (an int is a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType:
        return any(conforms(value, arg) for arg in args)
    if origin is tuple:
        return isinstance(value, tuple) and all(conforms(item, args[0]) for item in value)
    if origin is not None:  # Mapping[K, V]
        return isinstance(value, origin)
    if hint is type(None):
        return value is None
    return isinstance(value, int | float) if hint is float else isinstance(value, hint)
