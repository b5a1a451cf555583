"""Shared fixtures: copies of the real installed flashinfer-python, unpatched and patched, and of the sglang files the
series patches; the kit's environment aimed at the test run's own folders, and the check that the run left none of
the image's folders on the host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from configuration import settings
from patches.apply import read_series

ROOT = Path(__file__).resolve().parents[1]
# The kit's thin executables run `python3` from PATH: make it this interpreter (the test venv's).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
# No test installs an environment: ci/test set them all up before pytest started (ci/smoke and ci/eval would set up
# theirs on first use; here a missing one is an error naming `ci/setup-test-env NAME`).
os.environ["SETUP_TEST_ENV_CHECK"] = "1"
# The suite does not depend on the caller's shell (issue 49: GLM5_REQUIRE_IMAGE=1 exported for a release's .ci/run
# reached the container's entrypoint, which refuses host settings): the kit's settings the shell exported are set
# aside for the whole run, named in pytest's header; each test builds the environment it means (kit_env).
SET_ASIDE = sorted(name for name in os.environ if name.startswith("GLM5_"))
for _name in SET_ASIDE:
    del os.environ[_name]
SCENARIOS = ROOT / "tests" / "helpers" / "dynamo_scenarios.py"
SERIES_FILE = ROOT / "patches" / "series"
ABSENT = pytest.StashKey[list[Path]]()  # the image's folders that did not exist when the run began
RUN_FOLDERS = Path(tempfile.mkdtemp(prefix="glm5-tests-"))  # this test process's state and log folders


def kit_env(*drop: str, **env: str) -> dict[str, str]:
    """This process's environment less every GLM5_* variable (and those starting with a prefix in `drop`), with
    GLM5_STATE_DIR and GLM5_LOG_DIR in a fresh folder of the test run's (never the image's /run/glm5 and
    /var/log/glm5, which the kit creates when missing), then `env` on top."""
    folder = Path(tempfile.mkdtemp(dir=RUN_FOLDERS))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GLM5_", *drop))}
    return base | {"GLM5_STATE_DIR": str(folder / "run"), "GLM5_LOG_DIR": str(folder / "log")} | env


def healthcheck_json(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any]]:
    """`healthcheck --json ARGS` under `env`: its exit code and the JSON it printed."""
    done = subprocess.run(
        [str(ROOT / "healthcheck" / "healthcheck"), "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout.splitlines()[0])


def image_folders() -> list[Path]:
    """The folders only the image creates: the state and log folders' defaults in glm5.toml."""
    declared = settings.declarations()
    return [Path(str(declared[name].default)) for name in ("GLM5_STATE_DIR", "GLM5_LOG_DIR")]


def appeared(absent_before: list[Path]) -> list[Path]:
    """Those of the folders absent before that exist now."""
    return [folder for folder in absent_before if folder.exists()]


