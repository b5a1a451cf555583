"""The kit around the REAL SGLang 0.5.23 server on the CPU: the server program's flag classification."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from configuration import config, state
from helpers import sglang_cpu_server

KEY = "real-server-key-0123456789abcdef"
BOOTS = [pytest.mark.boots, pytest.mark.xdist_group("real_sglang")]
# Series the kit's alerts, dashboard or KEDA query use that the real server exports only after an event: its
# multiprocess collector writes a series once it has a sample (the double shows them at 0 from the start).
AFTER_AN_EVENT = {"sglang:num_retracted_requests_total": "a retraction (the KV pool full while decoding)"}


# --- the server program's flags, without a start ---------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [{}, {"GLM5_MAX_RUNNING_REQUESTS": "64", "GLM5_KV_CACHE_DTYPE": "bf16"}, {"GLM5_API_KEY": KEY}],
)
def test_every_flag_the_kit_renders_is_classified_for_the_cpu_server(
    env: dict[str, str], tmp_path: Path
) -> None:
    effective = config.resolve(env | {"GLM5_STATE_DIR": str(tmp_path)})
    if effective.secret_options:  # the file the kit writes before the start: its keys are classified too
        state.write_server_config(tmp_path, effective.secret_options)
    out = sglang_cpu_server.classify(effective.argv[len(config.SERVER_PROGRAM) :], "/tiny")
    pairs = dict(zip(out, [*out[1:], ""], strict=True))
    assert pairs["--model-path"] == "/tiny" and pairs["--host"] == "127.0.0.1"
    assert pairs["--attention-backend"] == "torch_native" and "--sleep-on-idle" in out
    assert "--max-total-tokens" in out and "--device" in out
    for dropped in ("--tp-size", "--quantization", "--kv-cache-dtype", "--cuda-graph-max-bs-decode"):
        assert dropped not in out
    assert out.count("--attention-backend") == 1
    if env.get("GLM5_API_KEY"):
        assert "--config" in out and KEY not in out


def run_program(*args: str, model: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SGLANG_CPU_MODEL": model}
    return subprocess.run(
        [sys.executable, sglang_cpu_server.__file__, *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=30,
    )


def test_the_cpu_server_program_refuses_a_flag_it_has_not_classified(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    done = run_program("--port", "30000", "--enable-some-new-thing", model=str(tmp_path))
    assert done.returncode == 2
    assert "--enable-some-new-thing: not classified for the CPU server" in done.stderr
    # GLM5_SPECULATIVE=mtp: MTP needs GLM-5's own layer, which no CPU server runs
    mtp = config.resolve({"GLM5_SPECULATIVE": "mtp"}).argv[len(config.SERVER_PROGRAM) :]
    done = run_program(*mtp, model=str(tmp_path))
    assert done.returncode == 2 and "--speculative-algorithm: not classified" in done.stderr
    (tmp_path / "server.yaml").write_text('api-key: "k"\nadmin-api-key: "k2"\n')
    done = run_program("--config", str(tmp_path / "server.yaml"), model=str(tmp_path))
    assert done.returncode == 2 and "option 'admin-api-key' is not classified" in done.stderr
    done = run_program("--port", "30000", model=str(tmp_path / "none"))
    assert done.returncode == 2 and "SGLANG_CPU_MODEL" in done.stderr
