"""SGLang 0.5.23's own argument resolution of the server command line, run before the weights load.

    python3 entrypoint/resolve_flags.py SERVER-ARGS...     (run by preflight with the server's Python)

prepare_server_args (argparse), then ServerArgs.resolve_once (srt/server_args.py: the resolution pipeline
launch_server.py runs: model config from config.json and hf_quant_config.json, KV cache, DSA backends,
CUDA graph sizes, speculative and parallel settings) and check_server_args (engine.py's checks). A wrong
combination fails here in seconds instead of after a 10-minute load. Exit 0 resolved, 1 refused (the
reason on stderr), 2 argparse's own refusal.

Where no CUDA device is present (tests, a CPU machine), the box's GPU is stated instead of queried:
compute capability 12.0 (torch.cuda.get_device_capability, read raw by the DSA hooks) and SGLang's own
override_platform for SM120; `--device cuda` skips its accelerator probe. Stand-alone: imports only
torch and sglang, never the kit. Run with HF_HUB_OFFLINE=1: a local model path needs no network.
"""

from __future__ import annotations

import sys


def state_the_box() -> list[str]:
    import torch

    if torch.cuda.is_available():
        return []
    torch.cuda.get_device_capability = lambda device=None: (12, 0)
    from sglang.srt.runtime_context import override_platform

    override_platform(
        is_cuda=True,
        is_hip=False,
        is_sm90=False,
        is_sm100=False,
        is_sm100_or_sm110=False,
        is_sm110=False,
        is_sm120=True,
        is_blackwell=True,
        device_sm=120,
        device_capability=(12, 0),
        has_flashinfer=True,
    ).install()
    return ["--device", "cuda"]


def main(argv: list[str]) -> int:
    extra = state_the_box()
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(argv + extra)  # argparse: exits 2 with its message
    try:
        args.resolve_once()
        args.check_server_args()
    except (AssertionError, ValueError, OSError, RuntimeError) as err:
        print(f"{type(err).__name__}: {str(err) or '(an assertion without a message)'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
