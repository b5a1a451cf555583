"""Install a release by version, editing nothing of the kit's: a Kubernetes user's own overlay (docs/release.md's,
with the kit's k8s/ as its base) renders every kit container at the release's digest, in the user's namespace with
the user's storage class; built by the real kustomize (kubectl kustomize) from a folder outside the checkout."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from conftest import ROOT
from helpers import k8s

DOC = ROOT / "docs" / "release.md"
DIGEST = "sha256:" + "7" * 64


def documented_overlay(name: str) -> str:
    """The YAML block that follows `<!-- overlay: NAME -->` in docs/release.md."""
    match = re.search(rf"<!-- overlay: {name} -->\n```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/release.md has no overlay block {name}"
    return match.group(1)


def user_overlay(tmp_path: Path, name: str) -> Path:
    """The documented overlay in a folder outside the checkout, its remote base replaced by a relative path to the
    checkout's k8s/ (the test has no network), its digest the test's."""
    folder = tmp_path / "my-glm5" / name
    folder.mkdir(parents=True)
    kit = os.path.relpath(ROOT / "k8s", folder)
    text = documented_overlay(name)
    text = re.sub(r"https://github\.com/\S+?//k8s/(\S+)\?ref=v[\d.]+", rf"{kit}/\1", text)
    text = re.sub(r"sha256:[0-9a-f]{64}", DIGEST, text)
    (folder / "kustomization.yaml").write_text(text)
    return folder


def test_the_users_overlay_runs_the_release_by_digest(tmp_path: Path) -> None:
    objects = [d for d in yaml.safe_load_all(k8s.kustomized(user_overlay(tmp_path, "server"))) if d]
    containers = [
        c
        for o in objects
        if o["kind"] in ("StatefulSet", "Job", "Deployment")
        for c in o["spec"]["template"]["spec"].get("initContainers", [])
        + o["spec"]["template"]["spec"]["containers"]
    ]
    assert len(containers) >= 3
    assert {c["image"] for c in containers} == {f"ghcr.io/OWNER/glm5-serve@{DIGEST}"}
    assert {o["metadata"]["namespace"] for o in objects} == {"ml-serving"}
    (server,) = [o for o in objects if o["kind"] == "StatefulSet"]
    assert server["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast-nvme"


def test_the_users_data_overlay_sets_namespace_and_storage_class(tmp_path: Path) -> None:
    objects = [d for d in yaml.safe_load_all(k8s.kustomized(user_overlay(tmp_path, "data"))) if d]
    (claim,) = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert (
        claim["metadata"]["namespace"] == "ml-serving" and claim["spec"]["storageClassName"] == "shared-nfs"
    )
    (namespace,) = [o for o in objects if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == "ml-serving"


# ---- the release workflow and its checks -----------------------------------------------------------------------

RELEASE = ROOT / ".github" / "workflows" / "release.yml"


def test_every_release_action_is_pinned_by_commit_with_its_version() -> None:
    uses = re.findall(r"uses: (\S+)@(\S+)(.*)", RELEASE.read_text())
    assert len(uses) >= 3
    for action, ref, comment in uses:
        assert re.fullmatch(r"[0-9a-f]{40}", ref), f"{action}@{ref}: pin the commit"
        assert re.match(r"\s+# v\d+\.\d+\.\d+", comment), f"{action}: say the version in a comment"


def run_release(root: Path, *args: str) -> tuple[int, str]:
    import contextlib
    import io

    from ci import release

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = release.main([*args, "--root", str(root)])
    return code, err.getvalue()


def test_the_tag_must_be_the_version_with_its_changelog() -> None:
    from ci import release

    version = release.version(release.load(ROOT)[0])
    assert run_release(ROOT, "check", f"v{version}") == (0, "")
    code, err = run_release(ROOT, "check", "v9.9.9")
    assert code == 1 and "is not v" in err and "no section `## [9.9.9]`" in err


def test_the_changelogs_versions_line_follows_glm5_toml(tmp_path: Path) -> None:
    from ci import release

    root = tmp_path / "kit"
    (root / "entrypoint").mkdir(parents=True)
    source = (ROOT / "entrypoint" / "glm5.toml").read_text()
    (root / "entrypoint" / "glm5.toml").write_text(source.replace('sglang = "', 'sglang = "9.', 1))
    (root / "CHANGELOG.md").write_text((ROOT / "CHANGELOG.md").read_text())
    version = release.version(release.load(ROOT)[0])
    code, err = run_release(root, "check", f"v{version}")
    assert code == 1 and "its Versions line is not `Versions: SGLang 9." in err
