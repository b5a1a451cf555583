"""ci/render: every deployment value lives once in entrypoint/glm5.toml; the files that repeat it carry it in place,
marked, and ci/render rewrites or checks it. Each test renders a copy of the kit, so the checkout is never touched."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ci import render
from configuration import admission, layout
from conftest import ROOT

RENDER = ROOT / "ci" / "render"
SOURCE = ROOT / "entrypoint" / "glm5.toml"
YAML_MARKED = [rel for rel in render.MARKED if rel.endswith((".yml", ".yaml"))]


def kit_copy(tmp_path: Path) -> Path:
    """The source and every file ci/render keeps, in a folder of their own (with a space in its name)."""
    root = tmp_path / "kit copy"
    for rel in [render.SOURCE, *render.MARKED, *render.GENERATED, render.DASHBOARD, *render.DOCUMENTS]:
        src, dst = ROOT / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    return root


def set_source(root: Path, old: str, new: str) -> None:
    path = root / "entrypoint" / "glm5.toml"
    text = path.read_text()
    assert re.search(rf"^{re.escape(old)}", text, re.M), old
    path.write_text(re.sub(rf"^{re.escape(old)}", new, text, count=1, flags=re.M))


def rendered_with(tmp_path: Path, *changes: tuple[str, str]) -> tuple[Path, dict, dict]:  # type: ignore[type-arg]
    """A kit copy with these source lines changed and rendered: (root, compose service, pod)."""
    root = kit_copy(tmp_path)
    for old, new in changes:
        set_source(root, old, new)
    assert run_render(root).returncode == 0
    return root, compose(root), pod(root)


def run_render(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RENDER), "--root", str(root), *args], capture_output=True, text=True, check=False, timeout=120
    )


def pod(root: Path) -> dict:  # type: ignore[type-arg]
    statefulset = yaml.safe_load((root / "k8s/base/statefulset.yaml").read_text())
    return statefulset["spec"]["template"]  # type: ignore[no-any-return]


def compose(root: Path) -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["glm5"]  # type: ignore[no-any-return]


@pytest.mark.boots
def test_the_checkout_is_current() -> None:
    done = subprocess.run([str(RENDER), "--check"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def marked_lines(text: str) -> Iterator[int]:
    """Indexes of the lines a marker rewrites."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        content, marker, _ = line.partition(render.MARKER)
        if marker:
            yield i if content.strip() else i + 1


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)
    elif isinstance(node, str):
        yield node


def test_every_marked_file_has_markers_and_no_template_is_left() -> None:
    for rel in render.MARKED:
        assert list(marked_lines((ROOT / rel).read_text())), rel
    assert not (ROOT / "ci" / "templates").exists()


@pytest.mark.parametrize("rel", YAML_MARKED)
def test_no_marker_hides_inside_a_yaml_value(rel: str) -> None:
    """In a block scalar (`expr: |`) a `#` is text, not a comment: the marker would ship in the value (PromQL)."""
    for doc in yaml.safe_load_all((ROOT / rel).read_text()):
        for text in strings(doc):
            assert "ci/render" not in text, f"{rel}: {text!r}"


def make_stale(path: Path, rel: str) -> None:
    """Edit REL by hand where the renderer owns it."""
    text = path.read_text()
    if rel in render.DOCUMENTS:  # only the generated blocks are the renderer's: change one of their lines
        block = text.split("<!-- ci/render: ", 1)[1].split("\n", 1)[1]  # the first generated block's lines
        table_line = next(line for line in block.splitlines() if line.startswith("| ") and "---" not in line)
        path.write_text(text.replace(table_line, table_line + " changed", 1))
    elif rel in render.MARKED:  # a marked value edited by hand, on the first line a marker rewrites
        lines = text.split("\n")
        i = next(marked_lines(text))
        form = (lines[i] if render.MARKER in lines[i] else lines[i - 1]).partition(render.MARKER)[2].strip()
        body = lines[i].partition(render.MARKER)[0].rstrip()
        match = render.form_pattern(form).search(body)
        assert match, (rel, lines[i])
        lines[i] = lines[i].replace(body, body[: match.start()] + render.NAME.sub("edited", form), 1)
        path.write_text("\n".join(lines))
    else:
        path.write_text(text.replace("1", "2", 1) + "\n")
    assert path.read_text() != text, rel


