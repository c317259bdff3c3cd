"""`rise-nemo` console script: a thin dispatcher to rise_nemo.commands.<name>.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Only the chosen command's module is imported, so `rise-nemo plan` does not pay for torch/transformers.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, str] = {
    "train": "rise_nemo.commands.train",
    "eval": "rise_nemo.commands.evaluate",
    "report": "rise_nemo.commands.report",
    "demo": "rise_nemo.commands.demo",
    "plan": "rise_nemo.commands.plan",
}


def _usage() -> str:
    lines = ["usage: rise-nemo COMMAND [options]", "", "commands:"]
    for name in COMMANDS:
        lines.append(f"  {name}")
    lines.append("")
    lines.append("Run `rise-nemo COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rise-nemo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name])
    parser = argparse.ArgumentParser(prog=f"rise-nemo {name}", description=module.HELP)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
