"""ci/publish against a real registry on 127.0.0.1 (Debian's docker-registry) with a tiny OCI image: push, the
digest the registry reports, the pull back by digest through a policy.json that requires the run's key, the SBOM
with glm5.toml's pins and the patched FlashInfer, and the two refusals (unsigned, tampered digest). The SBOM's check
itself, on documents that break each rule, needs no registry."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from ci import publish, sbom
from conftest import ROOT
from helpers.tiny_image import bom_of, image_files, oci_layout
from patches.apply import read_series

IMAGE = tomllib.loads((ROOT / "entrypoint" / "glm5.toml").read_text())["image"]
PINS = {"sglang": IMAGE["sglang"], "torch": IMAGE["torch"], "flashinfer-python": IMAGE["flashinfer"]}
# The image's patch record is FlashInfer's (the Dockerfile copies flashinfer/GLM5_SERVE_PATCHES.json): the series'
# flashinfer patches, as ci/publish compares them.
SERIES = [p.name for p in read_series(ROOT / "patches" / "series") if p.package == "flashinfer"]


def tiny(tmp_path: Path, **pins: str) -> str:
    return oci_layout(tmp_path / "layout", "t", image_files(PINS | pins, SERIES))


def run_publish(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "ci" / "publish"), source, "--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


needs_tools = pytest.mark.skipif(
    bool(publish.missing_tools(local=True)),
    reason=f"ci/publish needs {', '.join(publish.missing_tools(local=True))}: run ci/setup-test-env (apt-get "
    "install skopeo docker-registry gpg)",
)


@pytest.mark.boots
@needs_tools
def test_publish_pushes_signs_pulls_back_and_refuses(tmp_path: Path) -> None:
    done = run_publish(tmp_path, tiny(tmp_path))
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "work" / "published.json").read_text())
    name, version = publish.kit_version()[:2]
    assert record["reference"].split("@")[0].endswith(f"/{name}") and record["version"] == version
    assert record["digest"].startswith("sha256:") and len(record["digest"]) == 71
    assert record["reference"].endswith(record["digest"])
    for name in ("push", "digest", "pull and compare", "sbom", "refusals"):
        assert f"ok   {name} (" in done.stderr
    bom = json.loads(Path(record["sbom"]).read_text())
    assert sbom.problems(bom, IMAGE, SERIES) == []
    assert bom["metadata"]["component"]["hashes"][0]["content"] == record["digest"].split(":")[1]
    assert not (tmp_path / "work" / "registry").exists(), "the throwaway registry's storage is removed"


@pytest.mark.boots
@needs_tools
def test_an_image_with_another_torch_is_not_published(tmp_path: Path) -> None:
    done = run_publish(tmp_path, tiny(tmp_path, torch="2.9.0"))
    assert done.returncode == 1
    assert f"torch 2.9.0, glm5.toml [image].torch pins {IMAGE['torch']}" in done.stderr


@pytest.mark.boots
@needs_tools
def test_the_policy_refuses_what_the_key_did_not_sign(tmp_path: Path) -> None:
    """The refusals step's checks can fail: a policy that accepts anything lets the unsigned image through."""
    source = tiny(tmp_path)
    work = tmp_path / "work"
    with publish.local_registry(work) as host:
        run = publish.Run(work=work, registry=host, name="glm5-serve", version="t", local=True, tls=False)
        publish.throwaway_key(run)
        try:
            publish.configure(run)
            digest = publish.push(run, source)
            shutil.copy(run.config_dir() / "policy-open.json", run.config_dir() / "policy-verify.json")
            with pytest.raises(publish.PublishError, match=r"let .* through"):
                publish.refusals(run, digest, "application/vnd.oci.image.manifest.v1+json")
        finally:
            publish.forget_key(run)


# ---- the SBOM's check, without a registry ----------------------------------------------------------------------


def test_the_sbom_lists_every_package_with_its_purl(tmp_path: Path) -> None:
    bom = bom_of(tmp_path, image_files(PINS, SERIES))
    purls = {c["purl"] for c in bom["components"]}
    assert f"pkg:pypi/torch@{IMAGE['torch']}" in purls
    assert "pkg:deb/ubuntu/bash@5.2.21-2ubuntu4?arch=amd64&distro=ubuntu-24.04&upstream=bash" in purls
    assert sbom.problems(bom, IMAGE, SERIES) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"sglang": "0.5.22"}, "sglang 0.5.22, glm5.toml [image].sglang pins"),
        ({"flashinfer-python": "0.7.1"}, "flashinfer-python 0.7.1, glm5.toml [image].flashinfer pins"),
    ],
)
def test_the_sbom_check_names_a_pin_the_image_misses(
    tmp_path: Path, change: dict[str, str], named: str
) -> None:
    bom = bom_of(tmp_path, image_files(PINS | change, SERIES))
    assert any(named in p for p in sbom.problems(bom, IMAGE, SERIES))


