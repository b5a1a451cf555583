"""The option strings that the real sglang 0.5.23's server parser (srt/server_args.py prepare_server_args:
ServerArgs.add_cli_args on an argparse parser) gives one destination, two or more of them; print JSON.

stdout: ORACLE-JSON {"aliases": [[option, ...], ...]}, each group sorted, the groups sorted.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from sglang.srt.server_args import ServerArgs


def main() -> None:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    by_dest: dict[str, set[str]] = defaultdict(set)
    for action in parser._actions:  # argparse keeps no public list of them
        if action.dest != "help":
            by_dest[action.dest].update(o for o in action.option_strings if o.startswith("--"))
    groups = sorted(sorted(options) for options in by_dest.values() if len(options) > 1)
    print("ORACLE-JSON " + json.dumps({"aliases": groups}))


if __name__ == "__main__":
    main()
