"""Fail unless each NAME==VERSION is what this python has installed (the Dockerfile's ARGs vs the lock).

image/assert-versions sglang==0.5.23 torch==2.14.1 ...
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

from common.report import FAILED, OK, USAGE, Log, Problem

LOG = Log("image/assert-versions")


def main(pins: list[str]) -> int:
    if not pins:
        LOG.error("usage: image/assert-versions NAME==VERSION ...")
        return USAGE
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