def test_the_sbom_check_needs_the_patched_flashinfer(tmp_path: Path) -> None:
    bom = bom_of(tmp_path, image_files(PINS, []))
    assert any("carries patches [], patches/series lists" in p for p in sbom.problems(bom, IMAGE, SERIES))


def test_a_later_layers_whiteout_removes_a_package(tmp_path: Path) -> None:
    files = image_files(PINS, SERIES)
    gone = next(p for p in files if "/torch-" in p).rsplit("/", 2)[0]
    whiteout = f"{gone}/.wh.{next(p for p in files if '/torch-' in p).split('/')[-2]}"
    layout = tmp_path / "copy"
    layout.mkdir()
    from helpers.tiny_image import layer_tar

    for i, tar in enumerate((layer_tar(files), layer_tar({whiteout: ""}))):
        (layout / f"{i}").write_bytes(tar)
    (layout / "manifest.json").write_text(
        json.dumps({"layers": [{"digest": "sha256:0"}, {"digest": "sha256:1"}]})
    )
    bom = sbom.build(layout, "r/glm5-serve", "sha256:" + "b" * 64, "0.1.0")
    assert "torch" not in {c["name"] for c in bom["components"]}


# ---- a version is never replaced (issue 54) ----------------------------------------------------------------------


@pytest.mark.boots
@needs_tools
def test_a_version_tag_naming_another_image_is_refused_and_kept(tmp_path: Path) -> None:
    """A re-run whose build differs (or a second tag push) must not move NAME:VERSION: refused, naming the tag's
    digest and both ways on, the registry still serving the first image."""
    first = oci_layout(tmp_path / "first", "t", image_files(PINS, SERIES), label="first")
    second = oci_layout(tmp_path / "second", "t", image_files(PINS, SERIES), label="second")
    work = tmp_path / "work"
    with publish.local_registry(work) as host:
        run = publish.Run(
            work=work, registry=host, name="glm5-serve", version="0.1.0", local=False, tls=False
        )
        publish.configure(run)
        pushed = publish.push(run, first)
        with pytest.raises(publish.PublishError) as refused:
            publish.publish_steps(run, second, IMAGE)
        assert f"{run.repository}:0.1.0 already names {pushed}" in str(refused.value)
        assert "a version is never replaced" in str(refused.value)
        assert f"ci/publish --resume {pushed}" in str(refused.value) and "re-run the failed jobs" in str(
            refused.value
        )
        assert publish.manifest_digest(run, f"docker://{run.repository}:0.1.0") == pushed


@pytest.mark.boots
@needs_tools
def test_a_rerun_of_the_same_image_resumes_from_the_pushed_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same build published again (the release's publish job re-run with the build's artifact) pushes nothing
    and goes on from the digest; `--resume DIGEST` does the same for another source once the digest is named."""
    source = tiny(tmp_path)
    other = oci_layout(tmp_path / "other", "t", image_files(PINS, SERIES), label="other")
    work = tmp_path / "work"
    with publish.local_registry(work) as host:
        run = publish.Run(
            work=work, registry=host, name="glm5-serve", version="0.1.0", local=False, tls=False
        )
        publish.configure(run)
        pushed = publish.push(run, source)
        again = publish.publish_steps(run, source, IMAGE)
        assert again["digest"] == pushed and again["resumed"] is True
        assert "push" not in again["seconds"], "nothing is pushed on a resume"
        assert f"already is {pushed} (this image's): resuming from it" in capsys.readouterr().err
        named = publish.publish_steps(run, other, IMAGE, resume=pushed)
        assert named["digest"] == pushed and named["resumed"] is True
        assert publish.manifest_digest(run, f"docker://{run.repository}:0.1.0") == pushed


@pytest.mark.boots
@needs_tools
def test_resume_needs_the_tag_to_exist(tmp_path: Path) -> None:
    work = tmp_path / "work"
    with publish.local_registry(work) as host:
        run = publish.Run(
            work=work, registry=host, name="glm5-serve", version="0.1.0", local=False, tls=False
        )
        publish.configure(run)
        with pytest.raises(publish.PublishError, match="does not exist, nothing to resume from"):
            publish.claim(run, tiny(tmp_path), "sha256:" + "c" * 64)