def pytest_report_header() -> str:
    aside = ", ".join(SET_ASIDE) or "none"
    return f"the kit's settings exported by the shell, set aside for this run: {aside}"


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[ABSENT] = [folder for folder in image_folders() if not folder.exists()]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(RUN_FOLDERS, ignore_errors=True)
    left = appeared(session.config.stash.get(ABSENT, []))
    if left:
        names = ", ".join(map(str, left))
        print(
            f"\nthe test run created {names} on this host: a test runs the kit without its own folders "
            "(use conftest.kit_env); remove them before the next run",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def installed_site(package: str) -> Path:
    """The site-packages folder this interpreter imports PACKAGE from (.venv's: the image's versions)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed: run .ci/run"
    return Path(spec.origin).resolve().parent.parent


def copy_flashinfer(dest: Path) -> Path:
    """Copy flashinfer/ and its dist-info from the real install into dest (a site-packages)."""
    site = installed_site("flashinfer")
    dest.mkdir(parents=True)
    shutil.copytree(
        site / "flashinfer",
        dest / "flashinfer",
        ignore=shutil.ignore_patterns("__pycache__", "GLM5_SERVE_PATCHES.json"),
    )
    for info in site.glob("flashinfer_python-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    return dest


def copy_sglang(dest: Path) -> Path:
    """Copy into dest (a site-packages), from the real install, what patches/apply and patches/verify read of sglang
    (neither imports it): sglang/__init__.py, each file the series' sglang patches change, and sglang's dist-info."""
    site = installed_site("sglang")
    files = [
        "sglang/__init__.py",
        *(f for p in read_series(SERIES_FILE) if p.package == "sglang" for f in p.files),
    ]
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / rel, dest / rel)
    for info in site.glob("sglang-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    return dest


def run_apply(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "patches" / "apply"), *args], capture_output=True, text=True, check=False
    )


# Each worker's copies of FlashInfer (about 0.6 GB each) are removed when its session ends: pytest keeps its session
# folders (the last three runs), and the image build after the suite needs the disk.
@pytest.fixture(scope="session")
def unpatched_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tree = copy_flashinfer(tmp_path_factory.mktemp("flashinfer") / "unpatched")
    yield tree
    shutil.rmtree(tree.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def patched_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tree = copy_flashinfer(tmp_path_factory.mktemp("flashinfer") / "patched")
    done = run_apply("--target", str(tree), "--package", "flashinfer")
    assert done.returncode == 0, done.stderr
    yield tree
    shutil.rmtree(tree.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def patched_sglang_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site-packages with the files the series' sglang patches change (copy_sglang), patched: for PYTHONPATH beside
    patched_tree, where patches/verify checks every package (a few hundred KB)."""
    tree = copy_sglang(tmp_path_factory.mktemp("sglang") / "patched")
    done = run_apply("--target", str(tree), "--package", "sglang")
    assert done.returncode == 0, done.stderr
    return tree


@pytest.fixture(scope="session")
def fake_nvcc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CUDA_HOME whose bin/nvcc prints release 12.9 in nvcc's own format."""
    home = tmp_path_factory.mktemp("cuda-12.9")
    (home / "bin").mkdir()
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        "echo 'Cuda compilation tools, release 12.9, V12.9.86'\n"
    )
    nvcc.chmod(0o755)
    return home


def tree_env(tree: Path, **env: str | None) -> dict[str, str]:
    out = {
        k: v for k, v in os.environ.items() if k not in ("FLASHINFER_CUDA_VERSION", "CUDA_HOME", "CUDA_PATH")
    }
    out["PYTHONPATH"] = f"{tree}{os.pathsep}{ROOT}"
    for key, value in env.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def run_scenarios(tree: Path, *names: str, **env: str | None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(SCENARIOS), *names],
        capture_output=True,
        text=True,
        env=tree_env(tree, **env),
        check=False,
        timeout=300,
    )
    for line in done.stdout.splitlines():
        if line.startswith("SCENARIOS-JSON "):
            result: dict[str, Any] = json.loads(line.removeprefix("SCENARIOS-JSON "))
            assert result["module"].startswith(str(tree)), f"imported {result['module']}, not {tree}"
            return result
    raise AssertionError(f"scenario run failed (rc {done.returncode}):\n{done.stderr[-3000:]}")


@pytest.fixture
def containers() -> Iterator[list[Any]]:
    """Containers (helpers.container.start) a test appends; stopped, and their processes reaped, afterwards."""
    made: list[Any] = []
    yield made
    stop_all(made)


def stop_all(made: list[Any], timeout: float = 20) -> None:
    """Containers stopped as a fleet's are: each told first, then each waited for (their drains overlap), killed
    past `timeout`, and what any left alive reaped."""
    running = [c for c in made if c.proc.poll() is None]
    for c in running:
        c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for c in running:
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(c.proc.pid, signal.SIGKILL)
    for c in made:
        for p in c.leftovers():
            p.kill()
