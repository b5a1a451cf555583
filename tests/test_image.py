"""The image, compose file and pod spec: the kit's rules over them as the real compose and kustomize read them, and the
image's pins against its lock. (The linters and validators run in ci/lint; that these files agree with
entrypoint/glm5.toml is ci/render's job: tests/test_render.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from configuration import settings
from conftest import ROOT
from helpers import k8s

BIN = Path(sys.executable).parent


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False, timeout=120)


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists() or shutil.which(name), f"{name} missing: run ci/setup-test-env"
    return str(path) if path.exists() else name


def test_compose_never_creates_the_model_folder(tmp_path: Path) -> None:
    """The short syntax makes a missing host folder, owned by root, which `download` (UID 1000) then cannot write.
    Read by the real compose: the weights are a long-syntax bind with create_host_path false, at GLM5_MODEL_HOST_DIR."""
    missing = tmp_path / "no such folder"
    done = subprocess.run(
        [tool("docker-compose"), "-f", "docker-compose.yml", "config", "--format", "json"],
        capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
        env=os.environ | {"GLM5_MODEL_HOST_DIR": str(missing)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    volumes = json.loads(done.stdout)["services"]["glm5"]["volumes"]
    (weights,) = [v for v in volumes if v["target"] == settings.resolve({})["model_dir"]]
    assert weights["type"] == "bind" and weights["source"] == str(missing)
    assert weights["bind"]["create_host_path"] is False
    assert not missing.exists()


def test_compose_runs_a_release_by_digest() -> None:
    """Install by version: GLM5_IMAGE=NAME@sha256:<digest> is valid for the real compose, and every service of the
    kit's image (the server, the download, the gateway) runs that digest; unset, the kit's own tag."""
    digest = "ghcr.io/example/glm5-serve@sha256:" + "5" * 64

    def images(env: dict[str, str]) -> dict[str, str]:
        done = subprocess.run(
            [tool("docker-compose"), "-f", "docker-compose.yml", "--profile", "*", "config", "--format", "json"],
            capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
            env={k: v for k, v in os.environ.items() if k != "GLM5_IMAGE"} | env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return {name: s["image"] for name, s in json.loads(done.stdout)["services"].items()}

    kit = {
        name for name, image in images({}).items() if image == settings.load_config()["deployment"]["image"]
    }
    assert {"glm5", "download", "gateway"} <= kit
    assert {name for name, image in images({"GLM5_IMAGE": digest}).items() if image == digest} == kit


def kustomized(folder: Path = ROOT / "k8s" / "base") -> str:
    return k8s.kustomized(folder)


def test_the_data_and_the_base_apply_these_objects() -> None:
    """What `kubectl apply -k k8s/data` and `-k k8s/base` apply, after kustomize (ci/lint validates them strictly)."""
    kinds = [
        d["kind"] for d in yaml.safe_load_all(kustomized(ROOT / "k8s" / "data") + "---\n" + kustomized())
    ]
    assert sorted(kinds) == [
        "ConfigMap",  # glm5-settings: the server pods' GLM5_* settings, the gateway's too
        "Job",
        "Namespace",
        *["NetworkPolicy"] * 3,
        "PersistentVolumeClaim",
        "Service",
        "StatefulSet",
    ]


KIT_FOLDERS = tuple(o.removeprefix("k8s/") for o in k8s.OVERLAYS)


def container_images(folder: Path) -> set[str]:
    """The image of every container and init container of every workload kustomize renders from FOLDER."""
    specs = [
        o["spec"]["template"]["spec"]
        for o in yaml.safe_load_all(kustomized(folder))
        if o and o["kind"] in ("Job", "StatefulSet", "Deployment")
    ]
    return {c["image"] for s in specs for c in s["containers"] + s.get("initContainers", [])}


@pytest.mark.boots
def test_kubernetes_image_is_one_place_that_every_overlay_follows(tmp_path: Path) -> None:
    """An `images:` entry rewrites only its own kustomization's objects: with one per overlay, a pushed image set in
    the base left the gateway Deployment on glm5-serve:0.1.0. The one place is k8s/components/image."""
    built = settings.load_config()["deployment"]["image"]
    for folder in KIT_FOLDERS:
        assert container_images(ROOT / "k8s" / folder) == {built}, folder
    copy = tmp_path / "k8s"
    shutil.copytree(ROOT / "k8s", copy)
    component = copy / "components" / "image" / "kustomization.yaml"
    text = component.read_text()
    assert "newName: glm5-serve" in text and 'newTag: "0.1.0"' in text
    component.write_text(
        text.replace("newName: glm5-serve", "newName: registry.example.com/ml/glm5-serve").replace(
            'newTag: "0.1.0"', 'newTag: "0.2.0"'
        )
    )
    for folder in KIT_FOLDERS:
        assert container_images(copy / folder) == {"registry.example.com/ml/glm5-serve:0.2.0"}, folder
    for folder in KIT_FOLDERS:  # and no other kustomization names the image
        assert "images:" not in (copy / folder / "kustomization.yaml").read_text(), folder


def checkout_copy(tmp_path: Path) -> Path:
    """The kit's tracked files in a folder of their own, for running a README step that edits the checkout."""
    copy = tmp_path / "kit"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in filter(None, listed.stdout.split("\0")):
        if (ROOT / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, copy / rel)
    return copy


