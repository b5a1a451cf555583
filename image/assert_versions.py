"""Fail unless each NAME==VERSION is what this python has installed (the Dockerfile's ARGs vs the lock).

image/assert-versions sglang==0.5.23 torch==2.14.1 ...
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version

from common.report import FAILED, OK, Log, Problem

LOG = Log("image/assert-versions")


def parse(argv: list[str]) -> list[str]:
    """The pins; --help prints the usage and exits 0, an option or a word that is not NAME==VERSION exits 2."""
    parser = argparse.ArgumentParser(prog="image/assert-versions", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "pins", nargs="+", metavar="NAME==VERSION", help="a package and the version it must be"
    )
    pins: list[str] = parser.parse_args(argv).pins
    malformed = [pin for pin in pins if not all(pin.partition("==")[::2]) or pin.count("==") != 1]
    if malformed:
        parser.error(f"not NAME==VERSION: {' '.join(malformed)}")
    return pins


def main(argv: list[str]) -> int:
    pins = parse(argv)
    wrong = []
    for pin in pins:
        name, _, want = pin.partition("==")
        try:
            have = version(name)
        except PackageNotFoundError:
            have = "not installed"
        if have.split("+")[0] != want:
            wrong.append(
                Problem(
                    name,
                    f"the Dockerfile ARG says {want}, the image has {have}",
                    "change the pin in entrypoint/glm5.toml [image], run ci/render and image/relock",
                    FAILED,
                )
            )
    return LOG.problems(wrong, "version(s) differ from the pins") if wrong else OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
