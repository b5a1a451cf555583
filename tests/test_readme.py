"""The documentation's promises kept true (README.md and docs/): every kit command it documents runs with --help,
every GLM5_* variable it names is a setting (or a removed one it says so of), its figures come from ci/figures.toml,
and the README fits on a page: at most 350 lines, with a table of contents whose links land on its headings."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ci import render
from configuration import settings
from conftest import ROOT
from helpers.container import Container, start

README = (ROOT / "README.md").read_text()
DOCS = "\n".join([README, *(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))])
# A kit path used as a command: not part of a longer path or a file name (.ci/run, ci/figures.toml, configuration/state.py).
COMMAND = re.compile(
    r"(?<![\w./-])(?:/opt/glm5/)?((?:ci|entrypoint|healthcheck|patches|image|gateway)/[a-z][a-z-]*[a-z])(?![\w./-])"
)
KIT_FOLDERS = ("ci", "entrypoint", "healthcheck", "patches", "image", "gateway")


def documented_commands(text: str) -> list[str]:
    """Kit paths the README names that are executables, or that look like commands but do not exist."""
    found = set()
    for m in COMMAND.finditer(text):
        path = ROOT / m.group(1)
        if path.is_file() and os.access(path, os.X_OK):
            found.add(m.group(1))
        elif not path.exists():
            found.add(m.group(1))  # a documented command that is missing: --help fails below
    return sorted(found)


COMMANDS = documented_commands(DOCS)


def test_the_readme_documents_the_kits_commands() -> None:
    assert {"ci/test", "ci/smoke", "ci/bench", "entrypoint/download", "healthcheck/healthcheck"} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.boots
def test_every_documented_command_runs_with_help(command: str) -> None:
    path = ROOT / command
    assert path.is_file(), f"the README documents {command}, which does not exist"
    done = subprocess.run(
        [str(path), "--help"], capture_output=True, text=True, check=False, timeout=60, cwd=ROOT
    )
    assert done.returncode == 0, f"{command} --help exited {done.returncode}: {done.stderr[-500:]}"
    assert done.stdout.strip(), f"{command} --help printed nothing"


def test_a_missing_command_in_the_readme_is_caught() -> None:
    assert "entrypoint/no-such-tool" in documented_commands("run `entrypoint/no-such-tool --json`")


def documented_variables(text: str) -> set[str]:
    return set(re.findall(r"\b(GLM5_[A-Z0-9_]+|HF_TOKEN(?:_FILE)?)\b", text))


def test_every_documented_variable_is_a_setting() -> None:
    config = settings.load_config()
    decls = settings.declarations(config)
    known = set(decls) | {f"{n}_FILE" for n, s in decls.items() if s.kind == "secret"}
    removed = set(config["removed_setting"])
    unknown = sorted(documented_variables(DOCS) - known - removed)
    assert unknown == [], f"the README names variables that are not settings: {unknown}"
    for name in documented_variables(DOCS) & removed:  # only where it says it was removed
        assert re.search(rf"{name}\b[^.]*(removed|retired)", DOCS), f"{name} is documented as if it existed"


def test_an_unknown_variable_in_the_readme_is_caught() -> None:
    assert "GLM5_NO_SUCH_KNOB" in documented_variables("set `GLM5_NO_SUCH_KNOB=1` in glm5.env")


def test_figures_are_stated_in_one_place() -> None:
    """The measured figures appear in the README's figures table (rendered from ci/figures.toml), and the
    Dockerfile and ci/build-image state none of their own."""
    table = README.split("<!-- ci/render: figures -->")[1].split("<!-- ci/render: end figures -->")[0]
    for f in render.load_figures():
        assert f"| {f['value']:g} {f['unit']} |" in table, f["key"]
    timing = re.compile(r"\b\d+(?:\.\d+)? ?(?:min|minutes)\b|\b\d+(?:\.\d+)? ?GB image|\bMeasured here\b")
    for rel in ("Dockerfile", "ci/build-image"):
        text = (ROOT / rel).read_text()
        text = text.replace(f"{settings.load_config()['deployment']['startup_budget_seconds'] // 60} min", "")
        assert not timing.search(text), f"{rel} states a figure of its own: {timing.search(text)}"
    prose = README.split("<!-- ci/render: figures -->")[0]
    for stale in (r"\b\d+ s on 2 cores", r"about \d+ tests in about \d+ minutes", r"\d+(\.\d+)? GB image"):
        assert not re.search(stale, prose), f"README prose states a figure outside the table: {stale}"


def test_readme_checks_can_fail(tmp_path: Path) -> None:
    """The figure rule catches prose that states a figure of its own (the other rules have their own can-fail tests)."""
    stale = "`ci/build-image` took 781 s on 2 cores, an 11.2 GB image"
    assert any(re.search(p, stale) for p in (r"\b\d+ s on 2 cores", r"\d+(\.\d+)? GB image"))
    assert not any(
        re.search(p, README.split("<!-- ci/render: figures -->")[0]) for p in (r"\b\d+ s on 2 cores",)
    )


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_fits_on_a_page_and_its_contents_land_on_its_headings() -> None:
    assert len(README.splitlines()) <= 350
    headings = {anchor(h) for h in re.findall(r"^#{2,4} (.+)$", README, re.M)}
    contents = README.split("## Contents")[1].split("\n## ")[0]
    local = re.findall(r"\]\(#([^)]+)\)", contents)
    assert len(local) >= 8
    missing = [a for a in local if a not in headings]
    assert missing == [], f"the contents link to headings that do not exist: {missing}"


def test_every_document_link_lands() -> None:
    """Links from the README and docs/ to files of the kit, and to headings in docs/, resolve."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for target, fragment in re.findall(r"\]\(([^)#:]+\.md)(?:#([^)]+))?\)", text):
            path = (doc.parent / target).resolve()
            assert path.is_file(), f"{doc.name} links to {target}, which does not exist"
            if fragment:
                headings = {anchor(h) for h in re.findall(r"^#{1,4} (.+)$", path.read_text(), re.M)}
                assert fragment in headings, f"{doc.name} links to {target}#{fragment}: no such heading"
        for fragment in re.findall(r"\]\(#([^)]+)\)", text):
            headings = {anchor(h) for h in re.findall(r"^#{1,4} (.+)$", text, re.M)}
            assert fragment in headings, f"{doc.name} links to #{fragment}: no such heading"


def shell_block(after: str) -> str:
    """The first ```sh block of the README after the text AFTER, its lines unindented."""
    rest = README.split(after, 1)[1]
    body = rest.split("```sh\n", 1)[1].split("```", 1)[0]
    return "\n".join(line.strip() for line in body.splitlines()) + "\n"


STAND_INS = {
    # the operator is UID 1001, not the image's 1000: `id -u` says so, sudo runs as root (the test is), and the
    # download (`hf download REPO --local-dir DIR`) writes as that user.
    "id": '[ "$1" = -u ] && echo 1001 || exec /usr/bin/id "$@"\n',
    "sudo": 'exec "$@"\n',
    "hf": 'exec setpriv --reuid 1001 --regid 1001 --clear-groups touch "$4/config.json"\n',
}


def test_the_quick_starts_weights_step_works_for_an_operator_who_is_not_uid_1000(
    request: pytest.FixtureRequest,
) -> None:
    """Step 1 as written made the folder UID 1000's (mode 0775) and then downloaded as the operator: refused for
    every UID but 1000. Run here with the download as a write by UID 1001 (setpriv); the folder ends up UID 1000's."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as an operator whose UID is not 1000")
    scratch = Path(tempfile.mkdtemp(prefix="glm5-readme-"))  # /tmp: pytest's own folder is 0700
    scratch.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(scratch))
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    for name, body in STAND_INS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    folder = scratch / "models" / "GLM-5-NVFP4"
    block = shell_block("1. **The box, then the weights, on the host first**")
    assert "hf download nvidia/GLM-5-NVFP4 --local-dir /srv/models/GLM-5-NVFP4" in block
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.replace("/srv/models/GLM-5-NVFP4", str(folder))],
        env=os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for path in (folder, folder / "config.json"):
        assert (path.stat().st_uid, path.stat().st_gid) == (1000, 0), path


def shell_blocks(text: str = README) -> list[str]:
    """Every ```sh block of the README, its lines unindented."""
    return [
        "\n".join(line.strip() for line in body.splitlines()) + "\n"
        for body in re.findall(r"```sh\n(.*?)```", text, re.S)
    ]


# Each command block the README tells a user to run (by its first line's start): the test that runs it here, or why
# it cannot run on a machine without a Docker engine, GPUs or a cluster. A new block must be added here.
BLOCKS = {
    "docker compose up glm5": "not run: needs a Docker engine and the eight GPUs; ci/smoke runs it on the box, and "
    "tests/test_smoke_compose.py runs ci/smoke's compose path against a stand-in docker; ci/test is CI's own command",
    "sudo install -d": "test_the_quick_starts_weights_step_works_for_an_operator_who_is_not_uid_1000",
    "cp .env.example .env": "test_the_quick_starts_settings_step_reaches_compose_and_the_container",
    "curl -s http://127.0.0.1:30000": "test_the_first_request_answers_a_chat_completion",
    "docker tag glm5-serve": "not run as a whole: docker tag and push need an engine and a registry; its sed line "
    "runs in tests/test_image.py::test_the_readme_image_step_tags_every_container",
}


def test_every_command_block_of_the_readme_is_run_by_a_test_or_says_why_not() -> None:
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    blocks = shell_blocks()
    assert len(blocks) >= 5
    for block in blocks:
        owners = [k for k in BLOCKS if block.startswith(k)]
        assert len(owners) == 1, f"a README block no test runs (add it to BLOCKS): {block.splitlines()[0]}"
        runner = BLOCKS[owners[0]]
        if not runner.startswith("not run"):
            assert f"def {runner}(" in tests, runner
    assert len(BLOCKS) == len(blocks), "BLOCKS names a block the README no longer has"
    unlisted = "Intro\n```sh\nrm -rf /srv/models\n```\n"  # the check can fail: a block nobody runs
    assert not [b for b in shell_blocks(unlisted) if any(b.startswith(k) for k in BLOCKS)]


@pytest.mark.boots
def test_the_quick_starts_settings_step_reaches_compose_and_the_container(tmp_path: Path) -> None:
    """Step 2 as written, in a copy of the kit's compose files: compose reads the weights folder from .env, passes
    the generated key from glm5.env into the container, and the kit's settings take what glm5.env holds."""
    for name in ("docker-compose.yml", ".env.example", "glm5.env.example"):
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / "gateway").mkdir()
    block = shell_block("2. **Settings.**")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True, text=True,
                          check=False, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    composed = subprocess.run(
        [str(Path(sys.executable).parent / "docker-compose"), "-f", "docker-compose.yml", "config", "--format", "json"],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("GLM5_")},
    )  # fmt: skip
    assert composed.returncode == 0, composed.stderr
    glm5 = json.loads(composed.stdout)["services"]["glm5"]
    assert "/srv/models/GLM-5-NVFP4" in [v["source"] for v in glm5["volumes"]]
    written = dict(
        line.split("=", 1)
        for line in (tmp_path / "glm5.env").read_text().splitlines()
        if re.match(r"GLM5_\w+=", line)
    )
    assert (
        re.fullmatch(r"[0-9a-f]{48}", written["GLM5_API_KEY"])
        and glm5["environment"]["GLM5_API_KEY"] == written["GLM5_API_KEY"]
    )
    assert settings.resolve(written)["api_key"] == written["GLM5_API_KEY"]  # no setting refused


@pytest.mark.boots
def test_the_first_request_answers_a_chat_completion(tmp_path: Path, containers: list[Container]) -> None:
    """Step 5's curl as written, with the key exported as step 2 leaves it, against the container (the double, in its
    mode that honours max_tokens and thinks at length as GLM-5 does): a chat.completion whose
    choices[0].message.content holds the reply. The same request with thinking on, as step 5 once sent it, answers
    nothing in content within 64 tokens (its thought cut: finish_reason length), which is why the step turns it off
    and says so. Where the thought goes is SGLang 0.5.23's glm45 parser's doing (tests/test_verify.py runs it)."""
    key = "0123456789abcdef" * 3
    c = start(tmp_path, "worded-otherwise", GLM5_API_KEY=key)
    containers.append(c)
    c.wait_healthy()
    block = shell_block("5. **First request**")
    assert "127.0.0.1:30000" in block and '"enable_thinking": false' in block

    def run(script: str) -> dict[str, Any]:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script.replace(":30000", f":{c.port}")],
                              env=os.environ | {"GLM5_API_KEY": key}, capture_output=True, text=True, check=False,
                              timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    answer = run(block)
    assert answer["object"] == "chat.completion" and answer["choices"][0]["message"]["content"].strip()
    thinking = run(block.replace('"enable_thinking": false', '"enable_thinking": true'))["choices"][0]
    assert thinking["message"]["content"] == "" and thinking["finish_reason"] == "length", thinking
    assert thinking["message"]["reasoning_content"], thinking
    # docs/reference.md's openai-client example, as written, in ci/smoke's venv (the pinned openai client)
    example = (ROOT / "docs" / "reference.md").read_text().split("```python\n", 1)[1].split("```", 1)[0]
    done = subprocess.run([str(ROOT / ".venv-smoke" / "bin" / "python"), "-c", example.replace(":30000", f":{c.port}")],
                          env=os.environ | {"GLM5_API_KEY": key}, capture_output=True, text=True, check=False,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert said["reply"].strip() and said["reply"] != "None", done.stdout
    assert said["reasoning"].strip() and said["reasoning"] != "None", done.stdout  # the thought, apart
    assert said["reply after thinking"].strip().endswith("(stop)"), done.stdout  # room enough: a whole answer
    assert not said["reply after thinking"].startswith("None"), done.stdout


def exit_code_tools(code: str) -> list[str]:
    (tools,) = [t for c, _, t in render.EXIT_CODES if c == code]
    return [t.strip() for t in tools.split(",")]


# How each tool the exit-code table lists for code 3 is run here, offline and at once.
INVALID_SETTING_RUNS = {
    "entrypoint": ["entrypoint/entrypoint.sh", "doctor"],
    "launch": ["entrypoint/launch", "--dry-run"],
    "doctor": ["entrypoint/doctor"],
    "download": ["entrypoint/download"],
    "gateway/launch": ["gateway/launch", "--kubernetes", "glm5", "--dry-run"],
    "ci/smoke": ["ci/smoke", "--url", "http://127.0.0.1:9"],
    "ci/bench": ["ci/bench", "--url", "http://127.0.0.1:9"],
    "ci/eval": ["ci/eval", "--url", "http://127.0.0.1:9"],
}


def run_tool(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_")}
    path = f"{ROOT / '.venv' / 'bin'}:{clean['PATH']}"  # the in-image tools import the image's packages
    return subprocess.run(
        [str(ROOT / argv[0]), *argv[1:]],
        env=clean | {"PATH": path} | env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.boots
def test_every_tool_the_exit_code_table_lists_for_3_exits_3_for_an_unknown_setting() -> None:
    """The table listed the healthcheck under 3, which warns and judges with glm5.toml's value instead."""
    assert sorted(exit_code_tools("3")) == sorted([*INVALID_SETTING_RUNS, "kernels/build"])
    for tool, argv in INVALID_SETTING_RUNS.items():
        done = run_tool(argv, GLM5_NO_SUCH_SETTING="1")
        assert done.returncode == 3, (tool, done.stderr[-2000:])
        assert "GLM5_NO_SUCH_SETTING" in done.stderr, tool
    unfit = run_tool(["kernels/build", "--dry-run", "--modules", "ci"], CUDA_HOME="/nonexistent")
    assert unfit.returncode == 3 and "CUDA_HOME" in unfit.stderr, unfit.stderr
    log = "tests/fixtures/logs/sglang-0.5.23-oom-during-decode-capture.log"
    probe = run_tool(
        ["healthcheck/healthcheck", "--status", "--no-http", "--log", log], GLM5_NO_SUCH_SETTING="1"
    )
    assert probe.returncode != 3 and "GLM5_NO_SUCH_SETTING" in probe.stderr


@pytest.mark.parametrize(
    "argv",
    [["image/assert-versions"], ["ci/render-dashboard"], ["ci/build-image"], ["image/relock"]],
)
def test_help_exits_0_and_an_unknown_option_exits_2_without_doing_anything(argv: list[str]) -> None:
    """image/assert-versions took --help for a pin (exit 1); ci/render-dashboard --help went on to run ci/render,
    which rewrites files; ci/build-image took an option for the image's tag; image/relock ignored its arguments."""
    helped = run_tool([*argv, "--help"])
    assert helped.returncode == 0 and helped.stdout, helped.stderr
    assert "ci/render:" not in helped.stdout  # nothing rendered, nothing written
    refused = run_tool([*argv, "--no-such-option"])
    assert refused.returncode == 2, refused.stderr
    assert "ci/render:" not in refused.stdout


def test_no_document_describes_a_startup_probe() -> None:
    """The pod has none (tests/test_render.py), yet k8s/README.md listed "startup/readiness/liveness probes" and
    glm5.toml's removed-setting message spoke of "the 40-minute startup probes"."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    documents = [ROOT / rel for rel in listed.split() if rel.endswith((".md", ".toml", ".yaml", ".yml"))]
    claim = re.compile(r"(?<!no )startup[ -]probe|startup/readiness|startupProbe", re.I)
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in documents for m in claim.finditer(p.read_text())]
    assert found == []


def test_the_troubleshooting_oom_line_is_what_the_healthcheck_prints() -> None:
    """The README quoted `failed: out of memory: ... (during decode graph capture (37/52))`, a form the healthcheck
    never printed: each part of the quoted line, between its `...`, must be in its output for a real OOM log."""
    (quoted,) = re.findall(r"\*\*Out of memory during capture\*\* \(`([^`]+)`\)", " ".join(README.split()))
    log = "tests/fixtures/logs/sglang-0.5.23-oom-during-decode-capture.log"
    said = run_tool(["healthcheck/healthcheck", "--status", "--no-http", "--log", log]).stdout
    at = 0
    for part in filter(None, (p.strip() for p in quoted.split("..."))):
        at = said.find(part, at)
        assert at >= 0, (part, said)


HOST_TOOLS = ("ci/render", "ci/bench", "entrypoint/doctor", "ci/smoke", "ci/eval", "ci/setup-test-env")
# python3 as an Ubuntu 22.04 host has it (3.10: no tomllib, so ci/render and doctor died with a traceback), and as
# Debian 12 / Ubuntu 24.04 have it without python3-venv (ci/smoke's first run failed making .venv-smoke).
OLD_PYTHON = 'case "$*" in *version_info*) echo 3.10; exit 1 ;; esac; exit 1\n'
NO_VENV = f'case "$*" in *ensurepip*) exit 1 ;; esac; exec {sys.executable} "$@"\n'


@pytest.mark.parametrize("tool", HOST_TOOLS)
@pytest.mark.parametrize(("python3", "said"), [(OLD_PYTHON, "need 3.11 or newer"), (NO_VENV, "python3-venv")])
def test_host_tools_name_the_python_they_need(tmp_path: Path, tool: str, python3: str, said: str) -> None:
    if said == "python3-venv" and tool not in ("ci/smoke", "ci/eval", "ci/setup-test-env"):
        pytest.skip("makes no venv")
    (tmp_path / "python3").write_text("#!/bin/sh\n" + python3)
    (tmp_path / "python3").chmod(0o755)
    path = f"{tmp_path}:{os.environ['PATH']}"
    done = subprocess.run(
        [str(ROOT / tool), "no-such-env" if tool == "ci/setup-test-env" else "--help"],
        env=os.environ | {"PATH": path},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 127, done.stdout + done.stderr
    assert f"{tool}: error: python3" in done.stderr and said in done.stderr and "fix:" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_readme_promises_no_release_the_kit_does_not_publish() -> None:
    """A version is published when CHANGELOG.md names its image by digest (the release workflow writes that line);
    a changelog and a release workflow alone publish nothing. Until then the README says plainly that no version is
    published and to build meanwhile, and promises no release to pull."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    published = re.search(r"^Image: \S+@sha256:[0-9a-f]{64}", changelog, re.M) is not None
    if not published:
        assert "Image: not yet published" in changelog
        said = re.search(r"no version is published yet \(no tag, no image: CHANGELOG\.md\), so build", README)
        assert said is not None, "the README does not say that no version is published yet, and what to do"
        release = (ROOT / "docs" / "release.md").read_text()
        assert "**No version is published yet**" in release, "docs/release.md reads as if a release existed"
        assert not re.search(r"(?i)\b(pull|install|download) (a|the) (new |latest )?release", README), (
            "a release"
        )


def test_the_readmes_times_are_the_reference_estimates() -> None:
    """The README's "1-2 hours" to a first answer on the minimum box, the sweep's "about a day" and "`--shape
    1k-1k-c1024` first takes a third of it" are docs/reference.md's rendered estimates (ci/render's arithmetic on the
    kit's figures), and that shorter sweep is one ci/bench runs: its --shape names a shape of the sweep file."""
    table = render.first_answer_table(settings.load_config())
    minutes = {
        row.split(" | ")[0].strip("| "): row.split(" | ")[1]
        for row in table.splitlines()
        if row.startswith("| ")
    }
    sequential = int(minutes["to a first answer, one step after another"].removesuffix(" min"))
    overlapped = int(
        minutes["the same with `docker compose build glm5` run during the download"].removesuffix(" min")
    )
    assert "a first answer in 1-2 hours on the minimum box" in " ".join(README.split())
    assert 60 <= overlapped <= sequential <= 120, (overlapped, sequential)
    hours = [
        float(re.search(r"\| ([\d.]+) h \|$", row)[1]) for row in table.splitlines() if row.endswith(" h |")
    ]  # type: ignore[index]
    whole, winner_alone = hours[0], hours[1]
    said = " ".join(README.split())
    assert (
        "lets the box decide" in said
        and "in about a day; `--shape 1k-1k-c1024` first takes a third of it" in said
    )
    assert 18 <= whole <= 30 and 0.25 <= winner_alone / whole <= 0.4, hours
    done = subprocess.run(
        [str(ROOT / "ci" / "bench"), "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )
    assert "--shape SHAPE" in done.stdout and "1k-1k-c1024" in (ROOT / "ci" / "sweep-sm120.toml").read_text()
