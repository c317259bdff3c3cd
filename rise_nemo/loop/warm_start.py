"""The embedded reasoning task's warm start as the starting point of the RL baselines
(docs/DESIGN.md §7.5): build a warm-started local policy from a recipe, evaluate it on held-out problems on
the recipe's evaluation stream, and check the properties the warm start is designed to have.

Shared by `rise-nemo demo --task reasoning` (rise_nemo/commands/demo.py) and bench/reasoning_baselines.py.

The properties: short problems (the lowest level, 1 step) solved, pass@1 >= 50%; the longest
held-out level rarely solved from scratch, pass@1 <= 3% and pass@8 <= 20%, so exploration matters; per-step
accuracy high, so failure comes from length (P ~ p^L). For "high" we require step accuracy >= 50% at every
level (a prototype had p ~ 0.52, the recipe's warm start ~0.6).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# (name, comparison, threshold): the warm start's designed properties, checked by ``warm_start_properties``.
WARM_START_TARGETS = (
    ("short_pass1", ">=", 0.50),
    ("long_pass1", "<=", 0.03),
    ("long_pass8", "<=", 0.20),
    ("min_step_accuracy", ">=", 0.50),
)


def warm_started_backend(cfg: Any, progress: bool = False) -> tuple[Any, Any, Any]:
    """(policy, generator, warm-start stats) of a recipe: global RNGs seeded by ``run.seed``, a fresh
    backend, then the warm start (``data.warm_start``, cached under ``data.warm_start_cache``)."""
    from rise_nemo.backends import build_backend
    from rise_nemo.loop.data import warm_start_policy
    from rise_nemo.loop.trainer import seed_everything

    seed_everything(int(cfg.run.seed))
    policy, generator = build_backend(cfg)
    stats = warm_start_policy(cfg, policy, generator, progress=progress)
    return policy, generator, stats


def evaluate_heldout(cfg: Any, generator: Any, problems: Sequence[Any], n: int | None = None,
                     step: int = 0) -> dict[str, Any]:
    """``evaluate_reasoning`` of ``problems`` with the recipe's verifier and step-accuracy checker, ``n``
    samples each (default ``eval.samples_per_prompt``) on the evaluation stream of ``step`` (the sampling
    parameters the trainer's evaluation at that step uses, so a warm start measured here at step 0 is the
    trainer's step-0 evaluation)."""
    from rise_nemo.steps.reasoning_eval import evaluate_reasoning
    from rise_nemo.steps.rollouts import eval_sampling_params
    from rise_nemo.steps.verifiers import build_verifier

    verifier, step_accuracy = build_verifier(cfg)
    n = int(cfg.eval.samples_per_prompt) if n is None else int(n)
    return evaluate_reasoning(generator, verifier, problems, n, eval_sampling_params(cfg, step), step,
                              step_accuracy=step_accuracy)


def warm_start_properties(result: dict[str, Any]) -> dict[str, Any]:
    """The warm-start properties of an ``evaluate_reasoning`` result that covers the short (lowest) and the
    longest level: their values, and per target of ``WARM_START_TARGETS`` whether it is met (None when it
    cannot be measured, e.g. pass@8 with fewer than 8 samples per problem)."""
    levels = result["levels"]
    if not levels:
        raise ValueError("warm-start properties need an evaluation with at least one level")
    short, long = min(levels, key=int), max(levels, key=int)
    step_accs = [lv["step_accuracy"] for lv in levels.values()]
    values = {
        "short_level": int(short),
        "long_level": int(long),
        "short_pass1": levels[short]["pass_at_k"]["1"],
        "long_pass1": levels[long]["pass_at_k"]["1"],
        "long_pass8": levels[long]["pass_at_k"].get("8"),
        "min_step_accuracy": None if any(a is None for a in step_accs) else min(step_accs),
    }
    met = {}
    for name, op, threshold in WARM_START_TARGETS:
        value = values[name]
        met[name] = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
    return {**values, "met": met, "all_met": all(m is True for m in met.values())}


def format_warm_start_properties(props: dict[str, Any]) -> str:
    """One line: each property with its measured value, target and met / NOT MET."""
    labels = {"short_pass1": f"L{props['short_level']} pass@1", "long_pass1": f"L{props['long_level']} pass@1",
              "long_pass8": f"L{props['long_level']} pass@8", "min_step_accuracy": "step accuracy (every level)"}
    parts = []
    for name, op, threshold in WARM_START_TARGETS:
        value, met = props[name], props["met"][name]
        shown = "n/a" if value is None else f"{100 * value:.1f}%"
        verdict = "not measured" if met is None else ("met" if met else "NOT MET")
        parts.append(f"{labels[name]} {shown} {op} {100 * threshold:.0f}% {verdict}")
    return ("warm-start properties: " + "; ".join(parts)
            + (" -> all met" if props["all_met"] else " -> NOT all met"))


