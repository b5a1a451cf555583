"""Publish the image CI built and prove what a user pulls is that image: push, digest, SBOM, pull back, signature.

    ci/publish SOURCE [--registry local|HOST/PATH] [--work DIR] [--record FILE] [--resume sha256:HEX]

SOURCE is a skopeo reference (ci/build-image passes `containers-storage:[vfs@...]glm5-serve:VERSION`; the tests an
`oci:DIR:TAG` layout). `--registry local` (the default) starts Debian's docker-registry on 127.0.0.1 (a free port,
its storage under --work, removed at the end) and runs every step; `--registry ghcr.io/OWNER` (the release
workflow, after `skopeo login`) pushes there and leaves the signing to cosign (.github/workflows/release.yml).
Each step prints its seconds:
  claim     NAME:VERSION must be free, or name this very image: a version is never replaced. Where the tag
            already names SOURCE's manifest (a re-run after a partial release, the same build), or the digest
            `--resume DIGEST` gives, nothing is pushed and the steps go on from that digest; any other image there
            is refused (exit 1), the message naming the tag's digest and both ways on
  push      skopeo copy to NAME:VERSION (VERSION: glm5.toml [deployment].image's tag), local: signed on the way
  digest    the manifest digest the registry reports (skopeo inspect), equal to the one skopeo wrote
  pull      skopeo copy NAME@DIGEST to a dir: copy, local: through a policy.json that requires the signing key;
            its manifest must hash to DIGEST, each layer to its digest, the layers be those the registry lists
  sbom      CycloneDX from the copy (ci/sbom.py), checked to list glm5.toml [image]'s sglang, torch and
            flashinfer-python, the latter patched as patches/series says (its flashinfer patches)
  refusals  (local) the same image in the other manifest format, unsigned: refused; with the signature of DIGEST
            laid beside it (a tampered digest): refused
  record    --record FILE (default WORK/published.json): version, NAME@DIGEST, layers, the SBOM's file and hash

Signing here is skopeo's GPG "simple signing" with a key made for the run (gpg, no passphrase, a day's expiry) and
signatures in a lookaside folder: Debian's skopeo 1.9.3 refuses `--sign-by-sigstore-private-key` ("Debian-local
change: sigstore disabled") and has no `generate-sigstore-key`. The policy.json and the two refusals are the same
for either kind of key. Needs: skopeo, docker-registry (local), gpg (local); python3 3.11 alone. Exit 0: every
step passed; 1: one failed (the line names it and the fix); 2: usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ci import sbom
from patches.apply import read_series

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "entrypoint" / "glm5.toml"
SERIES = ROOT / "patches" / "series"
NEEDS_LOCAL = ("skopeo", "docker-registry", "gpg")
UNSIGNED = "A signature was required, but no signature exists"
MISMATCH = "does not match"


class PublishError(Exception):
    pass


@dataclass
class Run:
    work: Path
    registry: str  # HOST[:PORT][/PATH]: where NAME goes
    name: str
    version: str
    local: bool
    tls: bool
    seconds: dict[str, float] = field(default_factory=dict)
    gpg_home: Path | None = None
    fingerprint: str = ""

    @property
    def repository(self) -> str:
        return f"{self.registry}/{self.name}"

    def config_dir(self) -> Path:
        return self.work / "containers"

    def skopeo(
        self, *args: str, policy: str = "open", check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """skopeo with this run's policy and registries.d (the lookaside signature folder), never the host's."""
        env = os.environ | ({"GNUPGHOME": str(self.gpg_home)} if self.gpg_home else {})
        cmd = [
            "skopeo",
            "--policy",
            str(self.config_dir() / f"policy-{policy}.json"),
            "--registries.d",
            str(self.config_dir() / "registries.d"),
            *args,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if check and done.returncode != 0:
            raise PublishError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")
        return done

    def tls_flag(self, side: str) -> str:
        """--src-tls-verify, --dest-tls-verify (copy) or --tls-verify (inspect): off for the local plain-HTTP one."""
        flag = "--tls-verify" if side == "tls" else f"--{side}-tls-verify"
        return f"{flag}={'true' if self.tls else 'false'}"


@contextmanager
def step(run: Run, name: str) -> Iterator[None]:
    began = time.monotonic()
    yield
    run.seconds[name] = round(time.monotonic() - began, 2)
    print(f"ci/publish: ok   {name} ({run.seconds[name]:.2f} s)", file=sys.stderr)


def kit_version() -> tuple[str, str, dict[str, str]]:
    """The image's name and version (glm5.toml [deployment].image's NAME and tag) and [image]'s pins."""
    with SOURCE.open("rb") as fh:
        cfg = tomllib.load(fh)
    image = cfg["deployment"]["image"].split("@", 1)[0]
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        raise PublishError(
            f"entrypoint/glm5.toml: [deployment].image = {cfg['deployment']['image']!r} has no tag: the tag is the "
            "kit's version (write NAME:VERSION)"
        )
    return name.rsplit("/", 1)[-1], tag, {k: str(v) for k, v in cfg["image"].items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_registry(work: Path) -> Iterator[str]:
    """Debian's docker-registry on 127.0.0.1, its storage under WORK (removed after): yields HOST:PORT."""
    port = free_port()
    storage = work / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    config = work / "registry.yml"
    config.write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {storage}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
    )
    log = (work / "registry.log").open("w")
    server = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1):
                    break
            except OSError as err:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise PublishError(
                        f"docker-registry did not answer on 127.0.0.1:{port} ({err}): see {work}/registry.log"
                    ) from err
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()
        shutil.rmtree(storage, ignore_errors=True)


