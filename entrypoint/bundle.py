"""A support bundle: one archive an operator attaches to an issue, with every secret taken out.

    entrypoint/doctor --bundle - > glm5-bundle.tar.gz      to stdout (the container's root is read-only)
    entrypoint/doctor --bundle /mounted/folder/bundle.tar.gz

It holds the doctor's findings (its fast checks, run now), the versions (the build's records and the Python
packages), the kit's version and the image's digest where it is known (image.json), the effective configuration (the
server's argv and environment as the latest start's record holds them, or why there is none), the run state
(launch.json, failed.json, doctor.json, capture.json, the start counter; never the server's private config file, which holds the API key), the healthcheck's state, the server log's tail, and
`nvidia-smi -q` and `nvidia-smi topo -m`. Every secret the settings declare (GLM5_API_KEY, HF_TOKEN, from VAR or
VAR_FILE) is replaced by `[redacted]` in every member, and so is any `Bearer` token. What cannot be read is named
in the member `missing.txt` instead of stopping the bundle.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from common.report import OK, USAGE, Log, Problem, Problems
from configuration import settings, state
from configuration.start import Start
from entrypoint import doctor
from healthcheck import probe

LOG = Log("doctor --bundle")
REDACTED = "[redacted]"
BEARER = re.compile(r"(Bearer\s+)\S+", re.IGNORECASE)
LOG_TAIL_BYTES = 2 * 2**20
PACKAGES = (
    "sglang",
    "torch",
    "flashinfer-python",
    "supervisor",
    "smg",
    "nvidia-cutlass-dsl",
    "apache-tvm-ffi",
)
BUILD_RECORDS = ("BUILD-ID", "PATCHES-APPLIED.json", "KERNELS-PREBUILT.json")
KEPT_STATE = tuple(name for name in state.FILES if name != state.SERVER_CONFIG)


def secrets(environ: Mapping[str, str]) -> list[str]:
    """The values of every secret setting, from VAR or VAR_FILE, longest first (so no part of one survives)."""
    found = []
    for decl in settings.declarations(settings.load_config()).values():
        if decl.kind != "secret":
            continue
        try:
            value = settings.read_secret(environ, decl.name)
        except Problem:
            value = environ.get(decl.name)
        if value:
            found.append(value.strip())
    return sorted({s for s in found if s}, key=len, reverse=True)


def redact(text: str, hidden: list[str]) -> str:
    for secret in hidden:
        text = text.replace(secret, REDACTED)
    return BEARER.sub(rf"\1{REDACTED}", text)


def versions(home: Path) -> str:
    lines = []
    for name in PACKAGES:
        try:
            lines.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"{name}: not installed")
    for record in BUILD_RECORDS:
        path = home / record
        lines.append(
            f"--- {record}\n{path.read_text().strip() if path.is_file() else '(absent: not an image build)'}"
        )
    return "\n".join(lines) + "\n"


DIGEST_REF = re.compile(r"@(sha256:[0-9a-f]{64})$")


def image_identity(environ: Mapping[str, str], cfg: Mapping[str, Any] | None = None) -> str:
    """The kit's version (glm5.toml [deployment].image's tag, the one source) and the image's digest when known: a
    reference by digest in GLM5_IMAGE (as compose runs a release; read where the bundle runs on the host). Inside
    the container no digest is known (Docker and Kubernetes tell the image none): the record says where to read it."""
    cfg = cfg or settings.load_config()
    image = str(cfg["deployment"]["image"])
    version = image.split("@", 1)[0].rsplit(":", 1)[-1]
    reference = environ.get("GLM5_IMAGE", image)
    found = DIGEST_REF.search(reference) or DIGEST_REF.search(image)
    record: dict[str, Any] = {
        "version": version,
        "image": reference,
        "digest": found.group(1) if found else None,
    }
    if not found:
        record["digest_unknown"] = (
            "not given by digest here: `docker image inspect --format '{{.RepoDigests}}' IMAGE` on the host, or the "
            "pod's status.containerStatuses[].imageID, names it"
        )
    return json.dumps(record, indent=2) + "\n"


def configuration(launch: Start | None, problems: list[Problem]) -> str:
    """The latest start's configuration as its record holds it (launch resolved it once; nothing resolves it again),
    or why there is none."""
    if launch is None:
        return (
            json.dumps(
                {
                    "no_start": "no start record (launch.json) yet: `entrypoint/launch --dry-run` prints what a start "
                    "would run, and state/failed.json holds a refused start's reason",
                    "refused": [str(p) for p in problems],
                },
                indent=2,
            )
            + "\n"
        )
    return (
        json.dumps({"start": launch.start, "argv": list(launch.argv), "env": dict(launch.env)}, indent=2)
        + "\n"
    )


def log_tail(log_dir: str) -> str:
    with (Path(log_dir) / state.SERVER_LOG).open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
        return fh.read().decode(errors="replace")


def healthcheck_state(environ: Mapping[str, str]) -> str:
    return json.dumps(probe.verdict(probe.run_of(environ)).as_json(), indent=2) + "\n"


def doctor_findings(values: Mapping[str, Any], box: doctor.Box) -> str:
    return json.dumps(doctor.report(doctor.run(box, values)), indent=2) + "\n"


def members(environ: Mapping[str, str], box: doctor.Box) -> dict[str, str]:
    """Every member's text, unredacted; what could not be read is listed in missing.txt."""
    try:
        values, problems = state.supervised(environ, create=False)
    except Problems as err:  # not even the default folders: bundle what can be read
        values, problems = settings.resolve_leniently(environ)[0], err.problems
    home = Path(environ.get("GLM5_HOME", Path(__file__).resolve().parent.parent))
    out: dict[str, str] = {}
    missing = [f"setting {p}" for p in problems]
    readers: dict[str, Callable[[], str | None]] = {
        "versions.txt": lambda: versions(home),
        "image.json": lambda: image_identity(environ),
        "configuration.json": lambda: configuration(state.read_launch(values["state_dir"]), problems),
        "doctor.json": lambda: doctor_findings(values, box),
        "healthcheck.json": lambda: healthcheck_state(environ),
        "server.log.tail": lambda: log_tail(values["log_dir"]),
        "nvidia-smi-q.txt": lambda: box.smi("-q"),
        "nvidia-smi-topo.txt": lambda: box.smi("topo", "-m"),
    }

    def state_file(name: str) -> Callable[[], str]:
        return lambda: state.path(values["state_dir"], name).read_text()

    readers |= {f"state/{name}": state_file(name) for name in KEPT_STATE}
    hangs = Path(values["log_dir"]) / state.HANGS  # a state record kept beside the log
    readers[f"state/{state.HANGS}"] = hangs.read_text
    for member, read in readers.items():
        try:
            text = read()
        except (OSError, Problems, Problem, ValueError) as err:
            text, reason = None, f"{type(err).__name__}: {err}"
        else:
            reason = "no output (nvidia-smi missing or failing)"
        if text is None:
            missing.append(f"{member}: {reason}")
        else:
            out[member] = text
    out["missing.txt"] = "\n".join(missing) + "\n" if missing else "(nothing)\n"
    return out


