"""bubblewrap sandboxes: a read-only root as the compose service has, without a container engine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def bwrap_works() -> bool:
    """bubblewrap installed and allowed to make a sandbox (root, or user namespaces allowed: Ubuntu 24.04's AppArmor
    refuses them to a plain user, as on hosted runners)."""
    if shutil.which("bwrap") is None:
        return False
    done = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "true"], capture_output=True, check=False
    )
    return done.returncode == 0


NEEDS_BWRAP = pytest.mark.skipif(
    not bwrap_works(),
    reason="bubblewrap cannot make a sandbox here (not installed, or user namespaces refused)",
)


def sandbox(root: Path, *binds: tuple[str, Path]) -> tuple[str, ...]:
    """bubblewrap: a read-only root, an empty /tmp, the checkout read-only, then each (mode, path): ro or rw."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    argv += ["--ro-bind", str(root), str(root), "--die-with-parent"]
    for mode, path in binds:
        argv += ["--ro-bind" if mode == "ro" else "--bind", str(path), str(path)]
    return tuple(argv)


def with_image_folders(argv: tuple[str, ...], tmp: Path, folders: list[Path]) -> tuple[str, ...]:
    """The sandbox with the image's own folders (/run/glm5, /var/log/glm5) writable, each a folder of the test
    (tmp/run-glm5, ...) on an empty tmpfs parent, so that nothing is made on the host's /run or /var/log."""
    extra: list[str] = []
    for folder in folders:
        outside = tmp / "-".join(folder.parts[1:])
        outside.mkdir(parents=True, exist_ok=True)
        extra += ["--tmpfs", str(folder.parent), "--bind", str(outside), str(folder)]
    return (*argv, *extra)