def configure(run: Run) -> None:
    """policy-open.json (push, anything), policy-verify.json (the repository needs the run's key), registries.d."""
    conf = run.config_dir()
    (conf / "registries.d").mkdir(parents=True, exist_ok=True)
    sigs = run.work / "signatures"
    (conf / "registries.d" / "glm5.yaml").write_text(
        f"docker:\n  {run.registry.split('/', 1)[0]}:\n    lookaside: file://{sigs}\n    lookaside-staging: file://{sigs}\n"
    )
    (conf / "policy-open.json").write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    required: dict[str, Any] = {"type": "reject"}
    if run.gpg_home:
        required = {
            "type": "signedBy",
            "keyType": "GPGKeys",
            "keyPath": str(run.work / "signing-key.gpg"),
            "signedIdentity": {"type": "matchRepository"},
        }
    policy = {"default": [{"type": "reject"}], "transports": {"docker": {run.repository: [required]}}}
    (conf / "policy-verify.json").write_text(json.dumps(policy, indent=2))


def throwaway_key(run: Run) -> None:
    """A GPG signing key made for this run (no passphrase, expires in a day), its public half for the policy."""
    # A short folder of its own: gpg-agent's socket path must fit a Unix socket's 108 bytes (removed by forget_key).
    run.gpg_home = Path(tempfile.mkdtemp(prefix="glm5-gpg-"))
    run.gpg_home.chmod(0o700)
    env = os.environ | {"GNUPGHOME": str(run.gpg_home)}
    gen = ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run(
        [*gen, "--quick-gen-key", "glm5-serve CI throwaway <ci@glm5-serve.invalid>", "ed25519", "sign", "1d"],
        env=env,
        check=True,
        capture_output=True,
    )
    listed = subprocess.run(
        ["gpg", "--list-keys", "--with-colons"], env=env, check=True, capture_output=True, text=True
    ).stdout
    run.fingerprint = next(line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:"))
    key = subprocess.run(
        ["gpg", "--export", run.fingerprint], env=env, check=True, capture_output=True
    ).stdout
    (run.work / "signing-key.gpg").write_bytes(key)


def forget_key(run: Run) -> None:
    """The run's gpg-agent stopped and its key folder removed: the private key never outlives the run."""
    if run.gpg_home:
        env = os.environ | {"GNUPGHOME": str(run.gpg_home)}
        subprocess.run(["gpgconf", "--kill", "all"], env=env, check=False, capture_output=True)
        shutil.rmtree(run.gpg_home, ignore_errors=True)


def manifest_digest(run: Run, reference: str) -> str | None:
    """sha256:HEX of the manifest REFERENCE has as stored (skopeo inspect --raw), None where a registry has no such
    tag; any other failure (a login, the network) raises."""
    tls = [run.tls_flag("tls")] if reference.startswith("docker://") else []
    done = run.skopeo("inspect", "--raw", *tls, reference, check=False)
    if done.returncode != 0:
        if "manifest unknown" in done.stderr.lower():
            return None
        raise PublishError(f"`skopeo inspect {reference}` failed: {done.stderr.strip()}")
    return f"sha256:{hashlib.sha256(done.stdout.encode()).hexdigest()}"


def claim(run: Run, source: str, resume: str | None = None) -> str | None:
    """A version is never replaced: None when NAME:VERSION is free (push), the digest to go on from when it already
    names SOURCE's manifest or RESUME's digest (push nothing), PublishError naming both ways on otherwise."""
    tag = f"{run.repository}:{run.version}"
    existing = manifest_digest(run, f"docker://{tag}")
    if existing is None:
        if resume:
            raise PublishError(
                f"--resume {resume}: {tag} does not exist, nothing to resume from: leave --resume out"
            )
        return None
    built = manifest_digest(run, source)
    if existing in (built, resume):
        print(
            f"ci/publish: {tag} already is {existing} (this image's): resuming from it, nothing pushed",
            file=sys.stderr,
        )
        return existing
    raise PublishError(
        f"{tag} already names {existing}, this image is {built}: a version is never replaced. A re-run after a "
        f"release whose push went through resumes from the pushed digest: re-run the failed jobs alone (they reuse "
        f"the build's artifact, this digest's image), or by hand `ci/publish --resume {existing} ...` once you have "
        "checked that digest is this release's build; anything else is a new version (a new tag, vX.Y.Z+1)"
    )


def push(run: Run, source: str) -> str:
    """SOURCE to NAME:VERSION, signed when local; the digest skopeo wrote."""
    digestfile = run.work / "pushed.digest"
    sign = ["--sign-by", run.fingerprint] if run.fingerprint else []
    run.skopeo(
        "copy", "--retry-times", "2", run.tls_flag("dest"), *sign, "--digestfile", str(digestfile),
        source, f"docker://{run.repository}:{run.version}",
    )  # fmt: skip
    return digestfile.read_text().strip()


def registry_digest(run: Run, pushed: str) -> tuple[str, list[str]]:
    """The digest and layers the registry reports for NAME:VERSION; it must be the one pushed."""
    seen = json.loads(
        run.skopeo("inspect", run.tls_flag("tls"), f"docker://{run.repository}:{run.version}").stdout
    )
    if seen["Digest"] != pushed:
        raise PublishError(
            f"the registry reports {run.repository}:{run.version} as {seen['Digest']}, skopeo pushed {pushed}: "
            "another push raced this one (run it again alone)"
        )
    return seen["Digest"], list(seen["Layers"])


def pull_back(run: Run, digest: str, layers: list[str]) -> Path:
    """NAME@DIGEST into a dir: copy (through the verifying policy when local), compared with what was pushed."""
    copy = run.work / "pulled"
    shutil.rmtree(copy, ignore_errors=True)
    raw = json.loads(
        run.skopeo("inspect", "--raw", run.tls_flag("tls"), f"docker://{run.repository}@{digest}").stdout
    )
    size = sum(int(layer.get("size", 0)) for layer in raw.get("layers", []))
    free = shutil.disk_usage(run.work).free
    print(
        f"ci/publish: {len(layers)} layers, {size / 2**30:.1f} GB compressed; {free / 2**30:.1f} GB free under "
        f"{run.work} with the registry's copy, before the pull back",
        file=sys.stderr,
    )  # the figures ci/build-image's publish_gb estimates
    if free < size + 2**30:
        raise PublishError(
            f"{free / 2**30:.1f} GB free under {run.work}, pulling {digest} back needs {size / 2**30:.1f} GB and 1 GB "
            "to spare: free some disk, or GLM5_PUBLISH=none to build without publishing"
        )
    run.skopeo(
        "copy", run.tls_flag("src"), f"docker://{run.repository}@{digest}", f"dir:{copy}",
        policy="verify" if run.local else "open",
    )  # fmt: skip
    if sbom.digest_of(copy / "manifest.json") != digest:
        raise PublishError(
            f"the manifest pulled by {digest} hashes to {sbom.digest_of(copy / 'manifest.json')}"
        )
    manifest = json.loads((copy / "manifest.json").read_text())
    pulled = [layer["digest"] for layer in manifest["layers"]]
    if pulled != layers:
        raise PublishError(f"the pulled manifest lists layers {pulled}, the registry reported {layers}")
    for layer in pulled:
        if sbom.digest_of(copy / layer.split(":", 1)[1]) != layer:
            raise PublishError(f"the pulled layer {layer} does not hash to its digest: the copy is corrupt")
    return copy


def make_sbom(run: Run, copy: Path, digest: str, image: dict[str, str]) -> Path:
    bom = sbom.build(copy, run.repository, digest, run.version)
    # The image's record is FlashInfer's (the Dockerfile copies flashinfer/GLM5_SERVE_PATCHES.json): its patches alone.
    series = [p.name for p in read_series(SERIES) if p.package == "flashinfer"]
    found = sbom.problems(bom, image, series)
    if found:
        raise PublishError("; ".join(found))
    path = run.work / "sbom.cdx.json"
    path.write_text(json.dumps(bom, indent=1) + "\n")
    print(
        f"ci/publish: the SBOM lists {len(bom['components'])} components "
        f"({sum(c['purl'].startswith('pkg:deb/') for c in bom['components'])} Debian): {path}",
        file=sys.stderr,
    )
    return path


def refused(run: Run, reference: str, expected: str) -> None:
    done = run.skopeo(
        "copy", run.tls_flag("src"), reference, f"dir:{run.work / 'refused'}", policy="verify", check=False
    )
    shutil.rmtree(run.work / "refused", ignore_errors=True)
    if done.returncode == 0 or expected not in done.stderr:
        raise PublishError(
            f"the verifying policy let {reference} through or refused it for another reason "
            f"(exit {done.returncode}: {done.stderr.strip()}); it must refuse it with '{expected}'"
        )


def refusals(run: Run, digest: str, manifest_type: str) -> None:
    """The same image in the other manifest format (another digest, no signature): refused unsigned; then with
    DIGEST's signature laid beside it, as a tampered digest: refused as not matching."""
    other = "v2s2" if "oci" in manifest_type else "oci"
    variant = run.work / "variant.digest"
    run.skopeo(
        "copy", run.tls_flag("src"), run.tls_flag("dest"), "--remove-signatures", "--format", other,
        "--digestfile", str(variant),
        f"docker://{run.repository}@{digest}", f"docker://{run.repository}:policy-check",
    )  # fmt: skip
    unsigned = variant.read_text().strip()
    if unsigned == digest:
        raise PublishError(f"copying {digest} as {other} kept its digest: no unsigned variant to refuse")
    refused(run, f"docker://{run.repository}@{unsigned}", UNSIGNED)
    sigs = run.work / "signatures"
    signed = next((sigs).glob(f"{run.name}@sha256={digest.split(':', 1)[1]}/signature-1"))
    forged = sigs / f"{run.name}@sha256={unsigned.split(':', 1)[1]}"
    forged.mkdir(parents=True, exist_ok=True)
    shutil.copy(signed, forged / "signature-1")
    refused(run, f"docker://{run.repository}@{unsigned}", MISMATCH)


def publish_steps(run: Run, source: str, image: dict[str, str], resume: str | None = None) -> dict[str, Any]:
    if run.local:
        throwaway_key(run)
    configure(run)
    with step(run, "claim"):
        resumed = claim(run, source, resume)
    if resumed:
        pushed = resumed
    else:
        with step(run, "push"):
            pushed = push(run, source)
    with step(run, "digest"):
        digest, layers = registry_digest(run, pushed)
    with step(run, "pull and compare"):
        copy = pull_back(run, digest, layers)
    with step(run, "sbom"):
        sbom_path = make_sbom(run, copy, digest, image)
    if run.local:
        with step(run, "refusals"):
            refusals(run, digest, json.loads((copy / "manifest.json").read_text()).get("mediaType", ""))
    shutil.rmtree(copy, ignore_errors=True)
    result = {
        "version": run.version,
        "reference": f"{run.repository}@{digest}",
        "tag": f"{run.repository}:{run.version}",
        "digest": digest,
        "layers": layers,
        "sbom": str(sbom_path),
        "sbom_sha256": sbom.digest_of(sbom_path),
        "signed_by": f"gpg:{run.fingerprint} (throwaway, this run)" if run.local else None,
        "resumed": resumed is not None,
        "seconds": run.seconds,
    }
    return result


def publish(
    source: str, registry: str, work: Path, record: Path, resume: str | None = None
) -> dict[str, Any]:
    name, version, image = kit_version()
    work.mkdir(parents=True, exist_ok=True)
    local = registry == "local"
    with local_registry(work) if local else _remote(registry) as host:
        run = Run(work=work, registry=host, name=name, version=version, local=local, tls=not local)
        try:
            result = publish_steps(run, source, image, resume)
        finally:
            forget_key(run)
    record.write_text(json.dumps(result, indent=2) + "\n")
    print(f"ci/publish: {result['reference']} recorded in {record}", file=sys.stderr)
    return result


@contextmanager
def _remote(registry: str) -> Iterator[str]:
    yield registry


def missing_tools(local: bool) -> list[str]:
    return [tool for tool in (NEEDS_LOCAL if local else ("skopeo",)) if shutil.which(tool) is None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ci/publish", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source", help="a skopeo reference: containers-storage:[vfs@...]NAME:TAG, oci:DIR:TAG"
    )
    parser.add_argument("--registry", default="local", help="local (127.0.0.1, throwaway) or HOST/PATH")
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/var/tmp/glm5-build/publish"),
    )
    parser.add_argument("--record", type=Path, help="where the record goes (default: WORK/published.json)")
    parser.add_argument(
        "--resume",
        metavar="sha256:HEX",
        help="NAME:VERSION already names this digest, this release's: go on from it, pushing nothing",
    )
    args = parser.parse_args(argv)
    missing = missing_tools(args.registry == "local")
    if missing:
        print(
            f"ci/publish: needs {', '.join(missing)}: apt-get install skopeo docker-registry gpg "
            "(ci/setup-test-env and ci/build-image install them)",
            file=sys.stderr,
        )
        return 1
    try:
        publish(
            args.source, args.registry, args.work, args.record or args.work / "published.json", args.resume
        )
    except (PublishError, sbom.SbomError, subprocess.CalledProcessError, StopIteration) as err:
        print(f"ci/publish: FAIL {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
