"""configuration/settings.py, state.py and report.py: every GLM5_* variable declared once, refused clearly when
wrong; the state files and the start marker owned by one module; one exit-code table."""

from __future__ import annotations

import ast
import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from common import report
from configuration import config, settings, state
from configuration.start import Start
from conftest import ROOT
from healthcheck import logscan
from helpers import start_record

KIT_PACKAGES = ("common", "entrypoint", "healthcheck", "patches", "ci", "image", "kernels")


def cfg_with(change: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(settings.load_config())
    change(cfg)
    return cfg


def problems_of(environ: dict[str, str], cfg: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(report.Problems) as err:
        config.resolve(environ, cfg)
    return [str(p) for p in err.value.problems]


def test_a_bad_default_in_the_source_is_refused_not_dropped() -> None:
    cfg = cfg_with(lambda c: c["setting"]["GLM5_MEM_FRACTION_STATIC"].update(default="0.8O"))
    found = problems_of({}, cfg)
    assert found == [
        "glm5.toml [setting.GLM5_MEM_FRACTION_STATIC] default: '0.8O' is not a number; fix: use a number in 0.5..0.93"
    ]


def test_a_flag_whose_value_is_unset_is_refused_unless_optional() -> None:
    unset = {
        "name": "--max-total-tokens",
        "value": "{max_running_requests}",
        "reason": "a template left unset",
    }
    cfg = cfg_with(lambda c: c["flag"].append(unset))
    assert any("--max-total-tokens" in p and "is unset" in p for p in problems_of({}, cfg))
    argv = config.resolve({}).argv  # a setting's flag is left out while the setting is unset
    assert "--max-running-requests" not in argv and "--api-key" not in argv


def test_a_removed_variable_names_its_replacement() -> None:
    cfg = cfg_with(lambda c: c["removed_setting"].update(GLM5_OLD_KNOB="use GLM5_CUDA_GRAPH_MAX_BS_DECODE"))
    assert problems_of({"GLM5_OLD_KNOB": "1"}, cfg) == [
        "GLM5_OLD_KNOB: was removed; fix: use GLM5_CUDA_GRAPH_MAX_BS_DECODE"
    ]


def test_an_unknown_variable_is_refused_with_the_nearest_name() -> None:
    assert problems_of({"GLM5_DRAIN_SECOND": "5"}) == [
        "GLM5_DRAIN_SECOND: is not a setting of glm5-serve; fix: did you mean GLM5_DRAIN_SECONDS? "
        "see docs/reference.md's settings table (entrypoint/launch --reference), or unset it"
    ]


def test_host_settings_are_refused_inside_the_container_and_apply_on_the_host(tmp_path: Path) -> None:
    for name, value in (
        ("GLM5_HOST_PORT", "8080"),
        ("GLM5_BIND", "0.0.0.0"),
        ("GLM5_BENCH_PYTHON", "python3"),
    ):
        found = problems_of({name: value})
        assert len(found) == 1 and found[0].startswith(f"{name}: is read by "), found
        assert "not inside the container" in found[0] and "fix: move it to " in found[0]
    assert "fix: move it to .env beside docker-compose.yml" in problems_of({"GLM5_BIND": "0.0.0.0"})[0]
    assert settings.resolve({"GLM5_HOST_PORT": "8080"}, where="ci")["host_port"] == 8080
    # The host-side tools read .env as docker compose does, and the shell wins over it.
    (tmp_path / ".env").write_text(
        "# host settings\nGLM5_HOST_PORT=8081\nexport GLM5_BIND='0.0.0.0'\nGLM5_IMAGE=r.example/glm5-serve:1 # tag\n"
    )
    env = settings.host_environment({}, tmp_path)
    assert env == {"GLM5_HOST_PORT": "8081", "GLM5_BIND": "0.0.0.0", "GLM5_IMAGE": "r.example/glm5-serve:1"}
    assert settings.host_environment({"GLM5_HOST_PORT": "9000"}, tmp_path)["GLM5_HOST_PORT"] == "9000"
    assert settings.host_environment({}, tmp_path / "none") == {}


def test_the_port_is_one_rendered_value() -> None:
    found = problems_of({"GLM5_PORT": "31000"})
    assert found == [
        "GLM5_PORT: 31000 differs from 30000, the value rendered into docker-compose.yml, k8s/ and ci/bench; "
        "fix: unset it; to change it everywhere, edit [deployment].port in entrypoint/glm5.toml, run ci/render "
        "and rebuild"
    ]
    assert config.resolve({"GLM5_PORT": "30000"}).values["port"] == 30000
    # A replaced server program (the tests' double, debugging) runs outside compose and k8s: any port.
    assert (
        config.resolve({"GLM5_PORT": "31000", "GLM5_SERVER_PROGRAM": "python3 x.py"}).values["port"] == 31000
    )


@pytest.mark.parametrize("flag", sorted(config.owned_flags(settings.load_config())))
def test_every_flag_the_configuration_owns_is_refused_in_extra_args(flag: str) -> None:
    owner = config.owned_flags(settings.load_config())[flag]
    alias_of = config.owned_aliases(config.owned_names(settings.load_config())).get(flag)
    shown = f"{flag}, sglang's other name of {alias_of}," if alias_of else flag
    found = problems_of({"GLM5_EXTRA_ARGS": f"{flag}=1"})
    assert found == [f"GLM5_EXTRA_ARGS: {shown} is set by the configuration; fix: use {owner}"]


def test_each_setting_owns_its_flag() -> None:
    owned = config.owned_flags(settings.load_config())
    assert "GLM5_PORT" in owned["--port"] and owned["--speculative-algorithm"] == "GLM5_SPECULATIVE"
    assert owned["--tp-size"].startswith("nothing") and owned["--api-key"].startswith("GLM5_API_KEY")


def test_secrets_come_from_the_variable_or_its_file(tmp_path: Path) -> None:
    key = tmp_path / "dir with space" / "key"
    key.parent.mkdir()
    key.write_text("s3cret-0123456789abcdef\n")
    assert settings.resolve({"GLM5_API_KEY_FILE": str(key)})["api_key"] == "s3cret-0123456789abcdef"
    assert settings.resolve({"GLM5_API_KEY": "direct-0123456789ab"})["api_key"] == "direct-0123456789ab"
    key.write_text("")
    assert problems_of({"GLM5_API_KEY_FILE": str(key)}) == [
        f"GLM5_API_KEY_FILE: {key} is empty; fix: put the secret in it"
    ]


def test_no_secret_reaches_the_state_or_the_printed_command(tmp_path: Path) -> None:
    effective = config.resolve({"GLM5_API_KEY": "s3cret-value-0123456789"})
    operator = effective.secret_options.pop("admin-api-key")
    # both reach the server through --config only
    assert effective.secret_options == {"api-key": "s3cret-value-0123456789"}
    for shown in (effective.argv, effective.public_argv(), effective.state({})):
        assert "s3cret-value-0123456789" not in repr(shown) and operator not in repr(shown)


def test_the_operators_key_is_its_own_and_never_left_open() -> None:
    """Issue 50: SGLang's admin endpoints took the clients' key while no --admin-api-key was set. Given, the
    operator's key is the server's admin key; unset, each start gets a random one no one holds."""
    given = config.resolve(
        {"GLM5_API_KEY": "client-key-0123456789", "GLM5_ADMIN_API_KEY": "operator-key-0123456"}
    )
    assert given.secret_options == {
        "api-key": "client-key-0123456789",
        "admin-api-key": "operator-key-0123456",
    }
    first, second = (config.resolve({}).secret_options["admin-api-key"] for _ in range(2))
    assert first != second and len(first) >= 40 and "api-key" not in config.resolve({}).secret_options
    assert config.resolve({}).argv[-2] == config.CONFIG_FLAG
    assert problems_of({"GLM5_ADMIN_API_KEY": "short"}) == [
        "GLM5_ADMIN_API_KEY: is 5 characters long; fix: use at least 16 random characters (openssl rand -hex 24)"
    ]


def test_a_key_sglangs_parser_would_read_as_a_flag_is_refused_and_never_generated() -> None:
    """SGLang turns its --config file back into argv: a key that starts with '-' ended the real 0.5.23 CPU server at
    its parser ("argument --admin-api-key: expected one argument"), with a random key of the kit's that did. Given,
    it is refused before anything starts; generated, it never happens (a base64 key does 1 time in 64)."""
    assert problems_of({"GLM5_API_KEY": "-client-key-0123456789"}) == [
        "GLM5_API_KEY: starts with '-', which SGLang's parser reads as a flag; fix: use at least 16 random "
        "characters (openssl rand -hex 24)"
    ]
    operator = settings.declarations()["GLM5_ADMIN_API_KEY"]
    drawn = [config.generated_key() for _ in range(640)]
    assert [k for k in drawn if settings.secret_problem(operator, k)] == []


def kit_python_files() -> list[Path]:
    return [p for pkg in KIT_PACKAGES for p in (ROOT / pkg).rglob("*.py")]


def test_every_glm5_variable_the_kit_names_is_declared() -> None:
    declared = set(settings.load_config()["setting"]) | {
        f"{n}_FILE" for n, s in settings.load_config()["setting"].items() if s["kind"] == "secret"
    }
    named = set()
    for path in [
        *kit_python_files(),
        ROOT / "entrypoint/entrypoint.sh",
        ROOT / "entrypoint/supervisord.conf",
    ]:
        named |= set(re.findall(r"\bGLM5_[A-Z_]*[A-Z]\b", path.read_text()))
    named -= {
        "GLM5_SERVE_PATCHES",
        "GLM5_SERVE_KERNELS",
    }  # file names (the patch and kernel records), not variables
    assert named - declared == set()


@pytest.mark.boots
def test_the_kit_imports_plainly() -> None:
    """No sys.path edits or loader tricks in the kit's modules: every import is a plain one."""
    for path in kit_python_files():
        text = path.read_text()
        assert "sys.path" not in text and "SourceFileLoader" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level:
                pytest.fail(f"{path}: relative import")


def test_the_start_marker_is_written_and_read_by_one_module() -> None:
    line = state.marker_line(7, "2026-11-30T10:00:00+00:00", 42, 52, 58)
    scan = logscan.scan(
        b"old run\n===== glm5-serve: server start #6 at 2026-11-30T09:00:00+00:00 x\n" + line.encode() + b"\n"
    )
    assert (scan.start, scan.started_at) == (7, "2026-11-30T10:00:00+00:00")
    assert scan.marker_expected == (52, 58)


def test_a_start_record_is_whole_and_of_its_types_or_none() -> None:
    """launch.json read back is the record launch wrote; one missing a field, or holding a value of another type than
    its field's annotation (a string for a number, a list of numbers with a string, a number for a bool), is none."""
    made = start_record.record()
    written = made.as_json()
    assert Start.of(written) == made
    bad = {"start": "1", "argv": ["--port", 1], "decode_batch_sizes": [1, "2"], "health_timeout_seconds": "30",
           "autotune_stall_seconds": "x", "max_jobs_sized": 3, "doctor_warnings": [1], "env": [],
           "accept_partial_capture": 1, "prefill_token_sizes": "1,2"}  # fmt: skip
    for name, value in bad.items():
        assert Start.of(written | {name: value}) is None, name
    assert Start.of(written | {"autotune_stall_seconds": None, "health_timeout_seconds": 30}) is not None
    assert Start.of({k: v for k, v in written.items() if k != "pid"}) is None


def test_state_files_are_named_once(tmp_path: Path) -> None:
    assert state.next_start(tmp_path) == 1 and state.next_start(tmp_path) == 2
    with pytest.raises(ValueError, match="not a state file"):
        state.path(tmp_path, "launch.jsn")
    written = start_record.write(tmp_path, start=2, pid=1)
    assert state.current_start(state.read_launch(tmp_path), 2) == written
    # an earlier start's record is not the current one
    assert state.current_start(state.read_launch(tmp_path), 3) is None
    state.write_failed(tmp_path, 2, "exited", 70, "why")
    failed = state.read_failed(tmp_path)
    assert failed is not None and (failed["start"], failed["kind"], failed["code"], failed["reason"]) == (
        2,
        "exited",
        70,
        "why",
    )
    assert (
        state.current_failure(failed, 2) == failed and state.current_failure(failed, 1) == failed
    )  # refused next
    assert state.current_failure(failed, 3) is None  # an earlier start's failure is not the latest one's
    state.clear_failed(tmp_path)
    assert state.read_failed(tmp_path) is None


def test_exit_codes_are_one_table_with_one_meaning_each() -> None:
    codes = [row[0] for row in report.EXIT_CODES]
    assert len(codes) == len(set(codes))
    named = {report.OK, report.FAILED, report.USAGE, report.INVALID_SETTING, report.NEVER_READY}
    assert {str(c) for c in named} <= set(codes)
    gave_up = {f.exit_code for f in report.FAILURES if f.kind != "refused"}
    low, high = (int(x) for x in next(c for c in codes if c.startswith(f"{min(gave_up)}-")).split("-"))
    assert gave_up == set(range(low, high + 1))  # every kind's exit code, and no other, in the row
    readme = (ROOT / "README.md").read_text()
    for code, meaning, _tools in report.EXIT_CODES:
        assert f"| {code} | {meaning} |" in readme


def test_the_probe_names_a_malformed_setting_without_a_traceback(tmp_path: Path) -> None:
    """Named, with its fix, but the probe still answers (not ready, 1) rather than exit 3: under supervisord the
    same setting fails the start and is recorded, and a liveness probe exiting 3 would restart it in a loop."""
    done = subprocess.run(
        [str(ROOT / "healthcheck/healthcheck"), "--status"],
        env={
            "PATH": __import__("os").environ["PATH"],
            "GLM5_HEALTH_TIMEOUT": "abc",
            "GLM5_STATE_DIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == report.FAILED, done.stderr
    assert (
        "warning: GLM5_HEALTH_TIMEOUT: 'abc' is not a number" in done.stderr
        and "Traceback" not in done.stderr
    )


def test_debug_lines_only_with_the_switch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GLM5_DEBUG", raising=False)
    report.Log("t").debug("hidden")
    monkeypatch.setenv("GLM5_DEBUG", "1")
    report.Log("t").debug("shown")
    assert capsys.readouterr().err == "t: debug: shown\n"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # argparse takes unique prefixes
        (
            "--api-ke K",
            "--api-ke (as --api-key) is set by the configuration",
        ),
        (
            "--cuda-graph-max-bs-d 256",
            "--cuda-graph-max-bs-d (as --cuda-graph-max-bs-decode) is set by the configuration",
        ),
        ("--admin-api-key K", "--admin-api-key is set by the configuration; fix: use GLM5_ADMIN_API_KEY"),
        ("--admin-api=K", "--admin-api (as --admin-api-key) is set by the configuration"),
    ],
)
def test_extra_args_cannot_reach_an_owned_or_secret_flag_by_a_prefix(extra: str, message: str) -> None:
    found = problems_of({"GLM5_EXTRA_ARGS": extra})
    assert len(found) == 1 and message in found[0], found


def test_a_drain_above_the_rendered_grace_is_refused() -> None:
    """compose and the pod are rendered with grace for glm5.toml's drain: a longer one would be killed mid-drain."""
    found = problems_of({"GLM5_DRAIN_SECONDS": "6000"})
    assert found == ["GLM5_DRAIN_SECONDS: '6000' is out of range; fix: use a value in 0..1800"]
    assert config.resolve({"GLM5_DRAIN_SECONDS": "30"}).values["drain_seconds"] == 30


def test_the_health_timeout_fits_inside_the_probes_own_timeout() -> None:
    assert problems_of({"GLM5_HEALTH_TIMEOUT": "30"}) == [
        "GLM5_HEALTH_TIMEOUT: '30' is out of range; fix: use a value in 3..29"
    ]


def test_the_probes_wait_longer_than_the_servers_own_health_check() -> None:
    """SGLang's /health waits SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for the scheduler, then marks itself unhealthy:
    a probe that gives up first cannot tell a busy server from a stuck one."""
    assert problems_of({"GLM5_HEALTH_TIMEOUT": "10"}) == [
        "GLM5_HEALTH_TIMEOUT: 10 s is not above the server's own /health wait (SGLANG_HEALTH_CHECK_TIMEOUT=20); "
        "fix: set GLM5_HEALTH_TIMEOUT above 20 (and below the probe command's timeout), or lower "
        "SGLANG_HEALTH_CHECK_TIMEOUT"
    ]
    assert config.resolve({"GLM5_HEALTH_TIMEOUT": "10", "SGLANG_HEALTH_CHECK_TIMEOUT": "5"}).values
    assert config.resolve({}).values["health_timeout_seconds"] == 25


def test_a_short_api_key_is_refused() -> None:
    assert problems_of({"GLM5_API_KEY": "abc"}) == [
        "GLM5_API_KEY: is 3 characters long; fix: use at least 16 random characters (openssl rand -hex 24)"
    ]


def test_each_server_option_is_declared_once() -> None:
    """A setting's flag is the [[flag]] that names it (its value, optional while unset, secret by its kind), never a
    second `flag` in [setting.NAME]: glm5.toml had eight declared twice and one owner corrected by hand."""
    cfg = settings.load_config()
    names = [f["name"] for f in cfg["flag"]]
    own = [spec["flag"] for spec in cfg["setting"].values() if "flag" in spec]
    assert len(names) == len(set(names)) and not set(names) & set(own), set(names) & set(own)
    owners = {s.flag: s.name for s in settings.declarations(cfg).values() if s.flag}
    assert owners["--api-key"] == "GLM5_API_KEY" and owners["--model-path"] == "GLM5_MODEL_DIR"
    twice = copy.deepcopy(cfg)
    twice["setting"]["GLM5_MODEL_DIR"]["flag"] = "--model-path"
    with pytest.raises(report.Problem, match="declare the option once"):
        settings.declarations(twice)


def test_a_flag_owned_by_a_rendered_setting_names_glm5_toml_not_the_refused_variable() -> None:
    """`--port` in GLM5_EXTRA_ARGS once said "use GLM5_PORT", which is then refused (fixed at its rendered value)."""
    (found,) = problems_of({"GLM5_EXTRA_ARGS": "--port 31000"})
    assert "use glm5.toml's value of GLM5_PORT" in found and "then ci/render" in found, found
    (other,) = problems_of({"GLM5_EXTRA_ARGS": "--served-model-name x"})
    assert other.endswith("fix: use GLM5_SERVED_MODEL_NAME"), other
