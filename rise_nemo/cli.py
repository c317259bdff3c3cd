"""`rise-nemo` console script: a thin dispatcher to rise_nemo.commands.<name>.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Only the chosen command's module is imported (they import their heavy dependencies lazily), so
`rise-nemo plan` does not pay for torch/transformers.

Options and ``key=value`` overrides may come in any order (``parse_intermixed_args``). Every user error
(``UserError``, ``ConfigError``, ``RubricError``) ends in one line on stderr and exit code 2, never a
traceback; a closed pipe (``rise-nemo eval ... | head``) ends quietly; a stop signal during a run's set-up
(``SetupInterrupted``) is one line and exit code 0, like a stop during training.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS: dict[str, str] = {
    "train": "rise_nemo.commands.train",
    "eval": "rise_nemo.commands.evaluate",
    "score": "rise_nemo.commands.score",
    "report": "rise_nemo.commands.report",
    "demo": "rise_nemo.commands.demo",
    "plan": "rise_nemo.commands.plan",
    "distill": "rise_nemo.commands.distill",
    "pipeline": "rise_nemo.commands.pipeline",
    "export": "rise_nemo.commands.export",
}


def _usage() -> str:
    lines = ["usage: rise-nemo [--version] COMMAND [options] [key=value ...]", "", "commands:"]
    for name, module in COMMANDS.items():
        lines.append(f"  {name:<8} {importlib.import_module(module).HELP}")
    lines += ["", "Run `rise-nemo COMMAND --help` for a command's options."]
    return "\n".join(lines)


def _version() -> str:
    from rise_nemo import __version__

    return f"rise-nemo {__version__}"


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(_version())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"rise-nemo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name])
    parser = argparse.ArgumentParser(prog=f"rise-nemo {name}", description=module.HELP)
    module.add_arguments(parser)
    args = parser.parse_intermixed_args(rest)
    from rise_nemo.commands import user_errors
    from rise_nemo.loop.signals import SetupInterrupted

    try:
        return int(module.run(args) or 0)
    except user_errors() as exc:
        print(f"rise-nemo {name}: {exc}", file=sys.stderr)
        return 2
    except SetupInterrupted as exc:  # a stop signal before training began: exit 0, as a stop during training
        print(f"rise-nemo {name}: {exc}", file=sys.stderr)
        return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        rc = _dispatch(argv)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # The reader went away (`| head`): point stdout at /dev/null so the interpreter's final flush
        # does not raise again, and exit like other Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
