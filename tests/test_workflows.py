"""The GitHub workflows (actionlint and their schema run in ci/lint): the rules that keep the hosted run honest (a timeout
longer than the documented run, the image built as root on freed disk, no release without an image), and
ci/build-image's skip, visible in GitHub Actions and a failure where GLM5_REQUIRE_IMAGE=1."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ci import render
from conftest import ROOT
from helpers.unprivileged import reachable_copy

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
CONFIG = ROOT / ".github" / "actionlint.yaml"
BUILD_IMAGE = ROOT / "ci" / "build-image"
REQUIRE_ON_TAGS = "${{ startsWith(github.ref, 'refs/tags/') && '1' || '0' }}"


def load(name: str) -> dict[str, Any]:
    workflow: dict[str, Any] = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    return workflow


def triggers(workflow: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 reads the bare key `on` as True.
    on: dict[str, Any] = workflow.get("on", workflow.get(True))
    return on


def run_steps(job: dict[str, Any]) -> list[str]:
    return [step["run"].strip() for step in job["steps"] if "run" in step]


def figure(key: str) -> float:
    """A measured figure from ci/figures.toml, the one place the kit states them."""
    (found,) = [f["value"] for f in render.load_figures() if f["key"] == key]
    return float(found)


# The labels every self-hosted runner has (actionlint knows them unasked).
RUNNER_DEFAULTS = {"self-hosted", "linux", "macos", "windows", "x64", "arm", "arm64"}


def test_the_config_declares_every_self_hosted_label() -> None:
    """ci/lint's actionlint reads .github/actionlint.yaml: a self-hosted label a workflow runs on and the config does
    not declare fails there as unknown."""
    labels = yaml.safe_load(CONFIG.read_text())["self-hosted-runner"]["labels"]
    used = {
        label
        for w in WORKFLOWS
        for job in yaml.safe_load(w.read_text())["jobs"].values()
        if isinstance(job["runs-on"], list) and "self-hosted" in job["runs-on"]
        for label in job["runs-on"]
        if label not in RUNNER_DEFAULTS
    }
    assert labels == sorted(used) == ["rtx-pro-6000-x8"]


# ---- what the workflows promise -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ci.yml", "gpu-smoke.yml"])
def test_read_only_token_and_a_timeout_on_every_job(name: str) -> None:
    workflow = load(name)
    assert workflow["permissions"] == {"contents": "read"}
    assert "concurrency" in workflow
    for job_name, job in workflow["jobs"].items():
        assert "permissions" not in job, f"{job_name} widens the token"
        assert 0 < job["timeout-minutes"] <= 360, job_name


def test_hosted_test_job_runs_the_readme_command_within_its_timeout() -> None:
    job = load("ci.yml")["jobs"]["test"]
    assert job["runs-on"] == "ubuntu-24.04"
    assert run_steps(job) == ["ci/test"]
    setup, tests = figure("setup_minutes"), figure("test_minutes")
    # Twice the documented run: a hosted runner has 2 cores for a private repository, and no venvs yet.
    assert job["timeout-minutes"] >= 2 * (setup + tests)
    # The README's CPU torch, not PyPI's CUDA build (several GB more per venv than the runner has free).
    assert job["env"]["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_hosted_image_job_builds_as_root_on_freed_disk_within_its_timeout() -> None:
    job = load("ci.yml")["jobs"]["image"]
    assert job["runs-on"] == "ubuntu-24.04"
    steps = run_steps(job)
    build = [i for i, run in enumerate(steps) if "ci/build-image" in run]
    assert len(build) == 1
    assert steps[build[0]] == "sudo --preserve-env=GITHUB_ACTIONS,GLM5_REQUIRE_IMAGE ci/build-image --clean"
    freed = " ".join(steps[: build[0]])
    for big in ("/usr/local/lib/android", "/usr/share/dotnet", "/opt/ghc", "/opt/hostedtoolcache/CodeQL"):
        assert f" {big}" in freed and "sudo rm -rf" in freed, f"{big} is not removed before the build"
    assert "docker image prune --all --force" in freed
    assert job["timeout-minutes"] >= 2 * figure("build_minutes")


def test_a_tag_push_requires_the_image() -> None:
    workflow = load("ci.yml")
    push = triggers(workflow)["push"]
    assert push is None or "tags" in push or "branches" not in push, "tag pushes must run ci.yml"
    assert workflow["jobs"]["image"]["env"]["GLM5_REQUIRE_IMAGE"] == REQUIRE_ON_TAGS


def test_no_hosted_job_runs_the_projects_own_ci() -> None:
    """.ci/run is test + build in one job on a root runner with the disk; the hosted workflow splits them."""
    for job in load("ci.yml")["jobs"].values():
        assert not any(".ci/run" in run for run in run_steps(job))


# ---- ci/build-image's skip --------------------------------------------------------------------------------


def build_image(*prefix: str, script: Path = BUILD_IMAGE, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GLM5_", "GITHUB_"))}
    return subprocess.run(
        [*prefix, str(script)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=base | env,
        check=False,
        timeout=60,
    )


def as_non_root() -> list[str]:
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run ci/build-image as a non-root user"
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.parametrize("require", [None, "0", "1"])
def test_not_root_is_a_usage_error(require: str | None) -> None:
    env = {"GITHUB_ACTIONS": "true"} | ({"GLM5_REQUIRE_IMAGE": require} if require else {})
    kit = reachable_copy(
        "ci/build-image", "ci/on-error.sh"
    )  # the non-root user may not reach the checkout itself
    try:
        done = build_image(*as_non_root(), script=kit / "ci" / "build-image", **env)
    finally:
        shutil.rmtree(kit)
    assert done.returncode == 1
    assert (
        "needs root" in done.stderr and "sudo --preserve-env=GITHUB_ACTIONS,GLM5_REQUIRE_IMAGE" in done.stderr
    )
    assert done.stdout.startswith("::error title=ci/build-image::")


def test_a_bad_require_value_is_named() -> None:
    done = build_image(GLM5_REQUIRE_IMAGE="yes")
    assert done.returncode == 1
    assert "GLM5_REQUIRE_IMAGE is 'yes': set 1" in done.stderr


# The skip on a short disk, on a host that never built: tests/test_ci_steps.py.


# ---- ci/build-image's runs inside the image ------------------------------------------------------------------


def in_image(tmp_path: Path, first_error: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """ci/build-image's in_image with a buildah whose first run fails before anything runs inside, with
    `first_error` on stderr (exit 1, as buildah 1.28 ends a run it could not start), and whose later runs succeed."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "buildah").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'if [ "$(wc -l < {calls})" -eq 1 ]; then echo "{first_error}" >&2; echo "Error: exit status 1" >&2; exit 1; fi\n'
        'echo "ran inside"\n'
    )
    (fake / "buildah").chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", f'source "{BUILD_IMAGE}"; in_image ctr1 cat /opt/glm5/BUILD-ID'],
        capture_output=True,
        text=True,
        env=os.environ | {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"},
        check=False,
        timeout=60,
    )
    return done, calls.read_text().splitlines()


def test_a_run_the_runtime_could_not_seal_is_made_once_more(tmp_path: Path) -> None:
    """Seen in a CI run: the check's first buildah run died with the runtime's memfd error, the image untouched."""
    done, calls = in_image(tmp_path, "Close_Fd sealing memfd copy: Device or resource busy")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran inside\n"
    assert (
        calls
        == [
            "--storage-driver vfs --root /var/lib/containers/storage run --isolation chroot --user 1000 ctr1 -- cat /opt/glm5/BUILD-ID"
        ]
        * 2
    )
    assert "could not seal its memfd copy (the runtime, not the image)" in done.stderr


def test_any_other_failure_inside_the_image_is_not_run_again(tmp_path: Path) -> None:
    done, calls = in_image(tmp_path, "cat: /opt/glm5/BUILD-ID: No such file or directory")
    assert done.returncode == 1
    assert len(calls) == 1
    assert "No such file or directory" in done.stderr and "once more" not in done.stderr