@pytest.mark.boots
def test_check_names_every_stale_file_and_render_rewrites_only_what_it_owns(tmp_path: Path) -> None:
    """Every file the renderer keeps, each edited by hand at once (one run of each step, not one a file: the
    renderer reads them all on every run): --check names each, and a render puts each back, every other line as
    it was."""
    root = kit_copy(tmp_path)
    assert run_render(root, "--check").returncode == 0
    kept = [*render.MARKED, *render.GENERATED, *render.DOCUMENTS]
    before = {rel: (root / rel).read_text() for rel in kept}
    for rel in kept:
        make_stale(root / rel, rel)
    done = run_render(root, "--check")
    unnamed = [rel for rel in kept if f"stale: {rel}" not in done.stderr]
    assert done.returncode == 1 and unnamed == [], done.stderr
    assert run_render(root).returncode == 0
    assert run_render(root, "--check").returncode == 0
    assert [rel for rel in kept if (root / rel).read_text() != before[rel]] == []


@pytest.mark.parametrize("port", [8080, 31000, 40123])
@pytest.mark.boots
def test_the_port_is_one_edit(tmp_path: Path, port: int) -> None:
    root = kit_copy(tmp_path)
    set_source(root, "port = 30000", f"port = {port}")
    assert run_render(root, "--check").returncode == 1
    assert run_render(root).returncode == 0
    c, p = compose(root), pod(root)
    assert (
        c["ports"][0] == f"${{GLM5_BIND:-127.0.0.1}}:${{GLM5_HOST_PORT:-{port}}}:{port}"
    )  # then the exporter's
    assert p["spec"]["containers"][0]["ports"][0]["containerPort"] == port
    assert yaml.safe_load((root / "k8s/base/service.yaml").read_text())["spec"]["ports"][0]["port"] == port
    assert re.search(rf"\nEXPOSE {port} \d+\n", (root / "Dockerfile").read_text())  # and the exporter's port
    assert f"| `--port` | `{port}` |" in (root / render.REFERENCE).read_text()
    for rel in [*render.MARKED, *render.GENERATED]:
        assert "30000" not in (root / rel).read_text(), f"{rel} still says 30000"


@pytest.mark.boots
def test_readme_prose_is_not_the_renderers(tmp_path: Path) -> None:
    root = kit_copy(tmp_path)
    readme = root / render.README
    readme.write_text(readme.read_text() + "\nA hand-written note.\n")
    assert run_render(root, "--check").returncode == 0


@pytest.mark.boots
def test_derived_values_are_computed(tmp_path: Path) -> None:
    root, c, p = rendered_with(
        tmp_path,
        ("drain_seconds = 1800", "drain_seconds = 3000"),
        ("startup_budget_seconds = 2400", "startup_budget_seconds = 3005"),
    )
    assert c["stop_grace_period"] == "3030s"  # drain + the 30 s margin
    assert p["spec"]["terminationGracePeriodSeconds"] == 3045  # preStop 15 + stop grace
    assert c["healthcheck"]["start_period"] == "3005s"
    assert "--start-period=3005s" in (root / "Dockerfile").read_text()


