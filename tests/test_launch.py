"""The baked configuration and entrypoint/launch, checked with the real sglang 0.5.23 parser."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from common.report import FAILURE, Problems
from configuration import batch_sizes, config, layout, settings, state
from conftest import ROOT, kit_env
from entrypoint import relay
from helpers import oracles

LAUNCH = ROOT / "entrypoint" / "launch"


def launch(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = kit_env(**env)
    return subprocess.run([str(LAUNCH), *args], capture_output=True, text=True, env=full, check=False)


def oracle(request: dict[str, Any]) -> dict[str, Any]:
    """Run the real sglang parser and batch-size rule in a subprocess (triton stubbed)."""
    return oracles.ask(ROOT / "tests/helpers/sglang_oracle.py", request)


def server_args(argv: list[str]) -> list[str]:
    assert argv[: len(config.SERVER_PROGRAM)] == list(config.SERVER_PROGRAM)
    return argv[len(config.SERVER_PROGRAM) :]


SETTINGS = [
    {},
    {"GLM5_CUDA_GRAPH_MAX_BS_DECODE": "256"},
    {"GLM5_CUDA_GRAPH_MAX_BS_DECODE": "1024"},
    {"GLM5_CUDA_GRAPH_MAX_BS_DECODE": "500"},
    {"GLM5_SPECULATIVE": "mtp"},
    {"GLM5_SPECULATIVE": "mtp", "GLM5_MAX_RUNNING_REQUESTS": "300"},
    {"GLM5_KV_CACHE_DTYPE": "bf16", "GLM5_MEM_FRACTION_STATIC": "0.85", "GLM5_MAX_RUNNING_REQUESTS": "128"},
    {
        "GLM5_EXTRA_ARGS": "--enable-torch-compile --torch-compile-max-bs 16",
        "GLM5_API_KEY": "s3cret-0123456789abcdef",
    },
    {"GLM5_PROFILE": "throughput"},
    {
        "GLM5_PROFILE": "throughput",
        "GLM5_ATTN_DP_SIZE": "8",
        "GLM5_MEM_FRACTION_STATIC": "0.80",
    },  # else refused
    {"GLM5_PROFILE": "throughput", "GLM5_ATTN_DP_SIZE": "2", "GLM5_MAX_RUNNING_REQUESTS": "256"},
    {"GLM5_PROFILE": "throughput", "GLM5_ATTN_DP_SIZE": "4", "GLM5_SPECULATIVE": "mtp"},
    {
        "GLM5_PROFILE": "throughput",
        "GLM5_CUDA_GRAPH_MAX_BS_DECODE": "500",
        "GLM5_MAX_RUNNING_REQUESTS": "1000",
    },
]


def rank_tokens(effective: config.Effective) -> int:
    """A rank's KV pool in tokens, as the layout's arithmetic has it (what SGLang sizes its request pool from; TP
    attention: the pool at the defaults)."""
    options = {o.attn_dp_size: o.pool_tokens for o in effective.layout.options}
    if effective.layout.attn_dp_size in options:
        return options[effective.layout.attn_dp_size]
    return layout.default_pool(settings.load_config())


@pytest.fixture(scope="module")
def rendered() -> list[config.Effective]:
    return [config.resolve(env) for env in SETTINGS]


KEY = "s3cret-0123456789abcdef"


@pytest.fixture(scope="module")
def key_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GLM5_STATE_DIR of a start with a key, its private config file written (the module's oracle run parses the
    command line that names it)."""
    folder = tmp_path_factory.mktemp("key-state")
    effective = config.resolve({"GLM5_API_KEY": KEY, "GLM5_STATE_DIR": str(folder)})
    state.write_server_config(folder, effective.secret_options)
    return folder


def removed_flag_argvs() -> list[list[str]]:
    return [["--model-path", "/m", flag, "8"] for flag in settings.load_config()["removed_flag"]]


def capture_request(e: config.Effective) -> list[Any]:
    """What the oracles take of a start to compute its capture lists: SGLang's argv, the decode cap, a rank's tokens."""
    max_bs = batch_sizes.effective_decode_max_bs(
        e.values["cuda_graph_max_bs_decode"],
        e.values["speculative"] != "off",
        e.values["max_running_requests"],
    )
    return [server_args(e.public_argv()), max_bs, rank_tokens(e)]


