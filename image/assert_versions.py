"""Fail unless each NAME==VERSION is what this python has installed (the Dockerfile's ARGs vs the lock).

image/assert-versions sglang==0.5.23 torch==2.14.1 ...
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version


def main(pins: list[str]) -> int:
    wrong = []
    for pin in pins:
        name, _, want = pin.partition("==")
        try:
            have = version(name)
        except PackageNotFoundError:
            have = "not installed"
        if have.split("+")[0] != want:
            wrong.append(f"{name}: the Dockerfile ARG says {want}, the image has {have}")
    for line in wrong:
        print(
            f"image/assert-versions: {line}; make image/requirements.in and the ARGs agree, then image/relock",
            file=sys.stderr,
        )
    if not pins:
        print("usage: image/assert-versions NAME==VERSION ...", file=sys.stderr)
        return 2
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
