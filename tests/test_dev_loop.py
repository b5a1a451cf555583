"""The developer loop's own promises: ci/test and ci/setup-test-env say what they need before they start and name
the fix (one line, exit 1), install nothing from inside the tests, and ci/test --fast asks for .venv alone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from conftest import ROOT

FAKE_PYTHON_310 = '#!/bin/sh\n[ "$1" = --version ] && { echo "Python 3.10.12"; exit 0; }\nexit 1\n'
# 1 GB free: the set-up says what it would install, then stops before installing anything (no pip runs).
FAKE_DF_1GB = (
    "#!/bin/sh\necho 'Filesystem 1K-blocks Used Available Use% Mounted on'\necho '/dev/x 9 9 1048576 99% /'\n"
)


def kit_copy(tmp: Path) -> Path:
    """ci/'s scripts and requirements in a fresh folder: no venv, nothing set up."""
    root = tmp / "kit"
    shutil.copytree(ROOT / "ci", root / "ci", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "common", root / "common", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tests" / "crd").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "crd" / "package-lock.json", root / "tests" / "crd")
    return root


def fake_bin(tmp: Path, **scripts: str) -> Path:
    folder = tmp / "bin"
    folder.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def run(cmd: list[str], path: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "SETUP_TEST_ENV_CHECK"}
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, check=False, env=environ | {"PATH": path} | env
    )


def test_the_tests_install_nothing(tmp_path: Path) -> None:
    """conftest sets SETUP_TEST_ENV_CHECK=1: ci/smoke's set-up on first use is then an error naming the command."""
    assert os.environ["SETUP_TEST_ENV_CHECK"] == "1"
    root = kit_copy(tmp_path)
    done = run(
        [str(root / "ci" / "setup-test-env"), "smoke", "eval"], os.environ["PATH"], SETUP_TEST_ENV_CHECK="1"
    )
    assert done.returncode == 1
    assert done.stderr == (
        "ci/setup-test-env: not set up: .venv-smoke, .venv-eval; SETUP_TEST_ENV_CHECK=1 (as in the tests) installs "
        "nothing: run ci/setup-test-env smoke eval\n"
    )
    assert sorted(p.name for p in root.iterdir()) == ["ci", "common", "tests"]


def test_an_old_python_is_named_before_anything_is_installed(tmp_path: Path) -> None:
    root = kit_copy(tmp_path)
    path = f"{fake_bin(tmp_path, python3=FAKE_PYTHON_310)}:{os.environ['PATH']}"
    done = run([str(root / "ci" / "setup-test-env"), "fast"], path)
    assert done.returncode == 127  # common/host-python.sh, sourced first by every host tool
    assert "the kit's host tools need 3.11 or newer; fix: install Python 3.11+" in done.stderr
    assert not (root / ".venv").exists()


def test_an_old_python_under_sudo_names_sudos_reset_path(tmp_path: Path) -> None:
    """`sudo entrypoint/doctor --host` (ACS needs root) runs sudo's secure_path python3, not the user's 3.11 first on
    PATH: the fix then keeps the user's PATH through sudo."""
    path = f"{fake_bin(tmp_path, python3=FAKE_PYTHON_310)}:{os.environ['PATH']}"
    done = run([str(ROOT / "entrypoint" / "doctor"), "--host"], path, SUDO_USER="ops")
    assert done.returncode == 127
    assert "python3 under sudo is none (sudo resets PATH" in done.stderr  # the fake answers only --version
    assert 'sudo env "PATH=$PATH" entrypoint/doctor ...' in done.stderr
    done = run([str(ROOT / "entrypoint" / "doctor"), "--host"], path)
    assert done.returncode == 127 and "under sudo" not in done.stderr


def test_a_short_disk_is_named_with_the_lighter_set_up(tmp_path: Path) -> None:
    """The default set needs about 13 GB on a fresh machine; with 1 GB free nothing starts."""
    root = kit_copy(tmp_path)
    df = "#!/bin/sh\necho 'Filesystem 1K-blocks Used Available Use% Mounted on'\necho '/dev/x 9 9 1048576 99% /'\n"
    done = run([str(root / "ci" / "setup-test-env")], f"{fake_bin(tmp_path, df=df)}:{os.environ['PATH']}")
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0].startswith("ci/setup-test-env: to set up: ") and lines[0].endswith("(about 13 GB)")
    assert (
        "ci/setup-test-env: needs about 13 GB of free disk here, 1 GB free: free some, or set up less "
        "(ci/setup-test-env fast: .venv alone)" in lines
    )
    assert sorted(p.name for p in root.iterdir()) == ["ci", "common", "tests"]


def test_the_fast_set_up_asks_for_no_root_apt_or_npm(tmp_path: Path) -> None:
    """What `ci/setup-test-env fast` would install on a fresh machine: .venv, nothing else (a full disk stops it
    before it starts, so this runs no pip)."""
    root = kit_copy(tmp_path)
    path = f"{fake_bin(tmp_path, df=FAKE_DF_1GB)}:{os.environ['PATH']}"
    fast = run([str(root / "ci" / "setup-test-env"), "fast"], path).stderr.splitlines()
    full = run([str(root / "ci" / "setup-test-env"), "tests"], path).stderr.splitlines()
    assert fast[0] == "ci/setup-test-env: to set up: .venv (about 3 GB)"
    assert ".venv-checkov" in full[0] and "tests/crd/node_modules" in full[0] and ".cuda-13.0" in full[0]


def planned_gb(root: Path, *modes: str) -> int:
    path = f"{fake_bin(root.parent, df=FAKE_DF_1GB)}:{os.environ['PATH']}"
    first = run([str(root / "ci" / "setup-test-env"), *modes], path).stderr.splitlines()[0]
    found = re.search(r"\(about (\d+) GB\)$", first)
    assert found, first
    return int(found[1])


def test_the_readme_and_ci_test_state_the_disk_the_set_up_asks_for(tmp_path: Path) -> None:
    root = kit_copy(tmp_path)
    full, fast = planned_gb(root), planned_gb(root, "fast")
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"about {full} GB free on a fresh machine" in readme
    assert f"`ci/test --fast` sets up `.venv` alone (about {fast} GB, no root)" in readme
    usage = " ".join(run([str(ROOT / "ci" / "test"), "--help"], os.environ["PATH"]).stdout.split())
    assert f"about {full} GB of free disk on a fresh machine; --fast about {fast} GB, no root" in usage


def test_ci_test_names_a_missing_kubectl_and_an_old_python_first(tmp_path: Path) -> None:
    root = kit_copy(tmp_path)
    tools = fake_bin(tmp_path, python3=FAKE_PYTHON_310)
    for name in ("bash", "dirname", "sed"):  # what ci/test runs before its check: no kubectl among them
        (tools / name).symlink_to(shutil.which(name) or name)
    done = run([str(root / "ci" / "test"), "--fast"], str(tools))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "ci/test: needs python3 3.11 or newer (found: Python 3.10.12): install it, or put it first on PATH",
        "ci/test: needs kubectl (the tests and ci/lint render k8s/ with kubectl kustomize): install its client",
    ]
    assert sorted(p.name for p in root.iterdir()) == ["ci", "common", "tests"]
