"""`healthcheck --log FILE`: a saved log judged outside any start (no record of this container's is about it). Where
the log names no counts of its own (no start marker, no printed list), it is judged by what this environment's
configuration would expect, as launch would record them. The one place in healthcheck/ that resolves the
configuration: a running start's probes read its record (configuration/start.py RESOLVERS)."""

from __future__ import annotations

from collections.abc import Mapping

from common.report import Problems
from configuration import config
from healthcheck.verdict import Counts


def configured_counts(environ: Mapping[str, str]) -> Counts | None:
    """The decode and prefill counts the configuration under `environ` expects; None under an invalid setting."""
    try:
        effective = config.resolve(environ)
    except Problems:
        return None
    return Counts(len(effective.decode_sizes), len(effective.prefill_sizes))