@pytest.mark.boots
def test_gpu_count_and_image_follow_the_source(tmp_path: Path) -> None:
    root, c, p = rendered_with(
        tmp_path,
        ('image = "glm5-serve:0.1.0"', 'image = "registry.example/glm5-serve:0.2.0"'),
        ("gpu_count = 8", "gpu_count = 4"),
    )
    assert c["image"] == "${GLM5_IMAGE:-registry.example/glm5-serve:0.2.0}"  # compose: GLM5_IMAGE in .env
    assert p["spec"]["containers"][0]["image"] == "glm5-serve"  # the name k8s/components/image rewrites
    component = yaml.safe_load((root / render.IMAGE_COMPONENT).read_text())["images"]
    assert component == [{"name": "glm5-serve", "newName": "registry.example/glm5-serve", "newTag": "0.2.0"}]
    assert c["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["0", "1", "2", "3"]
    assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4


DIGEST = "sha256:" + "5" * 64


@pytest.mark.boots
def test_an_image_by_digest_renders_by_digest(tmp_path: Path) -> None:
    """A published release by digest: compose runs NAME:VERSION@DIGEST, kustomize renders NAME@DIGEST (newTag gives
    way to digest), and the version stays the tag's."""
    image = f"ghcr.io/example/glm5-serve:0.2.0@{DIGEST}"
    root, c, _ = rendered_with(tmp_path, ('image = "glm5-serve:0.1.0"', f'image = "{image}"'))
    assert c["image"] == f"${{GLM5_IMAGE:-{image}}}"
    component = yaml.safe_load((root / render.IMAGE_COMPONENT).read_text())["images"]
    assert component == [{"name": "glm5-serve", "newName": "ghcr.io/example/glm5-serve", "digest": DIGEST}]
    assert 'version = "0.2.0"' in (root / "pyproject.toml").read_text()
    assert run_render(root, "--check").returncode == 0


@pytest.mark.parametrize(
    ("image", "named"),
    [
        ("glm5-serve", "has no tag: write NAME:TAG"),
        (f"glm5-serve@{DIGEST}", "has no tag: write NAME:TAG"),
        ("glm5-serve:0.1.0@sha256:abc", "is not a digest: write NAME:VERSION@sha256:<64 hex digits>"),
        ("glm5-serve:latest", "its tag 'latest' is the kit's version: write MAJOR.MINOR.PATCH"),
    ],
)
def test_an_image_without_a_version_or_with_a_bad_digest_is_refused(image: str, named: str) -> None:
    with pytest.raises(render.RenderError, match=re.escape(named)):
        render.image_values(image)


def test_the_version_has_one_source(tmp_path: Path) -> None:
    """pyproject.toml's version is [deployment].image's tag: edited by hand, ci/render --check names it stale."""
    root = kit_copy(tmp_path)
    path = root / "pyproject.toml"
    path.write_text(path.read_text().replace('version = "0.1.0"', 'version = "0.1.1"', 1))
    done = run_render(root, "--check")
    assert done.returncode == 1 and "stale: pyproject.toml" in done.stderr
    tag = render.values(render.settings.load_config())["version"]
    assert f'version = "{tag}"' in (ROOT / "pyproject.toml").read_text()


def test_the_rendered_files_keep_their_rules() -> None:
    """What the templates promise, read from the rendered checkout: loopback by default, liveness is the
    probe with --live, the API key comes from a required Secret, probes outlast /health's timeout."""
    cfg = render.settings.load_config()
    found = render.values(cfg)
    c, p = compose(ROOT), pod(ROOT)
    container = p["spec"]["containers"][0]
    assert c["ports"][0].startswith("${GLM5_BIND:-127.0.0.1}:")
    assert container["livenessProbe"]["exec"]["command"][-2:] == ["--live", "--status"]
    assert "startupProbe" not in container  # no threshold ends a start that keeps making progress
    assert c["healthcheck"]["test"][1:] == container["readinessProbe"]["exec"]["command"]
    key_file = {e["name"]: e.get("value") for e in container["env"]}["GLM5_API_KEY_FILE"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    secret = {v["name"]: v for v in p["spec"]["volumes"]}[mounts[str(Path(key_file).parent)]]["secret"]
    assert secret["optional"] is False
    assert found["probe_command_timeout_seconds"] > found["health_timeout_seconds"]
    # The state dir holds the server's private config file (the API key): memory only, in both.
    assert [m for m in c["tmpfs"] if m.split(":")[0] == found["state_dir"]]
    run = [m["name"] for m in container["volumeMounts"] if m["mountPath"] == found["state_dir"]]
    assert run and {v["name"]: v for v in p["spec"]["volumes"]}[run[0]]["emptyDir"]["medium"] == "Memory"


def test_an_unknown_value_in_a_marker_is_refused(tmp_path: Path) -> None:
    root = kit_copy(tmp_path)
    path = root / "k8s/base/service.yaml"
    path.write_text(path.read_text().replace("  # ci/render: {port}", "  # ci/render: {no_such_value}", 1))
    done = run_render(root)
    assert done.returncode == 1 and "unknown value(s) no_such_value" in done.stderr, done.stderr


def test_a_line_that_no_longer_reads_as_its_form_is_refused(tmp_path: Path) -> None:
    """A hand edit that breaks the line's form is named with its place, not overwritten."""
    root = kit_copy(tmp_path)
    path = root / "monitoring/prometheus/prometheus.yml"
    before = path.read_text()
    path.write_text(before.replace('["glm5:30000"]', '["server:30000"]', 1))
    done = run_render(root)
    assert done.returncode == 1, done.stderr
    assert re.search(r"monitoring/prometheus/prometheus\.yml:\d+: .*does not end in the form", done.stderr)


def test_a_marker_without_a_line_below_or_a_value_is_refused() -> None:
    found = {"port": 30000}
    with pytest.raises(render.RenderError, match="no line below"):
        render.rewrite("a: 1\n# ci/render: {port}", found, "x")
    with pytest.raises(render.RenderError, match="names no value"):
        render.rewrite("a: 1  # ci/render: 1", found, "x")
    with pytest.raises(render.RenderError, match="no `# ci/render: FORM` marker left"):
        render.rewrite("a: 1\n", found, "x")
    with pytest.raises(render.RenderError, match="has a blank"):
        render.rewrite("a: 1  # ci/render: {port}", {"port": "3 0"}, "x")
    assert render.rewrite("EXPOSE 1 2\n# ci/render: --x={port}s \\\nRUN --x=5s \\", found, "x").endswith(
        "--x=30000s \\"
    )


def test_an_invalid_source_renders_nothing(tmp_path: Path) -> None:
    root = kit_copy(tmp_path)
    set_source(root, "stop_margin_seconds = 30", "stop_margin_seconds = 0")
    before = {rel: (root / rel).read_text() for rel in render.MARKED}
    done = run_render(root)
    assert done.returncode == 1 and "stop_margin_seconds = 0" in done.stderr
    assert before == {rel: (root / rel).read_text() for rel in render.MARKED}  # nothing was written


@pytest.mark.boots
def test_rendered_compose_and_pod_still_validate(tmp_path: Path) -> None:
    root = kit_copy(tmp_path)
    set_source(root, "port = 30000", "port = 8080")
    assert run_render(root).returncode == 0
    bin_dir = Path(shutil.which("kubernetes-validate") or "kubernetes-validate").parent
    for argv in (
        [
            "kubernetes-validate",
            "--strict",
            "-k",
            "1.30",
            *map(
                str,
                sorted(
                    p
                    for p in root.glob("k8s/**/*.yaml")
                    if p.name != "kustomization.yaml" and p not in patch_files(root)
                ),
            ),
        ],
        ["docker-compose", "-f", str(root / "docker-compose.yml"), "config", "-q"],
    ):
        done = subprocess.run(
            [str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True, check=False, cwd=root
        )
        assert done.returncode == 0, done.stdout + done.stderr


def patch_files(root: Path) -> set[Path]:
    """The partial objects that kustomizations patch with (no selector, no spec of their own: not valid alone)."""
    found = set()
    for k in root.glob("k8s/**/kustomization.yaml"):
        for patch in yaml.safe_load(k.read_text()).get("patches", []):
            if "path" in patch:
                found.add(k.parent / patch["path"])
    return found


def test_a_value_changes_with_the_system_python_alone(tmp_path: Path) -> None:
    """No site-packages at all (-S): ci/render still checks and rewrites; the dashboard is ci/render-dashboard's."""
    root = kit_copy(tmp_path)
    set_source(root, "drain_seconds = 1800", "drain_seconds = 2000")
    python = Path(sys.base_prefix) / "bin" / "python3"

    def bare(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), "-S", "-m", "ci.render", "--root", str(root), *args],
            capture_output=True, text=True, check=False, timeout=120, cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
        )  # fmt: skip

    stale = bare("--check")
    assert stale.returncode == 1 and "stale: docker-compose.yml" in stale.stderr, stale.stderr
    assert bare().returncode == 0 and bare("--check").returncode == 0
    assert compose(root)["stop_grace_period"] == "2030s"


def test_the_image_folders_and_user_written_by_hand_match_glm5_toml() -> None:
    """The values no operator changes carry no marker: each place that names one agrees with glm5.toml."""
    v = render.values(render.settings.load_config())
    dockerfile = (ROOT / "Dockerfile").read_text()
    for line in (
        f"ARG GLM5_UID={v['uid']}",
        f"GLM5_HOME={v['home']} ",
        f"GLM5_STATE_DIR={v['state_dir']} ",
        f"HOME={v['home_dir']} ",
        f"XDG_CACHE_HOME={v['cache_dir']} ",
        f"mkdir -p {v['cache_dir']} {v['model_dir']} {v['log_dir']} {v['state_dir']} ",
        f'ENTRYPOINT ["{v["home"]}/entrypoint/entrypoint.sh"]',
        f"CMD {v['readiness_command_json']}",
    ):
        assert line in dockerfile, line
    folders = {
        v[k]
        for k in (
            "model_dir",
            "cache_dir",
            "state_dir",
            "log_dir",
            "home_dir",
            "api_key_dir",
            "admin_api_key_dir",
        )
    }
    p = pod(ROOT)
    (container,) = p["spec"]["containers"]
    assert folders == {m["mountPath"] for m in container["volumeMounts"]} - {"/dev/shm", "/tmp"}
    assert p["spec"]["securityContext"]["runAsUser"] == v["uid"]
    for probe, want in (
        ("readinessProbe", "readiness_command_json"),
        ("livenessProbe", "liveness_command_json"),
    ):
        assert container[probe]["exec"]["command"] == yaml.safe_load(v[want]), probe
    c = compose(ROOT)
    assert c["healthcheck"]["test"] == yaml.safe_load(v["compose_readiness_json"])
    targets = {m["target"] if isinstance(m, dict) else m.rsplit(":", 1)[1] for m in c["volumes"]}
    assert targets == {v["model_dir"], v["cache_dir"], v["log_dir"]}
    assert {m.split(":")[0] for m in c["tmpfs"]} >= {v["state_dir"], v["home_dir"]}
    assert all(
        f"uid={v['uid']}," in m for m in c["tmpfs"] if m.split(":")[0] in (v["state_dir"], v["home_dir"])
    )
    job = yaml.safe_load((ROOT / "k8s/base/job-weights.yaml").read_text())["spec"]["template"]["spec"]
    assert job["securityContext"]["runAsUser"] == v["uid"]
    assert v["model_dir"] in {m["mountPath"] for c in job["containers"] for m in c["volumeMounts"]}
    gateway = [
        d
        for d in yaml.safe_load_all((ROOT / "k8s/overlays/gateway/gateway.yaml").read_text())
        if d and d["kind"] == "Deployment"
    ]
    assert gateway[0]["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == v["uid"]


@pytest.mark.parametrize(
    ("source", "bad", "said"),
    [
        ("max_replicas = 4", "max_replicas = 1", "1 <= min_replicas <= max_replicas"),
        (
            "target_utilization = 0.8",
            "target_utilization = 1.5",
            "above 0 and at most 1, of a replica's admitted capacity",
        ),
        ("scale_up_period_seconds = 1800", "scale_up_period_seconds = 3600", "1 to 1800"),
        ("scale_down_window_seconds = 1800", "scale_down_window_seconds = 7200", "0 to 3600"),
    ],
)
def test_autoscaling_bounds_the_hpa_refuses_are_refused_by_the_render(
    tmp_path: Path, source: str, bad: str, said: str
) -> None:
    root = kit_copy(tmp_path)
    set_source(root, source, bad)
    done = run_render(root)
    assert done.returncode == 1 and said in done.stderr and bad.split(" = ")[0] in done.stderr


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "drain_seconds = 1800",
            "drain_seconds = 120",
            "drain_seconds = 120 is under [gateway] request_timeout_seconds",
        ),
        (
            "shutdown_grace_seconds = 1800",
            "shutdown_grace_seconds = 120",
            "shutdown_grace_seconds = 120 is under",
        ),
        (
            "request_timeout_seconds = 1800",
            "request_timeout_seconds = 3600",
            "request_timeout_seconds = 3600",
        ),
    ],
)
def test_the_drain_covers_the_longest_answer_the_gateway_admits(
    tmp_path: Path, old: str, new: str, said: str
) -> None:
    """A replica's drain and a gateway's own both last at least smg's request timeout, the longest answer it lets run:
    a replacement cuts no answer. Bounds that drift apart are refused, naming the fix."""
    config_now = tomllib.loads((ROOT / "entrypoint" / "glm5.toml").read_text())
    assert not admission.drift(config_now, layout.default_pool(config_now))
    root = kit_copy(tmp_path)
    set_source(root, old, new)
    done = run_render(root)
    assert done.returncode == 1 and said in done.stderr, done.stderr