@pytest.fixture(scope="module")
def real(rendered: list[config.Effective], key_folder: Path) -> dict[str, Any]:
    """The module's one oracle run (sglang imported once: about 5 CPU-seconds): SETTINGS' argvs ("parse"), the
    removed flags ("removed"), the command line with the key's config file ("key")."""
    removed = removed_flag_argvs()
    keyed = config.resolve({"GLM5_API_KEY": KEY, "GLM5_STATE_DIR": str(key_folder)})
    found = oracle(
        {
            "argvs": [
                *[server_args(e.public_argv()) for e in rendered],  # --config's file exists only at --serve
                *removed,
                server_args(keyed.argv),
            ],
            "capture": [
                # the last, 8192, unread: the prefill shapes are held to SGLang's own resolution (RESOLVED below)
                [*capture_request(e), 8192]
                for e in rendered
            ],
            "dsa": [*DSA_SETS.values(), DSA_REFUSED],
        }
    )
    parsed = found["parse"]
    assert len(parsed) == len(SETTINGS) + len(removed) + 1
    return found | {
        "parse": parsed[: len(SETTINGS)],
        "removed": parsed[len(SETTINGS) : -1],
        "key": parsed[-1:],
    }


@pytest.mark.xdist_group("sglang_oracle")  # the module's one oracle run, on one worker
@pytest.mark.boots
def test_dry_run_json_passes_the_real_sglang_parser(real: dict[str, Any]) -> None:
    """The dry run's argv is the baked configuration's, which the module's oracle run parsed (SETTINGS[0])."""
    done = launch("--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    # the operator's key (random while GLM5_ADMIN_API_KEY is unset) is always a secret option: --config names its file
    assert argv[-2] == config.CONFIG_FLAG and argv[-1].endswith("/server-config.yaml")
    assert argv[:-2] == config.resolve({}).public_argv() and SETTINGS[0] == {}
    assert real["parse"][0] == {"ok": True, "error": ""}
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "512"
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "breakable"


@pytest.mark.xdist_group("sglang_oracle")  # the module's one oracle run, on one worker
@pytest.mark.boots
def test_every_setting_passes_the_real_parser(real: dict[str, Any]) -> None:
    assert [p["ok"] for p in real["parse"]] == [True] * len(SETTINGS), real["parse"]


@pytest.mark.xdist_group("sglang_oracle")  # the module's one oracle run, on one worker
@pytest.mark.boots
def test_capture_lists_match_sglangs_rule(rendered: list[config.Effective], real: dict[str, Any]) -> None:
    """The decode batches every rank captures, TP or DP attention: the list SGLang configures, then clamped to the
    rank's request pool and aligned to its attention-TP size by 0.5.23's own functions (tests/helpers/sglang_oracle.py
    capture). The prefill shapes: test_the_expected_prefill_shapes_are_what_sglangs_resolution_settles."""
    for env, effective, found in zip(SETTINGS, rendered, real["capture"], strict=True):
        assert effective.decode_sizes == found["decode"], env
    dp2 = rendered[SETTINGS.index({"GLM5_PROFILE": "throughput", "GLM5_ATTN_DP_SIZE": "2",
                                   "GLM5_MAX_RUNNING_REQUESTS": "256"})]  # fmt: skip
    assert (
        dp2.decode_sizes[0] == 4 and dp2.decode_sizes[-1] == 128
    )  # aligned to 4 GPUs, 256 split over 2 groups


# Both profiles and every attention-DP size the throughput profile chooses from ([layout].attn_dp_sizes).
def runnable(env: dict[str, str]) -> bool:
    """The kit starts it: a size whose estimated KV cache is none is refused (configuration/layout.py)."""
    try:
        config.resolve(env)
    except Problems:
        return False
    return True


RESOLVED = [{}, {"GLM5_SPECULATIVE": "mtp"}] + [
    env
    for d in settings.load_config()["layout"]["attn_dp_sizes"]
    if runnable(env := {"GLM5_PROFILE": "throughput", "GLM5_ATTN_DP_SIZE": str(d)})
]


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[config.Effective, dict[str, Any]]]:
    """What SGLang 0.5.23's own resolution settles for the kit's argv, the checkpoint's config as the model folder
    (tests/helpers/sglang_resolution_oracle.py, about 5 CPU-seconds each)."""
    model = tmp_path_factory.mktemp("glm5-config")
    for name in ("config.json", "hf_quant_config.json"):
        (model / name).write_bytes((ROOT / "tests" / "fixtures" / "glm5-config" / name).read_bytes())
    effective = [config.resolve(env) for env in RESOLVED]
    found = oracles.ask(
        ROOT / "tests" / "helpers" / "sglang_resolution_oracle.py",
        {
            "model": str(model),
            "resolve": [capture_request(e) for e in effective],
        },
        python=str(ROOT / ".venv-sglang-cpu" / "bin" / "python"),
        env={"PYTHONPATH": str(ROOT / "tests" / "stubs" / "sglang_cpu"), "SGLANG_USE_CPU_ENGINE": "1"},
    )
    return list(zip(effective, found["resolve"], strict=True))


