"""`healthcheck --log FILE`: a saved log judged outside any start (no record of this container's is about it). Where
the log names no counts of its own (no start marker, no printed list), it is judged by what this environment's
configuration would expect, as launch would record them. The one place in healthcheck/ that resolves the
configuration: a running start's probes read its record (configuration/start.py RESOLVERS), and only the command line
with --log runs this module (healthcheck/healthcheck), so no probe of a start imports the configuration."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from common.report import Problems
from configuration import config
from healthcheck import probe
from healthcheck.verdict import Counts


def configured_counts(environ: Mapping[str, str]) -> Counts | None:
    """The decode and prefill counts the configuration under `environ` expects; None under an invalid setting."""
    try:
        effective = config.resolve(environ)
    except Problems:
        return None
    return Counts(len(effective.decode_sizes), len(effective.prefill_sizes))


def main(argv: list[str] | None = None) -> int:
    """`healthcheck --log FILE ...` (healthcheck/healthcheck runs this module for --log): the probe's command line with
    the configuration's counts as the fallback."""
    return probe.main(argv, fallback=configured_counts(os.environ))


if __name__ == "__main__":
    sys.exit(main())
