"""The GitHub workflows (actionlint and their schema run in ci/lint): the rules that keep the hosted run honest (a timeout
longer than the documented run, the image built as root on freed disk, no release without an image), and
ci/build-image's skip, visible in GitHub Actions and a failure where GLM5_REQUIRE_IMAGE=1."""

from __future__ import annotations

import os
import re
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


# ---- the release, split by privilege (issue 54) ----------------------------------------------------------------

# Steps that run code the kit does not own, from PyPI, npm or the build: never in a job that holds a write scope.
BUILD_STEPS = ("ci/build-image", "ci/setup-test-env", "ci/test", "pip install", "npm ")


def release() -> dict[str, Any]:
    return load("release.yml")


def scopes(workflow: dict[str, Any], job: dict[str, Any]) -> dict[str, str]:
    """The token's scopes a job holds: its own `permissions:`, else the workflow's."""
    granted: dict[str, str] = job.get("permissions", workflow.get("permissions", {}))
    return granted


def writes(workflow: dict[str, Any], job: dict[str, Any]) -> set[str]:
    return {scope for scope, level in scopes(workflow, job).items() if level == "write"}


def needs_of(jobs: dict[str, Any], name: str) -> set[str]:
    """Every job NAME waits for, directly or through another."""
    direct = jobs[name].get("needs", [])
    out = set([direct] if isinstance(direct, str) else direct)
    for other in list(out):
        out |= needs_of(jobs, other)
    return out


def uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [step for step in job["steps"] if str(step.get("uses", "")).startswith(f"{action}@")]


def test_release_runs_on_version_tags_with_a_read_only_default() -> None:
    workflow = release()
    assert triggers(workflow)["push"] == {"tags": ["v*"]}
    assert workflow["permissions"] == {"contents": "read"}


def test_release_checkouts_keep_no_token_in_git_config() -> None:
    """actions/checkout writes the job's token into .git/config unless told not to: then any later step reads it."""
    found = [step for job in release()["jobs"].values() for step in uses(job, "actions/checkout")]
    assert found
    for step in found:
        assert step.get("with", {}).get("persist-credentials") is False, step


def test_release_build_and_suite_jobs_hold_no_write_scope_and_no_secret() -> None:
    workflow = release()
    building = {
        name: job
        for name, job in workflow["jobs"].items()
        if any(marker in run for run in run_steps(job) for marker in BUILD_STEPS)
    }
    assert any("ci/build-image" in run for job in building.values() for run in run_steps(job))
    assert any(run == "ci/test" for job in building.values() for run in run_steps(job))
    for name, job in building.items():
        assert not writes(workflow, job), (
            f"{name} runs third-party code with write scopes {writes(workflow, job)}"
        )
        assert "id-token" not in scopes(workflow, job), name
        assert "secrets." not in yaml.safe_dump(job), f"{name} is handed a secret"


def test_release_write_jobs_run_no_build_wait_for_the_suite_and_sit_behind_an_environment() -> None:
    workflow = release()
    jobs = workflow["jobs"]
    suite = {name for name, job in jobs.items() if "ci/test" in run_steps(job)}
    build = {name for name, job in jobs.items() if any("ci/build-image" in run for run in run_steps(job))}
    privileged = {
        name for name, job in jobs.items() if writes(workflow, job) or "id-token" in scopes(workflow, job)
    }
    # The three write scopes a release needs, each held somewhere, none in the build.
    assert set().union(*(writes(workflow, jobs[n]) for n in privileged)) == {
        "contents",
        "packages",
        "id-token",
    }
    for name in privileged:
        job = jobs[name]
        assert job.get("environment") == "release", (
            f"{name} holds write scopes outside the protected environment"
        )
        assert suite <= needs_of(jobs, name) and build <= needs_of(jobs, name), (
            f"{name} does not wait for {suite | build}"
        )
        assert not [run for run in run_steps(job) for marker in BUILD_STEPS if marker in run], name
        assert not uses(job, "actions/setup-node"), name