@pytest.mark.xdist_group("sglang_resolution")
@pytest.mark.boots
def test_the_expected_prefill_shapes_are_what_sglangs_resolution_settles(
    resolved: list[tuple[config.Effective, dict[str, Any]]],
) -> None:
    """Issue 52: under --attn-dp-size D, 0.5.23 divides the chunk by D and re-clamps the prefill capture list to it
    (srt/arg_groups/parallel_hook.py:327-360): at D=4 it captures 42 shapes where the kit expected 58, and every
    throughput start ended prefill_short. The expectation now follows the resolution, for every profile and D."""
    for (effective, found), env in zip(resolved, RESOLVED, strict=True):
        groups = effective.layout.attn_dp_size
        assert found["chunk"] == 8192 // groups, env
        assert effective.prefill_sizes == found["prefill"], env
        assert effective.prefill_sizes[-1] == min(8192, found["chunk"]), env
    by_groups = {e.layout.attn_dp_size: len(e.prefill_sizes) for e, _ in resolved}
    assert by_groups[1] == 58 and by_groups[4] == 42  # the audit's figures (start-audit F1)


def test_baked_default_expects_52_decode_and_58_prefill_sizes() -> None:
    state = config.resolve({}).state({})
    assert state["decode_expected"] == 52
    assert state["prefill_expected"] == 58
    assert config.resolve({"GLM5_SPECULATIVE": "mtp"}).state({})["decode_expected"] == 23


def test_dry_run_prints_a_shell_command_and_redacts_the_key() -> None:
    done = launch("--dry-run", GLM5_API_KEY="s3cret-0123456789abcdef", GLM5_STATE_DIR="/run/glm5")
    assert done.returncode == 0
    assert done.stdout.startswith("python3 -m sglang.launch_server --model-path /models/GLM-5-NVFP4 ")
    assert "s3cret-0123456789abcdef" not in done.stdout and "--api-key" not in done.stdout
    assert "--config /run/glm5/server-config.yaml" in done.stdout
    assert not Path("/run/glm5/server-config.yaml").exists()  # a dry run touches nothing


def test_no_sm120_incompatible_backend_is_baked() -> None:
    argv = " ".join(config.resolve({}).argv + config.resolve({"GLM5_KV_CACHE_DTYPE": "bf16"}).argv)
    for bad in ("trtllm", "flashmla", "fa3", "deep_gemm", "deepgemm", "--enable-piecewise-cuda-graph"):
        assert bad not in argv


def dsa_flags(env: dict[str, str]) -> tuple[str, str, str]:
    """The KV cache dtype and the two DSA backends the kit's flags give under `env`."""
    argv = config.resolve(env).argv
    kv, prefill, decode = (argv[argv.index(f) + 1] for f in ("--kv-cache-dtype", "--dsa-prefill-backend",
                                                             "--dsa-decode-backend"))  # fmt: skip
    return kv, prefill, decode


DSA_SETS = {
    (kv, dsa): dsa_flags({"GLM5_KV_CACHE_DTYPE": kv, "GLM5_DSA_BACKEND": dsa})
    for kv in settings.declarations()["GLM5_KV_CACHE_DTYPE"].choices
    for dsa in settings.declarations()["GLM5_DSA_BACKEND"].choices
}
DSA_REFUSED = ("fp8_e4m3", "tilelang", "flashinfer_sparse_mla")  # a pair 0.5.23 refuses: the rule is live


