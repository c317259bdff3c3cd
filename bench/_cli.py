"""Command-line parsing shared by the benches: recipe overrides (``key=value``) may come anywhere.

argparse alone cannot do it: an option with ``nargs="+"`` (``--variants ppo rrl``) swallows the overrides that
follow it and then rejects them as invalid choices. Tokens that look like overrides (contain ``=``, do not
start with ``-``) are taken out first and handed back as ``args.overrides``.
"""

from __future__ import annotations

import argparse
import sys


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    tokens = list(sys.argv[1:] if argv is None else argv)
    overrides = [t for t in tokens if "=" in t and not t.startswith("-")]
    args = parser.parse_args([t for t in tokens if t not in overrides])
    args.overrides = [*getattr(args, "overrides", []), *overrides]
    return args
