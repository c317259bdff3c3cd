"""Guidance-free evaluation on held-out prompts (the paper's evaluation protocol, Tables 12-13).

Each prompt is sampled ``samples_per_prompt`` (>= 8) times under its ORIGINAL conversation, every response
is judged on the complete rubric, and we report:

  reward_mean           mean eq. 3 reward over judged responses (no overlong penalty: a pure rubric score)
  persistent_coverage   share of (response, positive criterion tagged ``eval.persistent_tag``) judgments met
  negative_rate         share of (response, negative-points criterion) judgments met (undesirable behaviour)
  criteria              per-criterion table (core.metrics.criterion_coverage per prompt, pooled across
                        prompts by criterion text): satisfied / met / total and coverage
Responses with an unknown verdict are excluded and counted (``unknown_excluded``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rise_nemo.core.metrics import criterion_coverage
from rise_nemo.core.rewards import rubric_reward
from rise_nemo.core.rubric import RubricPrompt
from rise_nemo.interfaces import Generator, Judge, JudgeRequest, Rollout, Verdict
from rise_nemo.steps.rollouts import eval_sampling_params, flat_call, preserved_rng


class EvaluationError(RuntimeError):
    """An evaluation produced no judged response at all (nothing is written)."""


def evaluate(
    cfg: Any, generator: Generator, judge: Judge, prompts: Sequence[RubricPrompt], step: int
) -> dict[str, Any]:
    """Evaluate the current policy without guidance; global RNG states are left untouched."""
    n = int(cfg.eval.samples_per_prompt)
    with preserved_rng():  # evaluation must not change what training samples next (exact resume)
        groups = generator.generate([list(p.messages) for p in prompts], n, eval_sampling_params(cfg, step))
    verdicts = judge_groups(judge, prompts, groups)
    if prompts and all(any(x is None for x in v) for group in verdicts for v in group):
        # An evaluation of nulls says nothing and would read as a result: stop instead of writing it.
        raise EvaluationError(f"evaluation at step {step}: the judge gave no complete verdict for any of "
                              f"{sum(len(g) for g in groups)} responses (is the judge up? see train.log)")
    return summarize(prompts, groups, verdicts, step, tag=str(cfg.eval.persistent_tag),
                     clip_min=cfg.reward.clip_min)


def summarize(prompts, groups, verdicts, step: int, tag: str, clip_min: float | None = None) -> dict[str, Any]:
    """Pool per-prompt coverage tables (core.metrics.criterion_coverage) by criterion text.

    Table rows keep the paper's "satisfied" convention (met for positive criteria, avoided for negative
    ones) and add ``met`` so negative rates read directly."""
    rewards: list[float] = []
    unknown = 0
    table: dict[tuple[str, bool], dict[str, Any]] = {}
    for prompt, group_verdicts in zip(prompts, verdicts):
        rows = [v for v in group_verdicts if not any(x is None for x in v)]
        unknown += len(group_verdicts) - len(rows)
        if not rows:
            continue
        z = torch.tensor([[float(x) for x in v] for v in rows])  # [G_valid, K]
        rewards.extend(rubric_reward(z, prompt.rubric.weights, clip_min=clip_min).tolist())  # eq. 3
        coverage = criterion_coverage(rows, prompt.rubric.weights, names=[c.text for c in prompt.rubric.criteria])
        for crit, cov in zip(prompt.rubric.criteria, coverage.rows):
            row = table.setdefault((crit.text, crit.is_negative), {
                "criterion": crit.text, "negative": crit.is_negative, "persistent": tag in crit.tags,
                "satisfied": 0, "met": 0, "total": 0,
            })
            row["satisfied"] += cov.satisfied
            row["met"] += cov.failed if crit.is_negative else cov.satisfied
            row["total"] += cov.total
    for row in table.values():
        row["coverage"] = row["satisfied"] / row["total"] if row["total"] else None
    persistent = [r for r in table.values() if r["persistent"] and not r["negative"]]
    negative = [r for r in table.values() if r["negative"]]
    return {
        "step": step,
        "reward_mean": float(np.mean(rewards)) if rewards else None,
        "persistent_coverage": _ratio(sum(r["met"] for r in persistent), sum(r["total"] for r in persistent)),
        "negative_rate": _ratio(sum(r["met"] for r in negative), sum(r["total"] for r in negative)),
        "num_prompts": len(prompts),
        "num_responses": sum(len(g) for g in groups),
        "unknown_excluded": unknown,
        "criteria": sorted(table.values(), key=lambda r: (not r["persistent"], r["negative"], r["criterion"])),
        "samples": [
            {"prompt_id": p.prompt_id, "response": g[0].response_text if g else ""} for p, g in zip(prompts[:3], groups)
        ],
    }


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def judge_groups(
    judge: Judge, prompts: Sequence[RubricPrompt], groups: Sequence[Sequence[Rollout]]
) -> list[list[list[Verdict]]]:
    """One judge call for all responses; each request carries the ORIGINAL conversation, never a hint."""
    requests = [[JudgeRequest(conversation=list(p.messages), response=r.response_text, rubric=p.rubric,
                              prompt_id=p.prompt_id) for r in group] for p, group in zip(prompts, groups)]
    out = [[list(v) for v in rows] for rows in flat_call(judge.judge, requests, "judge")]
    for p, rows in zip(prompts, out):
        for row in rows:
            if len(row) != len(p.rubric):
                raise RuntimeError(f"judge returned {len(row)} verdicts for prompt {p.prompt_id} with {len(p.rubric)} criteria")
    return out
