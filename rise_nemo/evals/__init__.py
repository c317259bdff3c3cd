"""Evaluation suites that reproduce the seeds' tables (docs/evals.md): a registry by name.

    from rise_nemo.evals import get_suite, SUITES
    suite = get_suite("math500")
    items = suite.load(None)        # the shipped fixture rows, or a path in the benchmark's public format

Each suite lives in its own module and is imported only when asked for.
"""

from __future__ import annotations

import importlib

from rise_nemo.errors import UserError

# name -> "module:class"
SUITES: dict[str, str] = {
    "aime": "rise_nemo.evals.math:AIME",
    "math500": "rise_nemo.evals.math:Math500",
    "gsm8k": "rise_nemo.evals.math:GSM8K",
    "gpqa_diamond": "rise_nemo.evals.mc:GPQADiamond",
    "medqa": "rise_nemo.evals.mc:MedQA",
    "healthbench": "rise_nemo.evals.healthbench:HealthBench",
    "writingbench": "rise_nemo.evals.writingbench:WritingBench",
    "arena_hard": "rise_nemo.evals.arena_hard:ArenaHard",
    "hh_win_rate": "rise_nemo.evals.hh_win_rate:HHWinRate",
    "apps": "rise_nemo.evals.apps:APPS",
}

__all__ = ["SUITES", "get_suite", "list_suites"]


def get_suite(name: str):
    """A fresh suite object by name; an unknown name is a UserError listing the suites."""
    if name not in SUITES:
        raise UserError(f"--suite {name}: unknown suite; the suites are {', '.join(SUITES)}")
    module, cls = SUITES[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def list_suites() -> list[tuple[str, str, str]]:
    """(name, headline metric, source) of every suite."""
    out = []
    for name in SUITES:
        s = get_suite(name)
        out.append((name, s.headline, s.source))
    return out