@pytest.mark.xdist_group("sglang_oracle")  # the module's one oracle run, on one worker
def test_each_attention_alternative_is_a_named_value_that_passes_sglangs_dsa_rule(
    real: dict[str, Any],
) -> None:
    """GLM5_DSA_BACKEND's values with both KV cache dtypes: the flags they give, and 0.5.23's own DSA check over each
    set, on an SM120 device (the oracle); tilelang with another backend on an fp8 cache is refused there."""
    assert dsa_flags({}) == (
        "fp8_e4m3",
        "flashinfer_sparse_mla",
        "flashinfer_sparse_mla",
    )  # 0.5.23's SM12x pick
    assert DSA_SETS[("bf16", "auto")] == ("bf16", "tilelang", "tilelang")
    assert DSA_SETS[("fp8_e4m3", "tilelang")] == (
        "fp8_e4m3",
        "tilelang",
        "tilelang",
    )  # the next try after NaN
    assert DSA_SETS[("fp8_e4m3", "trtllm")] == ("fp8_e4m3", "trtllm", "trtllm")
    said = real["dsa"]
    assert said[:-1] == ["ok"] * len(DSA_SETS), dict(zip(DSA_SETS, said, strict=False))
    assert "requires both DSA backends to be tilelang" in said[-1]
    assert "GLM5_DSA_BACKEND=tilelang" in FAILURE["degenerate_answers"].fix  # the failure names the next try


def test_removed_flags_are_never_baked() -> None:
    argv = config.resolve({}).argv
    removed = settings.load_config()["removed_flag"]
    assert len(removed) == 7
    for flag in removed:
        assert flag not in argv


@pytest.mark.xdist_group("sglang_oracle")  # the module's one oracle run, on one worker
@pytest.mark.boots
def test_real_parser_rejects_what_check_extra_args_refuses(real: dict[str, Any]) -> None:
    # The refusal list must stay true for the pinned sglang: each removed flag really fails there.
    assert len(real["removed"]) == len(removed_flag_argvs()) == 7
    assert [p["ok"] for p in real["removed"]] == [False] * 7, real["removed"]


@pytest.mark.boots
def test_the_alias_table_is_the_installed_sglangs() -> None:
    """GLM5_EXTRA_ARGS="--tensor-parallel-size 4" passed: sglang's parser gives --tp-size another name, and the kit
    refused only the names it writes. configuration/sglang_aliases.json lists every such group, read from sglang."""
    table = json.loads(config.ALIASES.read_text())
    found = oracles.ask(ROOT / "tests/helpers/sglang_aliases_oracle.py", {})["aliases"]
    assert table["aliases"] == found, f"write these groups into {config.ALIASES}: {json.dumps(found)}"
    assert table["sglang"] == settings.load_config()["image"]["sglang"]
    assert ["--tensor-parallel-size", "--tp-size"] in found and ["--model", "--model-path"] in found


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"GLM5_MEM_FRACTION_STATIC": "abc"},
            "GLM5_MEM_FRACTION_STATIC: 'abc' is not a number; fix: use a number in 0.5..0.93",
        ),
        ({"GLM5_MEM_FRACTION_STATIC": "0.99"}, "'0.99' is out of range; fix: use a value in 0.5..0.93"),
        ({"GLM5_MEM_FRACTION_STATIC": "nan"}, "'nan' is not a number"),
        ({"GLM5_PORT": "80"}, "GLM5_PORT: '80' is out of range"),
        ({"GLM5_PORT": "30000x"}, "is not a whole number"),
        ({"GLM5_KV_CACHE_DTYPE": "fp8"}, "use one of fp8_e4m3, bf16"),
        ({"GLM5_SPECULATIVE": "eagle"}, "use one of off, mtp"),
        ({"GLM5_MODEL_DIR": "models/glm"}, "use an absolute path"),
        ({"GLM5_SERVED_MODEL_NAME": "glm 5"}, "GLM5_SERVED_MODEL_NAME: 'glm 5' is not a name"),
        ({"GLM5_CUDA_GRAPH_MAX_BS_DECODE": "0"}, "use a value in 1..1024"),
        ({"GLM5_HEALTH_TIMEOUT": "abc"}, "GLM5_HEALTH_TIMEOUT: 'abc' is not a number"),
        ({"GLM5_ACCEPT_PARTIAL_CAPTURE": "maybe"}, "'maybe' is not a yes/no value; fix: use 1 or 0"),
        (
            {"GLM5_MEM_FRACTION": "0.8"},
            "GLM5_MEM_FRACTION: is not a setting of glm5-serve; fix: did you mean GLM5_MEM_FRACTION_STATIC?",
        ),
        ({"GLM5_EXTRA_ARGS": "--foo 'bar"}, "cannot split"),
        ({"GLM5_EXTRA_ARGS": "--cuda-graph-max-bs 256"}, "set GLM5_CUDA_GRAPH_MAX_BS_DECODE"),
        ({"GLM5_EXTRA_ARGS": "--enable-piecewise-cuda-graph"}, "--cuda-graph-backend-prefill breakable"),
        ({"GLM5_EXTRA_ARGS": "--tp-size 4"}, "built for TP8"),
        (
            {"GLM5_EXTRA_ARGS": "--tensor-parallel-size 4"},
            "GLM5_EXTRA_ARGS: --tensor-parallel-size, sglang's other name of --tp-size, is set by the "
            "configuration; fix: use nothing: the image is built for TP8",
        ),
        (
            {"GLM5_EXTRA_ARGS": "--host 127.0.0.1"},
            "GLM5_EXTRA_ARGS: --host is set by the configuration; fix: use nothing: the published port, the "
            "Service and the probes reach the server on this address",
        ),
        ({"GLM5_EXTRA_ARGS": "--mem-fraction-static=0.9"}, "use GLM5_MEM_FRACTION_STATIC"),
        ({"GLM5_API_KEY": "a", "GLM5_API_KEY_FILE": "/run/secrets/k"}, "both set"),
        ({"GLM5_API_KEY_FILE": "/nonexistent/key"}, "cannot read /nonexistent/key"),
    ],
)
def test_malformed_override_is_refused_before_start(env: dict[str, str], message: str) -> None:
    done = launch("--dry-run", **env)
    assert done.returncode == 3
    assert message in done.stderr
    assert done.stdout == ""