def test_release_signs_only_the_digest_the_publish_job_pushed() -> None:
    """The signer checks nothing out and builds nothing: what it signs is the publish job's output, NAME@sha256."""
    workflow = release()
    jobs = workflow["jobs"]
    (signer,) = [name for name, job in jobs.items() if scopes(workflow, job).get("id-token") == "write"]
    job = jobs[signer]
    assert not uses(job, "actions/checkout"), "the signer runs no checked-out code"
    assert writes(workflow, job) == {"id-token", "packages"}
    signing = [run for run in run_steps(job) if "cosign sign" in run or "cosign attest" in run]
    assert signing
    refs = {step["env"]["REF"] for step in job["steps"] if "run" in step and "cosign" in step["run"]}
    assert len(refs) == 1 and re.fullmatch(r"\$\{\{ needs\.\w+\.outputs\.\w+ \}\}", refs.pop()), refs


def test_release_verifies_before_it_publishes_the_notes() -> None:
    """The order of tests/test_release_install.py's one-job check, across the jobs: the tag checked before the build,
    the signature and attestation verified with the workflow's identity before the notes are published."""
    jobs = release()["jobs"]

    def job_running(needle: str) -> str:
        (name,) = [name for name, job in jobs.items() if any(needle in run for run in run_steps(job))]
        return name

    check, build, sign, notes = (
        job_running(n) for n in ("ci/release check", "ci/build-image", "cosign sign", "gh release create")
    )
    assert check == build
    runs = run_steps(jobs[build])
    assert [i for i, r in enumerate(runs) if "ci/release check" in r] < [
        i for i, r in enumerate(runs) if "ci/build-image" in r
    ]
    verify = next(run for run in run_steps(jobs[sign]) if "cosign verify " in run)
    assert "verify-attestation" in verify and "--certificate-identity" in verify
    assert sign in needs_of(jobs, notes) and build in needs_of(jobs, sign)


# ---- the release's base and timestamps (issue 54: a version is immutable) --------------------------------------

SNAPSHOT = re.compile(r"https://snapshot\.debian\.org/archive/debian/(\d{8}T\d{6}Z)/")


def test_the_release_base_comes_from_one_dated_debian_snapshot() -> None:
    """The build job's GLM5_DEBIAN_MIRROR is a dated snapshot.debian.org URL, its date written once in the workflow,
    and sudo hands it to ci/build-image (sudo drops what --preserve-env does not name)."""
    jobs = release()["jobs"]
    (build,) = [job for job in jobs.values() if any("ci/build-image" in run for run in run_steps(job))]
    found = SNAPSHOT.fullmatch(build["env"]["GLM5_DEBIAN_MIRROR"])
    assert found, build["env"]["GLM5_DEBIAN_MIRROR"]
    assert (ROOT / ".github" / "workflows" / "release.yml").read_text().count(found.group(1)) == 1
    (run,) = [run for run in run_steps(build) if "ci/build-image" in run]
    preserved = re.search(r"sudo --preserve-env=(\S+) ci/build-image", run)
    assert preserved and "GLM5_DEBIAN_MIRROR" in preserved.group(1).split(","), run


# What two debootstraps and apt steps of one tree wrote differently (docs/release.md, "Still differs").
DIFFERING = ("var/log/bootstrap.log", "var/log/dpkg.log", "var/log/alternatives.log", "var/log/apt/history.log",
             "var/log/apt/term.log", "var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin",
             "var/cache/ldconfig/aux-cache")  # fmt: skip


