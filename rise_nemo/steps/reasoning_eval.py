"""Evaluation on verifiable reasoning problems: unbiased pass@k per difficulty level (docs/DESIGN.md §7).

Each problem is sampled ``n`` times under its original prompt; the verifier decides every response. Per
level (``ReasoningProblem.difficulty``; ``None`` pools as level 0) we report

  pass@k            mean over the level's problems of the unbiased estimator (core.metrics.pass_at_k) for
                    k = 1, 2, 4, ..., n (and n itself)
  step_accuracy     share of locally correct steps when the task defines ``step_accuracy`` (embedded task)
  response_length   mean response tokens
  token_entropy     mean of -log p(sampled token) under the sampling distribution (a sampled-token
                    estimate of the per-token entropy; exact for temperature 1 and top_p 1 in expectation)

Responses the verifier cannot decide (``None``) are excluded from their problem's n and counted. A problem
left with fewer than k decided samples has no pass@k: it is left out of that level's pass@k mean and counted
(``pass_at_k_excluded``, per k), and the printed table says so, instead of being dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rise_nemo.core.metrics import pass_at_k
from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.interfaces import Generator, SamplingParams, Verifier
from rise_nemo.steps.rollouts import preserved_rng, verify_groups


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to n, with n itself last."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def evaluate_reasoning(
    generator: Generator,
    verifier: Verifier,
    problems: Sequence[ReasoningProblem],
    n: int,
    params: SamplingParams,
    step: int = 0,
    step_accuracy: Callable[[ReasoningProblem, str], tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Sample, verify and summarise; see the module docstring. Global RNG states are left untouched."""
    with preserved_rng():
        groups = generator.generate([list(p.messages) for p in problems], n, params)
    levels: dict[int, dict[str, Any]] = {}
    for problem, group, verdict in zip(problems, groups, verify_groups(verifier, problems, groups)):
        lv = levels.setdefault(int(problem.difficulty or 0), {"problems": 0, "correct": [], "n": [], "undecided": 0,
                                                               "tokens": 0, "responses": 0, "nll": 0.0,
                                                               "steps_ok": 0, "steps": 0})
        decided = [v for v in verdict if v is not None]
        lv["problems"] += 1
        lv["undecided"] += len(verdict) - len(decided)
        lv["correct"].append(sum(bool(v) for v in decided))
        lv["n"].append(len(decided))
        for r in group:
            sampled = r.sampling_logprobs[r.given_token_count:]
            lv["tokens"] += len(sampled)
            lv["responses"] += 1
            lv["nll"] -= sum(sampled)
            if step_accuracy is not None:
                ok, tot = step_accuracy(problem, r.response_text)
                lv["steps_ok"] += ok
                lv["steps"] += tot
    out_levels = {}
    for level in sorted(levels):
        lv = levels[level]
        ks = k_values(n)
        pass_k, excluded = {}, {}
        for k in ks:
            vals = [pass_at_k(m, c, k) for m, c in zip(lv["n"], lv["correct"]) if m >= k]
            pass_k[str(k)] = sum(vals) / len(vals) if vals else None
            excluded[str(k)] = len(lv["n"]) - len(vals)  # problems with fewer than k decided samples
        out_levels[str(level)] = {
            "problems": lv["problems"],
            "pass_at_k": pass_k,
            "pass_at_k_excluded": excluded,
            "step_accuracy": lv["steps_ok"] / lv["steps"] if lv["steps"] else None,
            "response_length": lv["tokens"] / max(1, lv["responses"]),
            "token_entropy": lv["nll"] / lv["tokens"] if lv["tokens"] else None,
            "undecided": lv["undecided"],
        }
    all_ok = sum(sum(lv["correct"]) for lv in levels.values())
    all_n = sum(sum(lv["n"]) for lv in levels.values())
    tokens = sum(lv["tokens"] for lv in levels.values())
    return {
        "step": step,
        "kind": "reasoning",
        "samples_per_problem": n,
        "num_problems": len(problems),
        "pass_at_1": all_ok / all_n if all_n else None,
        "response_length": tokens / max(1, sum(lv["responses"] for lv in levels.values())),
        "token_entropy": sum(lv["nll"] for lv in levels.values()) / tokens if tokens else None,
        "levels": out_levels,
        "samples": [{"prompt_id": p.prompt_id, "response": g[0].response_text if g else ""}
                    for p, g in zip(problems[:3], groups)],
    }


def format_reasoning_eval(result: dict[str, Any]) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    ks = list(next(iter(result["levels"].values()))["pass_at_k"]) if result["levels"] else []
    lines = [f"step {result['step']}: pass@1 {pct(result['pass_at_1'])} over {result['num_problems']} problems x "
             f"{result['samples_per_problem']} samples; mean length {result['response_length']:.1f} tokens",
             f"{'level':>5} {'problems':>8} " + " ".join(f"{'pass@' + k:>9}" for k in ks)
             + f" {'step acc':>9} {'length':>7} {'entropy':>8}"]
    for level, lv in result["levels"].items():
        ent = "-" if lv["token_entropy"] is None else f"{lv['token_entropy']:.3f}"
        lines.append(f"{level:>5} {lv['problems']:>8} " + " ".join(f"{pct(lv['pass_at_k'][k]):>9}" for k in ks)
                     + f" {pct(lv['step_accuracy']):>9} {lv['response_length']:>7.1f} {ent:>8}")
    left_out = [f"level {level} pass@{k}: {m} of {lv['problems']}" for level, lv in result["levels"].items()
                for k, m in lv.get("pass_at_k_excluded", {}).items() if m]
    if left_out:
        lines.append("problems left out of pass@k (fewer than k samples the verifier decided): " + "; ".join(left_out))
    return "\n".join(lines)


def pooled_pass_at_k(result: dict[str, Any], levels: Sequence[int], k: int) -> float | None:
    """pass@k of an ``evaluate_reasoning`` result pooled over ``levels`` (each level's mean weighted by its
    number of problems); None when a level is missing or has no pass@k (fewer than k samples)."""
    rows = [result["levels"].get(str(level)) for level in levels]
    if not rows or any(r is None or r["pass_at_k"].get(str(k)) is None for r in rows):
        return None
    total = sum(r["problems"] for r in rows)
    return sum(r["pass_at_k"][str(k)] * r["problems"] for r in rows) / total