def test_all_errors_are_collected() -> None:
    done = launch("--dry-run", GLM5_PORT="1", GLM5_KV_CACHE_DTYPE="x", GLM5_SPECULATIVE="y")
    assert done.returncode == 3
    assert "3 invalid setting(s)" in done.stderr


def test_api_key_file_is_read(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("from-file-0123456789\n")
    effective = config.resolve({"GLM5_API_KEY_FILE": str(key)})
    assert (
        effective.secret_options["api-key"] == "from-file-0123456789"
        and "from-file-0123456789" not in effective.argv
    )
    assert "from-file-0123456789" not in json.dumps(effective.state({}))


@pytest.mark.boots
def test_serve_writes_state_and_marker_then_execs(tmp_path: Path) -> None:
    program = tmp_path / "fake-server"
    program.write_text('#!/bin/sh\necho "argv: $*"\necho "nccl: $NCCL_P2P_LEVEL"\n')
    program.chmod(0o755)
    env = {"GLM5_STATE_DIR": str(tmp_path / "run"), "GLM5_SERVER_PROGRAM": str(program)}
    first = launch("--serve", **env)
    second = launch("--serve", **env)
    assert first.returncode == 0 and second.returncode == 0, first.stderr
    assert "glm5-serve: server start #1" in first.stdout and "glm5-serve: server start #2" in second.stdout
    assert "decode graphs expected 52, prefill 58" in first.stdout
    assert "argv: --model-path /models/GLM-5-NVFP4" in first.stdout
    assert "nccl: SYS" in first.stdout
    state = json.loads((tmp_path / "run/launch.json").read_text())
    assert state["start"] == 2 and state["decode_expected"] == 52


def test_serve_names_a_missing_server_program(tmp_path: Path) -> None:
    done = launch("--serve", GLM5_STATE_DIR=str(tmp_path), GLM5_SERVER_PROGRAM="/nonexistent/sglang")
    assert done.returncode == 127
    assert "not found" in done.stderr


def test_reference_lists_every_flag_with_its_reason() -> None:
    done = launch("--reference")
    cfg = settings.load_config()
    for flag in cfg["flag"]:
        assert f"`{flag['name']}`" in done.stdout
        assert flag["reason"].strip()
    for name in cfg["setting"]:
        assert f"`{name}`" in done.stdout


def test_readme_configuration_reference_is_current() -> None:
    reference = (ROOT / "docs" / "reference.md").read_text()
    assert launch("--reference").stdout.strip() in reference, "docs/reference.md is stale: run ci/render"


def serve_fake(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """launch --serve with a one-line shell script as the server program."""
    program = tmp_path / "fake-server"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)
    return launch("--serve", GLM5_STATE_DIR=str(tmp_path / "run"), GLM5_SERVER_PROGRAM=str(program), **env)


def test_the_server_does_not_inherit_the_kits_import_path(tmp_path: Path) -> None:
    """The thin executables put the kit on PYTHONPATH; the server (sglang) must not import from it."""
    done = serve_fake(tmp_path, 'echo "pythonpath=[$PYTHONPATH]"', PYTHONPATH="/opt/extra")
    assert done.returncode == 0, done.stderr
    assert "pythonpath=[/opt/extra]" in done.stdout  # the operator's own entry stays, the kit's is gone


def test_the_operators_environment_wins_over_the_configurations_defaults(tmp_path: Path) -> None:
    """glm5.toml's [[env]] values are defaults: a value the operator sets (glm5.env, the pod) reaches the server."""
    done = serve_fake(
        tmp_path, 'echo "p2p=$NCCL_P2P_LEVEL channels=$NCCL_MIN_NCHANNELS"', NCCL_P2P_LEVEL="PHB"
    )
    assert done.returncode == 0, done.stderr
    assert "p2p=PHB channels=8" in done.stdout
    state = json.loads((tmp_path / "run/launch.json").read_text())
    assert state["env"]["NCCL_P2P_LEVEL"] == "PHB" and state["env_from"]["NCCL_P2P_LEVEL"] == "environment"
    assert state["env_from"]["NCCL_MIN_NCHANNELS"] == "glm5.toml"


@pytest.mark.boots
def test_dry_run_shows_each_variable_and_where_it_came_from() -> None:
    done = launch("--dry-run", NCCL_P2P_LEVEL="PHB")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("python3 -m sglang.launch_server ")
    assert "# NCCL_P2P_LEVEL=PHB (from the environment; glm5.toml's default: SYS)" in lines
    assert "# NCCL_MIN_NCHANNELS=8 (glm5.toml default)" in lines
    assert json.loads(launch("--dry-run", "--json").stdout)[0] == "python3"  # --json stays the argv alone


@pytest.mark.parametrize("cut", [1, 3, 9, 17])
def test_the_relay_masks_a_secret_split_across_reads(cut: int) -> None:
    secret = "k-5ecret-7e57-value"
    stream = f"server_args={{'api_key': '{secret}'}}\r 3/52 frames\r{secret}{secret}\n".encode()
    masker = relay.Masker([secret])
    out = b"".join(masker.feed(stream[i : i + cut]) for i in range(0, len(stream), cut)) + masker.flush()
    assert out == stream.replace(secret.encode(), relay.MASK)
    live = relay.Masker([secret])
    assert live.feed(b"capture 3/52\r") == b"capture 3/52\r"  # output with no secret passes at once


@pytest.mark.xdist_group("sglang_oracle")  # the module's one oracle run, on one worker
@pytest.mark.boots
def test_the_key_goes_to_a_private_config_file_not_the_command_line(
    key_folder: Path, real: dict[str, Any]
) -> None:
    effective = config.resolve({"GLM5_API_KEY": KEY, "GLM5_STATE_DIR": str(key_folder)})
    assert KEY not in " ".join(effective.argv)
    assert effective.argv[-2:] == ["--config", str(key_folder / "server-config.yaml")]
    assert "--config" not in effective.public_argv() and effective.secret_options["api-key"] == KEY
    written = key_folder / "server-config.yaml"  # state.write_server_config, in the fixture
    assert written.stat().st_mode & 0o777 == 0o600
    # the operator's key beside it: GLM5_ADMIN_API_KEY unset, a random one (tests/test_settings.py)
    assert yaml.safe_load(written.read_text()) == {"api-key": KEY, "admin-api-key": mock.ANY}
    assert real["key"] == [{"ok": True, "error": ""}]  # sglang's own parser reads it


def test_the_relay_masks_escaped_forms_of_a_secret() -> None:
    secret = 'k-\\back"slash-secret'  # repr() and JSON write it escaped
    masker = relay.Masker([secret])
    text = f"server_args={{'api_key': {secret!r}}} {json.dumps(secret)} {secret}\n".encode()
    out = masker.feed(text) + masker.flush()
    assert b"back" not in out and out.count(relay.MASK) == 3


def test_the_server_gets_no_secret_variable(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("0123456789abcdef0123\n")
    done = serve_fake(
        tmp_path,
        'echo "key=[$GLM5_API_KEY] hf=[$HF_TOKEN]"',
        GLM5_API_KEY_FILE=str(key),
        HF_TOKEN="hf_secret_value_x",
    )
    assert done.returncode == 0, done.stderr
    assert "key=[] hf=[]" in done.stdout


def test_a_stale_server_config_is_removed_by_prepare(tmp_path: Path) -> None:
    stale = state.write_server_config(tmp_path, {"api-key": "old-key-from-a-killed-run"})
    done = launch("--prepare", GLM5_STATE_DIR=str(tmp_path), GLM5_SKIP_PREFLIGHT="all")
    assert done.returncode == 0, done.stderr
    assert not stale.exists()