def readme_image_step() -> str:
    """The README's Kubernetes step 1 command that sets the image: the line with `sed`, run as it is written."""
    (line,) = [
        ln.strip()
        for ln in (ROOT / "README.md").read_text().splitlines()
        if "entrypoint/glm5.toml && ci/render" in ln
    ]
    return line


@pytest.mark.boots
def test_the_readme_image_step_tags_every_container(tmp_path: Path) -> None:
    """Run as written, the step left every container on the pushed name with no tag (`:latest`, ImagePullBackOff):
    ci/render wrote the name into the resources, which the component's `images:` entry no longer matched."""
    copy = checkout_copy(tmp_path)
    step = readme_image_step()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", step], cwd=copy, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pushed = re.search(r'image = "([^"]+)"', step)
    assert pushed and pushed.group(1) == "registry.example.com/ml/glm5-serve:0.1.0"
    for folder in KIT_FOLDERS:
        assert container_images(copy / "k8s" / folder) == {pushed.group(1)}, folder
    check = subprocess.run(["ci/render", "--check"], cwd=copy, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


@pytest.mark.boots
def test_render_check_refuses_a_container_the_image_component_leaves_untagged(tmp_path: Path) -> None:
    copy = checkout_copy(tmp_path)
    job = copy / "k8s/base/job-weights.yaml"
    job.write_text(
        job.read_text().replace("image: glm5-serve ", "image: registry.example.com/ml/glm5-serve ", 1)
    )
    assert container_images(copy / "k8s/base") >= {
        "registry.example.com/ml/glm5-serve"
    }  # kustomize: untagged
    check = subprocess.run(["ci/render", "--check"], cwd=copy, capture_output=True, text=True, check=False)
    assert check.returncode == 1
    assert (
        "k8s/base/job-weights.yaml: image registry.example.com/ml/glm5-serve renders as "
        "registry.example.com/ml/glm5-serve (untagged: the cluster pulls :latest)" in check.stderr
    )


@pytest.mark.boots
def test_uninstalling_the_server_keeps_the_data() -> None:
    """`kubectl delete -k` deletes what the folder renders, and a deleted Namespace takes every object in it: so no
    server folder renders the Namespace or a claim, the cache claims outlive the StatefulSet, and k8s/data, which
    holds them, is deleted only by its own command."""
    data = {
        (o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(kustomized(ROOT / "k8s" / "data")) if o
    }
    assert data == {("Namespace", "glm5"), ("PersistentVolumeClaim", "glm5-weights")}
    for folder in KIT_FOLDERS:
        objects = [o for o in yaml.safe_load_all(kustomized(ROOT / "k8s" / folder)) if o]
        kinds = {o["kind"] for o in objects}
        assert not kinds & {"Namespace", "PersistentVolumeClaim"}, folder
        (statefulset,) = [o for o in objects if o["kind"] == "StatefulSet"]
        assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"] == {
            "whenDeleted": "Retain",
            "whenScaled": "Retain",
        }, folder


def test_weights_are_filled_by_a_job_and_read_only_to_the_server() -> None:
    objects = {o["kind"]: o for o in yaml.safe_load_all(kustomized())}
    job = objects["Job"]["spec"]["template"]["spec"]
    (download,) = job["containers"]
    assert download["args"] == ["download"]
    token = next(e for e in download["env"] if e["name"] == "HF_TOKEN")["valueFrom"]["secretKeyRef"]
    assert token["optional"] is True  # public repositories need no token
    pod = objects["StatefulSet"]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["args"] == ["/opt/glm5/entrypoint/download", "--wait"]
    for container in (init, pod["containers"][0]):
        mount = next(m for m in container["volumeMounts"] if m["name"] == "weights")
        assert mount["readOnly"] is True
    claim = next(
        o
        for o in yaml.safe_load_all(kustomized(ROOT / "k8s" / "data"))
        if o["metadata"]["name"] == "glm5-weights"
    )
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_image_pins_match_the_lock() -> None:
    """glm5.toml's [image] versions (rendered into the Dockerfile's ARGs and requirements.in) are what the
    hash lock installs: a pin changed without image/relock fails here, before the build."""
    pins = settings.load_config()["image"]
    lock = (ROOT / "image/requirements.lock").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package, key, arg in [
        ("sglang", "sglang", "SGLANG_VERSION"),
        ("torch", "torch", "TORCH_VERSION"),
        ("flashinfer-python", "flashinfer", "FLASHINFER_VERSION"),
        ("supervisor", "supervisor", "SUPERVISOR_VERSION"),
        ("smg", "smg", "SMG_VERSION"),
    ]:
        assert re.search(rf"^{package}=={re.escape(pins[key])} ", lock, re.M), (
            f"{package} in the lock is not {pins[key]}"
        )
        assert f"ARG {arg}={pins[key]}\n" in dockerfile
    assert "--hash=sha256:" in lock


def test_assert_versions_refuses_a_mismatch() -> None:
    ok = run("image/assert-versions", f"pytest=={__import__('pytest').__version__}")
    assert ok.returncode == 0, ok.stderr
    bad = run("image/assert-versions", "pytest==0.0.1", "no-such-package==1.0")
    assert bad.returncode == 1
    assert "pytest: the Dockerfile ARG says 0.0.1" in bad.stderr and "no-such-package" in bad.stderr


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().split()
    assert lines[lines.index("*")] == "*"
    copied = set(re.findall(r"^COPY (\S+)", (ROOT / "Dockerfile").read_text(), re.M))
    for src in copied:
        assert f"!{src}" in lines, f"{src} is copied but excluded from the context"


def test_the_workflows_run_the_readme_test_command_and_the_smoke_test() -> None:
    ci = (ROOT / ".github/workflows/ci.yml").read_text()
    assert "run: ci/test" in ci  # the README's test command (tests/test_workflows.py checks the rest)
    gpu = (ROOT / ".github/workflows/gpu-smoke.yml").read_text()
    assert "self-hosted" in gpu and "ci/smoke" in gpu and "docker compose build glm5" in gpu


def test_the_image_creates_the_folders_the_kit_writes() -> None:
    """The non-root server writes its log, state and caches: the Dockerfile makes them and gives them to the user."""
    values = settings.resolve({})
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    made = re.search(r"mkdir -p ([^&]+)&&", dockerfile)
    owned = re.search(r'chown -R "\$\{GLM5_UID\}:0" ([^&]+)&&', dockerfile)
    assert made and owned, "no mkdir/chown of the kit's folders in the Dockerfile"
    for key in ("log_dir", "state_dir", "cache_dir"):
        assert values[key] in made.group(1).split() and values[key] in owned.group(1).split(), key
    # the probe finds launch.json without glm5.toml
    assert f"GLM5_STATE_DIR={values['state_dir']}" in dockerfile


def apt_installs_without_noninteractive(dockerfile: str) -> list[str]:
    """Each `apt-get install` that could wait on a debconf prompt: neither its own command nor its stage sets
    DEBIAN_FRONTEND=noninteractive (tzdata, pulled by Ubuntu 24.04's python3.12, asks for a time zone)."""
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    found, stage_sets = [], False
    for line in joined.splitlines():
        words = line.strip().split(None, 1)
        if not words:
            continue
        keyword, rest = words[0].upper(), words[1] if len(words) > 1 else ""
        if keyword == "FROM":
            stage_sets = False
        elif keyword in ("ARG", "ENV") and re.search(r"\bDEBIAN_FRONTEND=noninteractive\b", rest):
            stage_sets = True
        elif keyword == "RUN":
            for command in re.split(r"&&|\|\||;|\|", rest):
                if re.search(r"\bapt(-get)?\s+(\S+\s+)*install\b", command) and not stage_sets:
                    if not re.match(r"\s*(\w+=\S*\s+)*DEBIAN_FRONTEND=noninteractive\s", command):
                        found.append(command.strip())
    return found


def test_no_apt_install_can_wait_on_a_prompt() -> None:
    assert apt_installs_without_noninteractive((ROOT / "Dockerfile").read_text()) == []


@pytest.mark.parametrize(
    "dockerfile",
    [
        "FROM x\nRUN apt-get update && apt-get install -y tzdata\n",
        "FROM x\nRUN DEBIAN_FRONTEND=noninteractive apt-get update && apt-get install -y tzdata\n",
        "FROM x\nARG DEBIAN_FRONTEND=noninteractive\nFROM y\nRUN apt-get install -y tzdata\n",
        "FROM x\nRUN apt-get update \\\n && apt-get -q install -y tzdata\n",
    ],
)
def test_the_prompt_rule_can_fail(dockerfile: str) -> None:
    assert len(apt_installs_without_noninteractive(dockerfile)) == 1


def test_one_cuda_compiler_deliberately() -> None:
    """Every run-time JIT finds nvcc through CUDA_HOME: the image sets it to the base's toolkit, whose release the
    FlashInfer override names, and installs the host compiler nvcc drives."""
    cfg = settings.load_config()
    toml_env = {e["name"]: e.get("value") for e in cfg["env"]}
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"CUDA_HOME={toml_env['CUDA_HOME']} " in dockerfile
    assert f"ARG CUDA_MAJOR_MINOR={cfg['image']['cuda_major_minor']}\n" in dockerfile
    assert "FLASHINFER_CUDA_VERSION=${CUDA_MAJOR_MINOR}" in dockerfile
    install = re.search(r"apt-get install ([^&]+)", dockerfile.replace("\\\n", " "))
    assert install and "g++" in install.group(1).split()


def test_jit_caches_are_keyed_by_the_image_build(tmp_path: Path) -> None:
    from configuration import config

    dev = config.resolve({"GLM5_HOME": str(tmp_path)})
    assert dev.env["SGLANG_CACHE_DIR"] == "/cache/build-dev/sglang"
    (tmp_path / "BUILD-ID").write_text("0123456789abcdef\n")
    built = config.resolve({"GLM5_HOME": str(tmp_path)})
    for name in ("SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "TVM_FFI_CACHE_DIR", "CUTE_DSL_CACHE_DIR"):
        assert built.env[name].startswith("/cache/build-0123456789abcdef/"), name
    assert "BUILD-ID" in (ROOT / "Dockerfile").read_text()
    # No image-level cache variable may outrank these defaults (the operator's environment wins over glm5.toml).
    for name in (
        "FLASHINFER_WORKSPACE_BASE",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "SGLANG_CACHE_DIR",
    ):
        assert f"{name}=" not in (ROOT / "Dockerfile").read_text(), name


@pytest.mark.boots
def test_every_jit_cache_follows_the_keyed_folder_in_real_sglang() -> None:
    """With the server's environment as launch sets it, the real sglang 0.5.23 points Triton, TorchInductor,
    CUDA's own, TileLang, FlashInfer and DeepGEMM under the build's folder on the cache volume (import sglang runs
    srt/environ.py redirect_third_party_caches; DeepGEMM follows SGLANG_DG_CACHE_DIR)."""
    from configuration import config

    env = config.resolve({}).env
    probe = (
        "import json, os, sglang\n"
        "from sglang.srt.environ import envs\n"
        "names = ('TRITON_CACHE_DIR', 'TORCHINDUCTOR_CACHE_DIR', 'CUDA_CACHE_PATH', 'TILELANG_CACHE_DIR',"
        " 'FLASHINFER_WORKSPACE_BASE')\n"
        "print(json.dumps({n: os.environ.get(n) for n in names} | {'DEEPGEMM': envs.SGLANG_DG_CACHE_DIR.get()}))\n"
    )
    clean = {
        k: v for k, v in os.environ.items() if not k.endswith(("_CACHE_DIR", "_CACHE_PATH", "WORKSPACE_BASE"))
    }
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=clean | env | {"PYTHONPATH": str(ROOT / "tests" / "stubs")},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found and all(v and v.startswith("/cache/build-dev/sglang") for v in found.values()), found


def gateway_launch(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLM5_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # the test venv's python3, with smg
    return subprocess.run(
        [str(ROOT / "gateway" / "launch"), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.boots
def test_the_gateway_overlay_runs_replicas_one_per_node_behind_the_gateway() -> None:
    built = kustomized(ROOT / "k8s" / "overlays" / "gateway")  # ci/lint validates it strictly
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(built)}
    sts = objects[("StatefulSet", "glm5")]["spec"]
    assert sts["replicas"] == settings.load_config()["gateway"]["replicas"] == 2
    affinity = sts["template"]["spec"]["affinity"]
    assert "nodeAffinity" in affinity  # the base's GPU node selection is kept
    (spread,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    # No rights at all: the rotation lists the pods through the headless Service's DNS, not the Kubernetes API.
    assert not any(k in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding") for k, _ in objects)
    pods = objects[("Service", settings.load_config()["gateway"]["pods_service"])]["spec"]
    assert pods["clusterIP"] == "None" and pods["publishNotReadyAddresses"] is True
    assert pods["selector"] == sts["selector"]["matchLabels"]
    assert objects[("PodDisruptionBudget", "glm5")]["spec"]["maxUnavailable"] == 1
    deploy = objects[("Deployment", "glm5-gateway")]["spec"]["template"]["spec"]
    (gw,) = deploy["containers"]
    assert (
        gw["image"] == settings.load_config()["deployment"]["image"]
        and deploy["serviceAccountName"] == "glm5-gateway"
    )
    assert not any("api-key" in a or "API_KEY=" in a for a in gw["args"])
    # The gateway's arguments, as the pod runs them, pass the pinned smg's own parser.
    argv = [a.replace("$(POD_NAMESPACE)", "glm5") for a in gw["args"][1:]]
    checked = gateway_launch(*argv, "--dry-run")
    assert checked.returncode == 0, checked.stderr
    assert "--priority-scheduler-enabled" in checked.stdout and "--policy cache_aware" in checked.stdout
    refused = gateway_launch(*argv, "--dry-run", "--", "--health-check-timeout-secs", "2.5")
    assert refused.returncode == 2 and "invalid int value: '2.5'" in refused.stderr


def test_the_compose_gateway_profile_is_valid_and_gpu_free() -> None:
    done = run(tool("docker-compose"), "-f", "docker-compose.yml", "--profile", "gateway", "config")
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    gw = services["gateway"]
    assert gw["profiles"] == ["gateway"] and "deploy" not in gw  # no GPU for the router
    assert gw["command"] == [
        "gateway",
        "--discovery-file",
        settings.load_config()["gateway"]["discovery_file"],
    ]
    hosts = settings.declarations()["GLM5_GATEWAY_HOST_PORT"].default
    assert int(hosts) == settings.load_config()["gateway"]["port"]
    plain = yaml.safe_load(run(tool("docker-compose"), "-f", "docker-compose.yml", "config").stdout)[
        "services"
    ]
    assert "gateway" not in plain  # only with the profile


def test_on_the_gateways_host_clients_reach_the_gateway_alone() -> None:
    """Issue 50: the gateway profile published this host's replica too, past the gateway's key and checks. With
    docker-compose.gateway.yml the replica publishes nothing; the gateway reaches it on the compose network."""
    pair = ("-f", "docker-compose.yml", "-f", "docker-compose.gateway.yml", "--profile", "gateway")
    done = run(tool("docker-compose"), *pair, "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert "ports" not in services["glm5"]
    assert [p["target"] for p in services["gateway"]["ports"]] == [settings.load_config()["gateway"]["port"]]
    plain = json.loads(
        run(tool("docker-compose"), "-f", "docker-compose.yml", "config", "--format", "json").stdout
    )
    assert plain["services"]["glm5"]["ports"], "the one-box quick start keeps its published port"
    local = json.loads((ROOT / "gateway" / "workers.example.json").read_text())["workers"][0]["url"]
    assert local == f"http://glm5:{settings.load_config()['deployment']['port']}"


def test_the_user_builds_base_is_named_by_digest() -> None:
    """A rebuild takes the same CUDA base: the Dockerfile's default BASE_IMAGE (glm5.toml [image].base_image) names
    its tag and a digest, so a re-pushed tag changes nothing until the digest is moved in review."""
    found = re.search(r"^ARG BASE_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert found and found.group(1) == settings.load_config()["image"]["base_image"]
    assert re.fullmatch(r"nvidia/cuda:[\w.-]+@sha256:[0-9a-f]{64}", found.group(1)), found.group(1)