def fake_build_tools(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A buildah that knows no image (so the base is made) and records its calls, and a debootstrap that records
    its own and makes an empty root: ci/build-image's environment for its make_base and build, with the record."""
    fake, calls = tmp_path / "bin", tmp_path / "calls"
    fake.mkdir()
    (fake / "buildah").write_text(
        f'#!/bin/sh\necho "buildah $*" >> {calls}\n'
        'case " $* " in *" inspect "*|*" images "*) exit 1 ;; *" from "*) echo ctr1 ;; esac\n'
    )
    # the root it makes holds what two debootstraps write differently (docs/release.md) beside what must stay
    made = " ".join(f'"$4/{p}"' for p in (*DIFFERING, "var/log/kept.log"))
    (fake / "debootstrap").write_text(
        f'#!/bin/sh\necho "debootstrap $*" >> {calls}\nmkdir -p "$4/var/log/apt" "$4/var/cache/apt" '
        f'"$4/var/cache/ldconfig"\ntouch {made}\n'
    )
    for tool in ("buildah", "debootstrap"):
        (fake / tool).chmod(0o755)
    env = os.environ | {
        "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
        "GLM5_BUILD_WORK": str(tmp_path / "work"),
    }
    return env, calls


def sourced(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """SCRIPT after ci/build-image's functions, in the checkout, with ci/cuda-toolkit made a no-op (no download)."""
    return subprocess.run(
        ["bash", "-c", f'source "{BUILD_IMAGE}"; ci/cuda-toolkit() {{ mkdir -p "$1"; }}; {script}'],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
        timeout=60,
    )


def test_build_image_bootstraps_from_the_mirror_setting_and_names_the_base_by_it(tmp_path: Path) -> None:
    env, calls = fake_build_tools(tmp_path)
    snapshot = "https://snapshot.debian.org/archive/debian/20261201T000000Z/"
    done = sourced("base=$(base_name); epoch=1764547200; make_base", env | {"GLM5_DEBIAN_MIRROR": snapshot})
    assert done.returncode == 0, done.stderr
    (debootstrap,) = [c for c in calls.read_text().splitlines() if c.startswith("debootstrap ")]
    assert debootstrap.split()[-3:] == ["bookworm", str(tmp_path / "work" / "rootfs"), snapshot]
    root = tmp_path / "work" / "rootfs"
    assert not [p for p in DIFFERING if (root / p).exists()] and (root / "var/log/kept.log").exists()
    apt_step = re.search(r"^RUN apt-get update.*?(?=^\S)", (ROOT / "Dockerfile").read_text(), re.M | re.S)
    assert apt_step, "no apt step in the Dockerfile"
    for path in ("/var/cache/apt/*.bin", "/var/cache/ldconfig/aux-cache", "/var/log/apt", "/var/log/dpkg.log",
                 "/var/log/alternatives.log"):  # fmt: skip
        assert path in apt_step.group(0), path
    assert (
        "buildah --storage-driver vfs --root /var/lib/containers/storage commit --quiet --timestamp 1764547200 ctr1 "
        in (calls.read_text())
    )
    names = {
        mirror: sourced("base_name", env | {"GLM5_DEBIAN_MIRROR": mirror}).stdout
        for mirror in (snapshot, "https://snapshot.debian.org/archive/debian/20261202T000000Z/")
    }
    default = sourced("base_name", {k: v for k, v in env.items() if k != "GLM5_DEBIAN_MIRROR"}).stdout
    assert len({*names.values(), default}) == 3, "another mirror makes another base"
    assert all(re.fullmatch(r"localhost/glm5-base:bookworm-cuda-[0-9a-f]{12}\n", n) for n in names.values())


def test_build_image_sets_every_timestamp_to_the_commits_time(tmp_path: Path) -> None:
    """buildah bud --timestamp (every layer file's mtime, the created dates: buildah-build(1)) and the build argument
    SOURCE_DATE_EPOCH the Dockerfile declares, both the checked-out commit's time unless SOURCE_DATE_EPOCH is set."""
    env, calls = fake_build_tools(tmp_path)
    env = {k: v for k, v in env.items() if k != "SOURCE_DATE_EPOCH"}
    commit_time = subprocess.run(
        ["git", "log", "-1", "--format=%ct"], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.strip()
    for given, expected in ((None, commit_time), ("1764547200", "1764547200")):
        calls.unlink(missing_ok=True)
        done = sourced(
            "base=b; epoch=$(source_date_epoch); build",
            env | ({"SOURCE_DATE_EPOCH": given} if given else {}),
        )
        assert done.returncode == 0, done.stderr
        (bud,) = [c for c in calls.read_text().splitlines() if " bud " in c]
        assert f" --timestamp {expected} " in bud and f" --build-arg SOURCE_DATE_EPOCH={expected} " in bud, (
            bud
        )
    assert re.search(r"^ARG SOURCE_DATE_EPOCH$", (ROOT / "Dockerfile").read_text(), re.M)
    bad = sourced("source_date_epoch", env | {"SOURCE_DATE_EPOCH": "yesterday"})
    assert bad.returncode != 0 and "SOURCE_DATE_EPOCH is 'yesterday'" in bad.stderr


# ---- the admission policy names the release workflow's identity (issue 54) ------------------------------------

POLICY = ROOT / "k8s" / "components" / "verify-signature"
# policy-controller v0.15.1's policy.sigstore.dev/v1beta1 ClusterImagePolicy, the JSON names of its types
# (github.com/sigstore/policy-controller, pkg/apis/policy/v1beta1/clusterimagepolicy_types.go): tests/crd carries no
# schema of it, so the fields the component uses are checked by name here.
CIP_FIELDS = {
    "spec": {"images", "authorities", "policy", "mode", "match"},
    "authority": {
        "name",
        "key",
        "keyless",
        "static",
        "source",
        "ctlog",
        "attestations",
        "rfc3161timestamp",
        "signatureFormat",
    },
    "keyless": {"url", "identities", "ca-cert", "trustRootRef", "insecureIgnoreSCT"},
    "identity": {"issuer", "subject", "issuerRegExp", "subjectRegExp"},
    "attestation": {"name", "predicateType", "policy"},
}
IDENTITY = "https://github.com/OWNER/glm5-serve/.github/workflows/release.yml@refs/tags/v{version}"


def glob_matches(glob: str, image: str) -> bool:
    """policy-controller's glob: `**` any characters, `*` any but `/`, the whole reference (pkg/apis/glob)."""
    pattern = re.escape(glob).replace(r"\*\*", "\0").replace(r"\*", "[^/]*").replace("\0", ".*")
    return re.fullmatch(pattern, image) is not None


def rendered_policy(tmp_path: Path) -> list[dict[str, Any]]:
    """The component added to a user's data overlay (docs/release.md), rendered by the real kustomize."""
    from helpers import k8s

    shutil.copytree(ROOT / "k8s" / "data", tmp_path / "k8s" / "data")
    shutil.copytree(POLICY, tmp_path / "k8s" / "components" / POLICY.name)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../k8s/data]\n"
        f"components: [../k8s/components/{POLICY.name}]\n"
    )
    return k8s.objects(tmp_path / "mine")


def test_the_admission_policy_requires_the_release_workflows_signature_and_sbom(tmp_path: Path) -> None:
    objects = rendered_policy(tmp_path)
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["policy.sigstore.dev/include"] == "true"
    (policy,) = [o for o in objects if o["kind"] == "ClusterImagePolicy"]
    assert policy["apiVersion"] == "policy.sigstore.dev/v1beta1" and "namespace" not in policy["metadata"]
    spec = policy["spec"]
    assert set(spec) <= CIP_FIELDS["spec"] and spec["mode"] == "enforce"
    (authority,) = spec["authorities"]
    assert set(authority) <= CIP_FIELDS["authority"] and set(authority["keyless"]) <= CIP_FIELDS["keyless"]
    (identity,) = authority["keyless"]["identities"]
    assert set(identity) <= CIP_FIELDS["identity"]
    # The issuer and the identity the workflow itself verifies with, and docs/release.md tells users to check.
    verify = next(
        step for step in release()["jobs"]["sign"]["steps"] if "cosign verify " in step.get("run", "")
    )
    assert '--certificate-oidc-issuer "$issuer"' in verify["run"]
    assert identity["issuer"] == "https://token.actions.githubusercontent.com"
    assert f"issuer={identity['issuer']}" in verify["run"]
    assert verify["env"]["IDENTITY"] == "${{ github.server_url }}/${{ github.workflow_ref }}"
    subject = re.compile(identity["subjectRegExp"])
    assert subject.fullmatch(IDENTITY.format(version="0.1.0"))
    assert IDENTITY.format(version="X.Y.Z") in (ROOT / "docs" / "release.md").read_text()
    for other in (
        "https://github.com/OWNER/glm5-serve/.github/workflows/ci.yml@refs/tags/v0.1.0",  # another workflow
        "https://github.com/OWNER/glm5-serve/.github/workflows/release.yml@refs/heads/main",  # not a tag
        "https://github.com/fork/glm5-serve/.github/workflows/release.yml@refs/tags/v0.1.0",  # another repository
    ):
        assert not subject.fullmatch(other), other
    # The attestation the workflow makes (cosign attest --type cyclonedx: this predicate type).
    (attestation,) = authority["attestations"]
    assert set(attestation) <= CIP_FIELDS["attestation"]
    assert attestation["predicateType"] == "https://cyclonedx.org/bom"
    assert any("cosign attest --yes --type cyclonedx" in run for run in run_steps(release()["jobs"]["sign"]))
    # Every release image, by digest (as the docs install it) or by tag; no other image.
    globs = [image["glob"] for image in spec["images"]]
    digest = "sha256:" + "1" * 64
    assert any(glob_matches(g, f"ghcr.io/OWNER/glm5-serve@{digest}") for g in globs)
    assert any(glob_matches(g, "ghcr.io/OWNER/glm5-serve:0.1.0") for g in globs)
    assert not any(glob_matches(g, "ghcr.io/OWNER/glm5-serve-other:0.1.0") for g in globs)