def test_a_digest_line_added_by_hand_to_the_image_component_is_refused_naming_itself(tmp_path: Path) -> None:
    """The audit's step (12-07, E): `digest: sha256:...` appended to k8s/components/image as the README then said.
    ci/render and --check refuse it, naming that file and line and glm5.toml's form, and write nothing."""
    root = kit_copy(tmp_path)
    component = root / render.IMAGE_COMPONENT
    before = component.read_text()
    component.write_text(before.rstrip("\n") + f"\n    digest: {DIGEST}\n")
    lines = len(component.read_text().splitlines())
    for args in ((), ("--check",)):
        done = run_render(root, *args)
        assert done.returncode == 1, done.stdout
        assert f"{render.IMAGE_COMPONENT}:{lines}: `digest: {DIGEST}` is not ci/render's" in done.stderr
        assert 'image = "NAME:TAG@sha256:<64 hex>"' in done.stderr and "ci/render: wrote" not in done.stdout


def test_the_readmes_digest_pin_renders(tmp_path: Path) -> None:
    """What the README says to write to pin the Kubernetes image by digest, done in a kit copy with a real digest:
    ci/render accepts it and kustomize renders every container at NAME@DIGEST."""
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"Pin the image by digest[^`]*`([^`]+)` in `([^`]+)`", readme)
    assert said is not None, "the README no longer says how to pin the image by digest"
    pin, where = said[1], said[2]
    root = kit_copy(tmp_path)
    image = f"registry.example.com/ml/glm5-serve:0.1.0@{DIGEST}"
    if where == render.SOURCE:
        assert pin == 'image = "NAME:TAG@sha256:..."', pin
        set_source(root, 'image = "glm5-serve:0.1.0"', f'image = "{image}"')
    else:  # a line to add to a file of the kit, as written
        path = root / where
        path.write_text(path.read_text().rstrip("\n") + "\n    " + pin.replace("sha256:...", DIGEST) + "\n")
    done = run_render(root)
    assert done.returncode == 0, done.stderr
    assert run_render(root, "--check").returncode == 0
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(root / "k8s" / "base")], capture_output=True, text=True, check=False
    )
    assert rendered.returncode == 0, rendered.stderr
    images = {c["image"] for d in yaml.safe_load_all(rendered.stdout) if d for c in containers_of(d)}
    assert images == {f"registry.example.com/ml/glm5-serve@{DIGEST}"}, images


def containers_of(obj: dict) -> list[dict]:  # type: ignore[type-arg]
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return [*spec.get("initContainers", []), *spec.get("containers", [])]
