"""Run the kit's code as another user: a copy of the parts it needs, in a folder every user can reach.

A checkout can sit under a folder only its owner may enter (`mktemp -d` makes 0700 folders, and /root is 0700);
a process dropped to another UID with setpriv then cannot even execute the script. The copy lives in a fresh
folder under the system's temporary directory, made readable and searchable by all.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from conftest import ROOT


def reachable_copy(*rels: str) -> Path:
    """Copy ROOT/rel for each rel (files or folders, their modes kept) into a fresh 0755 folder; return it.
    The caller removes it."""
    root = Path(tempfile.mkdtemp(prefix="glm5-kit-"))
    root.chmod(0o755)
    for rel in rels:
        src, dst = ROOT / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | (0o755 if path.is_dir() else 0o644))
    return root
