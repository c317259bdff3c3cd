"""The benches' shared command line (bench/_cli.py): overrides may follow a nargs="+" option."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._cli import parse_with_overrides  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--variants", nargs="+", choices=["ppo", "rrl"], default=["ppo"])
    p.add_argument("--out", default=None)
    p.add_argument("overrides", nargs="*")
    return p


def test_overrides_after_a_greedy_option_are_overrides_not_choices():
    args = parse_with_overrides(_parser(), ["--variants", "ppo", "rrl", "ppo.critic_updates=4", "--out", "F", "a=1"])
    assert args.variants == ["ppo", "rrl"] and args.out == "F"
    assert args.overrides == ["ppo.critic_updates=4", "a=1"]


def test_a_bad_choice_is_still_an_argparse_error():
    with pytest.raises(SystemExit):
        parse_with_overrides(_parser(), ["--variants", "ppo", "nope"])


def test_trl_parity_cli_quick_and_bad_pairs():
    from bench.trl_parity import parse_args

    args = parse_args(["--quick", "sampling.temperature=1.0"])
    assert args.pairs == 1 and args.overrides == ["sampling.temperature=1.0"]
    assert parse_args(["--pairs", "3"]).pairs == 3
    with pytest.raises(SystemExit):
        parse_args(["--pairs", "0"])
