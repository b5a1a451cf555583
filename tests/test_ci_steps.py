"""The shell steps of .ci/run on a machine that never ran them (issue 49): no step fails without naming the step,
line and command (ci/on-error.sh), and ci/build-image's steps before the build (prerequisites, the disk log, the
too-little-disk skip, GLM5_REQUIRE_IMAGE's failure) on a host with no container storage and no build folder yet.

These tests install nothing and create nothing outside their own temporary root: ci/build-image runs with a PATH
of stand-ins (id says root, apt-get "installs" buildah and debootstrap stand-ins, df runs the real df on the same
folder and reports a set figure) and the real coreutils, its storage and work folders under tmp_path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

BUILD_IMAGE = ROOT / "ci" / "build-image"
ON_ERROR = "ci/on-error.sh"
# What ci/build-image runs before the build, from the host (everything else is a stand-in below).
REAL_TOOLS = (
    "bash", "cat", "cut", "df", "dirname", "du", "grep", "mkdir", "mktemp", "realpath", "rm", "sed",
    "sha256sum", "tail", "tee", "tr", "git",
)  # fmt: skip  # git: the build's timestamps are the commit's (a clone has it)


def steps() -> list[Path]:
    """Every bash executable under ci/ and .ci/run: the steps .ci/run runs and what they call."""
    found = [ROOT / ".ci" / "run"]
    for path in sorted((ROOT / "ci").iterdir()):
        if path.is_file() and path.read_text(errors="replace").startswith("#!/usr/bin/env bash"):
            found.append(path)
    return found


@pytest.mark.parametrize("step", steps(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_step_sources_the_error_report_first(step: Path) -> None:
    """Right after its `set -euo pipefail`, before any command that can fail."""
    lines = step.read_text().splitlines()
    start = lines.index("set -euo pipefail")
    sourced = [line for line in lines[start + 1 : start + 4] if line.startswith("source ")]
    assert sourced and sourced[0].endswith(('/on-error.sh"', " ci/on-error.sh")), (
        f"{step.relative_to(ROOT)} does not source {ON_ERROR} after set -euo pipefail"
    )


def test_the_steps_of_ci_run_are_all_covered() -> None:
    """Each command .ci/run runs is one of the steps above (a new one must source the report too)."""
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line.split()[0] for line in run if line.startswith("ci/")]
    assert commands == ["ci/test", "ci/build-image"]
    assert all(ROOT / c in steps() for c in commands)


def fresh_host(tmp_path: Path, free_gb: int, **standins: str) -> tuple[dict[str, str], Path]:
    """A host that never built: ci/build-image's environment (PATH of stand-ins and real coreutils, storage and work
    folders that do not exist) and the file each stand-in records its arguments in."""
    real, fake = tmp_path / "real", tmp_path / "bin"
    real.mkdir()
    fake.mkdir()
    calls = tmp_path / "calls"
    for tool in REAL_TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not on this host"
        (real / tool).symlink_to(found)
    df, chmod = shutil.which("df"), shutil.which("chmod")
    scripts = {
        "id": "echo 0",
        # the real df on the same folder (a missing folder fails as it fails), then the set figure, in the shape
        # GNU coreutils 9.1 prints for `df --output=avail -BG PATH`
        "df": f'{df} "$@" >/dev/null || exit $?; printf " Avail\\n   {free_gb}G\\n"',
        "apt-get": (
            f'echo "apt-get $*" >> {calls}\n'
            'case "$*" in *install*)\n'
            f'  for t in buildah debootstrap; do printf "#!/bin/sh\\necho \\"$t \\$*\\" >> {calls}\\n'
            f'echo $t stand-in: stop here >&2\\nexit 99\\n" > {fake}/$t; {chmod} +x {fake}/$t; done ;;\n'
            "esac"
        ),
        # ci/publish's tools are found, so its set-up (which installs) is not called
        "skopeo": "exit 0",
        "gpg": "exit 0",
        "docker-registry": "exit 0",
    } | standins
    for name, body in scripts.items():
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    env = {
        "PATH": f"{fake}{os.pathsep}{real}",
        "HOME": str(tmp_path / "home"),
        "GLM5_BUILD_STORAGE": str(tmp_path / "never-built" / "containers" / "storage"),
        "GLM5_BUILD_WORK": str(tmp_path / "never-built" / "glm5-build"),
    }
    return env, calls


def built(calls: Path) -> list[str]:
    """The calls of buildah's and debootstrap's stand-ins (the build itself)."""
    return [line for line in calls.read_text().splitlines() if line.startswith(("buildah ", "debootstrap "))]


def build_image(env: dict[str, str], **more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUILD_IMAGE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env | more,
        check=False,
        timeout=60,
    )


def line_of(text: str, script: Path = BUILD_IMAGE) -> int:
    """The line number of `text` in `script` (once there)."""
    (number,) = [i for i, line in enumerate(script.read_text().splitlines(), 1) if text in line]
    return number


def test_a_host_that_never_built_logs_its_disk_and_goes_on_to_the_build(tmp_path: Path) -> None:
    """Issue 49: the disk log's `du` of a storage folder that does not exist ended the build silently. Here the
    steps before the build pass, and the first step of the build (debootstrap's stand-in) is where it stops."""
    env, calls = fresh_host(tmp_path, free_gb=60)
    storage = Path(env["GLM5_BUILD_STORAGE"])
    done = build_image(env)
    assert done.returncode == 99, done.stderr
    assert "ci/build-image: installing buildah and debootstrap (apt-get)" in done.stderr
    assert (
        f"ci/build-image: disk before the build: 60 GB free under {storage.parent}, 0 GB in its storage\n"
        in (done.stderr)
    )
    recorded = calls.read_text().splitlines()
    assert recorded[:2] == ["apt-get update -qq", "apt-get install -y -qq buildah debootstrap"]
    assert recorded[2].startswith(f"buildah --storage-driver vfs --root {storage} inspect --type image ")
    assert recorded[3].startswith("debootstrap --variant=minbase")
    # the stop names the step, the line, the function and the command
    line = line_of("debootstrap --variant=minbase")
    assert re.search(
        rf"ci/build-image: FAILED at ci/build-image:{line} in make_base\(\): `debootstrap --variant=minbase .*` "
        r"exited 99\n",
        done.stderr,
    ), done.stderr
    assert not storage.exists(), "the steps before the build made the storage folder"


def test_a_short_disk_on_a_host_that_never_built_is_a_skip(tmp_path: Path) -> None:
    env, calls = fresh_host(tmp_path, free_gb=14)
    storage = Path(env["GLM5_BUILD_STORAGE"])
    done = build_image(env)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
    # publishing beside the built image (13 + 16 GB, measured) fits in the build's own 45
    assert f"SKIPPED: 14 GB free under {storage.parent}, the build needs 45 GB\n" in done.stderr
    assert "FAILED" not in done.stderr
    done = build_image(env, GITHUB_ACTIONS="true", GLM5_REQUIRE_IMAGE="0", GLM5_PUBLISH="none")
    assert done.returncode == 0
    assert done.stdout == (
        "::warning title=ci/build-image::SKIPPED, no image built: "
        f"14 GB free under {storage.parent}, the build needs 45 GB\n"
    )
    assert not built(calls)
    assert not (tmp_path / "never-built").exists(), "a skip made a folder"


def test_a_short_disk_fails_where_an_image_is_required(tmp_path: Path) -> None:
    env, calls = fresh_host(tmp_path, free_gb=14)
    done = build_image(env, GITHUB_ACTIONS="true", GLM5_REQUIRE_IMAGE="1")
    assert done.returncode == 1
    assert "FAIL: 14 GB free under " in done.stderr
    assert "GLM5_REQUIRE_IMAGE=1: an image is required" in done.stderr
    assert done.stdout.startswith("::error title=ci/build-image::no image built, and GLM5_REQUIRE_IMAGE=1")
    assert not built(calls)
    assert not (tmp_path / "never-built").exists()


def test_a_failure_inside_a_function_names_the_step_line_and_command(tmp_path: Path) -> None:
    """The disk log's `du` failing inside `disk`, in a command substitution, as issue 49's did: the report names
    ci/build-image, the line, the function and the assignment, with du's status."""
    env, _ = fresh_host(tmp_path, free_gb=60, du="echo 'du: cannot read' >&2; exit 3")
    Path(env["GLM5_BUILD_STORAGE"]).mkdir(parents=True)  # a storage folder du cannot read
    done = build_image(env)
    assert done.returncode == 3
    line = line_of('used=$(du -s -BG "$storage"')
    assert (
        f'ci/build-image: FAILED at ci/build-image:{line} in disk(): `used=$(du -s -BG "$storage" | cut -f1 | tr '
        "-dc 0-9)` exited 3\n"
    ) in done.stderr, done.stderr
    assert "disk before the build" not in done.stderr


def test_the_report_fires_at_the_top_level_and_in_a_subshell(tmp_path: Path) -> None:
    """A script of ci/ that sources the report: a failure at its top level, and one inside a command substitution
    (reported there and where its status fails the assignment)."""
    script = tmp_path / "ci" / "step"
    script.parent.mkdir()
    shutil.copy(ROOT / ON_ERROR, script.parent / "on-error.sh")
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\nsource \"${BASH_SOURCE[0]%/*}/on-error.sh\"\n"
        'if [[ $1 == top ]]; then ls /no-such-folder 2>/dev/null; fi\n'
        "got=$(echo one; false; echo two)\n"
        'echo "not reached: $got"\n'
    )  # fmt: skip
    script.chmod(0o755)
    top = subprocess.run([str(script), "top"], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert top.returncode == 2
    assert top.stderr == "ci/step: FAILED at ci/step:4: `ls /no-such-folder 2> /dev/null` exited 2\n"
    sub = subprocess.run([str(script), "sub"], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert sub.returncode == 1 and "not reached" not in sub.stdout
    assert sub.stderr.splitlines() == [
        "ci/step: FAILED at ci/step:5 (in a subshell): `false` exited 1",
        "ci/step: FAILED at ci/step:5: `got=$(echo one; false; echo two)` exited 1",
    ]


def test_a_tested_failure_is_not_reported(tmp_path: Path) -> None:
    """if, ||, and a substitution under if: bash runs no ERR trap there, so ci/lint's steps stay quiet."""
    done = subprocess.run(
        [
            "bash",
            "-c",
            f'source "{ROOT / ON_ERROR}"; f() {{ false; }}; if out=$(f); then :; fi; f || true; echo ok',
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")