def write(target: BinaryIO, texts: Mapping[str, str], hidden: list[str]) -> None:
    stamp = time.time()
    with tarfile.open(fileobj=target, mode="w|gz") as archive:
        for name, text in texts.items():
            data = redact(text, hidden).encode()
            info = tarfile.TarInfo(f"glm5-bundle/{name}")
            info.size, info.mtime, info.mode = len(data), int(stamp), 0o644
            archive.addfile(info, io.BytesIO(data))


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(prog="entrypoint/doctor --bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--bundle", required=True, metavar="FILE", help="where the archive goes; - for stdout"
    )
    args = parser.parse_args(argv)
    if args.bundle == "-" and sys.stdout.isatty():
        LOG.error("stdout is a terminal: redirect it, e.g. entrypoint/doctor --bundle - > glm5-bundle.tar.gz")
        return USAGE
    texts = members(environ, doctor.Box(environ))
    hidden = secrets(environ)
    if args.bundle == "-":
        write(sys.stdout.buffer, texts, hidden)
    else:
        with Path(args.bundle).open("wb") as fh:
            write(fh, texts, hidden)
        print(
            f"doctor --bundle: wrote {args.bundle} ({len(texts)} members, secrets redacted)", file=sys.stderr
        )
    return OK


if __name__ == "__main__":
    sys.exit(main())
