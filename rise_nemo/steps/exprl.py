"""ExpRL's Stage I scoring and the self-distillation baseline, as registered pieces of the reasoning step
(docs/DESIGN.md §8; the SFT baseline is rise_nemo.steps.sft).

  exprl_outcome       reference judge grades the whole rollout 1-5 -> normalised reward -> GRPO group
                      advantages (unknown -> excluded from the group's statistics; truncated -> judged
                      as written, or 0 with ``exprl.truncated: zero``)
  exprl_process       the rollout is cut into segments at ``exprl.segment_marker`` (core.exprl), ALL its
                      segments are graded in one judge call, segment advantages A_1 = s_1 - s_T,
                      A_t = s_t - s_{t-1} on every token of the segment, no group normalisation
  self_distillation   the same policy with the reference in its context is the teacher on the student's
                      own samples: per-token advantage log pi(y_t | x, ref, y_<t) - log pi(y_t | x, y_<t)
                      (on-policy distillation, the reverse-KL reward), trained by the same clipped PG loss

The policy always samples from ``problem.messages`` (the plain problem); only the judge and the
self-distillation teacher are given the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rise_nemo.core.exprl import normalise_score, segment_token_spans, token_process_advantages
from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.interfaces import Rollout
from rise_nemo.judges.reference import ScoreRequest
from rise_nemo.methods.registry import REASONING
from rise_nemo.steps.reasoning import ReasoningContext, StepScores, place_token_advantages
from rise_nemo.steps.rollouts import TrainSample, build_batch, find_tokenizer


def rollout_segments(tokenizer: Any, rollout: Rollout, marker: str) -> tuple[list[tuple[int, int]], list[str]]:
    """Token spans over the rollout's sampled tokens (offset by given tokens) and each span's decoded text."""
    ids = list(rollout.response_token_ids)
    start = rollout.given_token_count
    pieces = [tokenizer.decode([t], skip_special_tokens=True) for t in ids[start:]]
    spans = [(a + start, b + start) for a, b in segment_token_spans(pieces, marker)]
    texts = [tokenizer.decode(ids[a:b], skip_special_tokens=True).strip() for a, b in spans]
    return spans, texts


@REASONING.scorers.implement("reference_outcome")
def reference_outcome_scores(ctx: Any, problems: Sequence[ReasoningProblem],
                             groups: Sequence[Sequence[Rollout]]) -> StepScores:
    """ExpRL-Outcome: the reference judge's normalised score of each whole rollout."""
    return reference_scores(ctx, problems, groups, process=False)


@REASONING.scorers.implement("reference_process")
def reference_process_scores(ctx: Any, problems: Sequence[ReasoningProblem],
                             groups: Sequence[Sequence[Rollout]]) -> StepScores:
    """ExpRL-Process: the reference judge's per-segment scores and the segment token advantages."""
    return reference_scores(ctx, problems, groups, process=True)


def reference_scores(ctx: Any, problems: Sequence[ReasoningProblem], groups: Sequence[Sequence[Rollout]],
                     process: bool) -> StepScores:
    """ExpRL-Outcome / ExpRL-Process scoring of a step (module docstring): one judge batch for the step."""
    ecfg = ctx.cfg.exprl
    norm, view = str(ecfg.normalisation), str(ecfg.segment_view)
    n, g = len(groups), max((len(x) for x in groups), default=0)
    rewards, valid = torch.zeros(n, g), torch.zeros(n, g, dtype=torch.bool)
    requests: list[ScoreRequest] = []
    where: list[tuple[int, int]] = []
    spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
    tokenizer = find_tokenizer(ctx.generator) if process else None
    truncated = single = 0
    zero_truncated = str(ecfg.get("truncated", "judge")) == "zero"
    for i, (problem, group) in enumerate(zip(problems, groups)):
        for j, r in enumerate(group):
            if process:
                spans[i, j], texts = rollout_segments(tokenizer, r, str(ecfg.segment_marker))
                single += len(texts) == 1
            if not r.finished:  # truncated: exprl.truncated says how (one rule for both modes, DESIGN §8.2)
                truncated += 1
                if zero_truncated:  # scores 0, never sent to the judge
                    valid[i, j] = True
                    continue
            requests.append(ScoreRequest(problem, r.response_text, tuple(texts) if process else None))
            where.append((i, j))
    calls_before = ctx.reference_judge_calls()
    scores = ctx.reference_judge.score(requests, view) if requests else []
    if len(scores) != len(requests):
        raise RuntimeError(f"reference judge returned {len(scores)} results for {len(requests)} rollouts")
    token_adv: dict[tuple[int, int], torch.Tensor] = {}
    seg_scores: dict[tuple[int, int], list[float]] = {}
    for (i, j), got in zip(where, scores):
        if got is None:
            continue  # unknown: excluded from the group's statistics and from the batch
        if process and len(got) != len(spans[i, j]):
            raise RuntimeError(f"reference judge returned {len(got)} scores for {len(spans[i, j])} segments")
        normed = [normalise_score(s, norm) for s in got]
        seg_scores[i, j] = normed
        rewards[i, j], valid[i, j] = normed[-1], True
    if process:
        for i, group in enumerate(groups):
            for j, r in enumerate(group):
                if not valid[i, j]:
                    continue
                length = len(r.response_token_ids)
                s = seg_scores.get((i, j), [0.0] * len(spans[i, j]))  # truncated, zero rule: every segment 0
                token_adv[i, j] = token_process_advantages(spans[i, j], s, length)
    metrics = {"exprl/truncated": truncated, "exprl/truncated_zero": truncated if zero_truncated else 0,
               "exprl/judged_rollouts": len(requests),
               "judge/step_calls": ctx.reference_judge_calls() - calls_before,
               "judge/unknown_excluded": int(sum(s is None for s in scores))}
    if process:
        n_seg = [len(v) for v in spans.values()]
        metrics.update({"exprl/segments_mean": sum(n_seg) / max(1, len(n_seg)), "exprl/single_segment": single})
    return StepScores(rewards, valid, token_adv if process else None, metrics)


def teacher_messages(problem: ReasoningProblem, intro: str) -> list[dict]:
    """The self-distillation teacher's context: the problem with the reference appended to its last turn."""
    msgs = [dict(m) for m in problem.messages]
    sep = f" {intro} " if intro else " "
    msgs[-1]["content"] = f"{msgs[-1]['content']}{sep}{problem.reference_solution}"
    return msgs


def self_distillation_advantages(ctx: Any, problems: Sequence[ReasoningProblem], groups, valid: torch.Tensor,
                                 batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-token advantages [B, T] log pi_teacher(y_t) - prev log pi_student(y_t) on the batch's response tokens,
    the teacher being the current policy with the reference in context (no gradient through it)."""
    intro = str(ctx.cfg.exprl.teacher_intro)
    rows = [(problems[i], r) for i, g in enumerate(groups) for j, r in enumerate(g) if bool(valid[i, j])]
    teacher = build_batch([TrainSample(ctx.generator.encode_prompt(teacher_messages(p, intro)),
                                       list(r.response_token_ids), 0, 0.0, [], sampled_under_train_prompt=False,
                                       given_tokens=r.given_token_count) for p, r in rows], ctx.pad_id)
    teacher_lp = ctx.policy.get_logprobs(teacher)  # [B, T'] under the teacher context
    out = torch.zeros_like(batch["token_mask"])
    student_lp = batch["prev_logprobs"]
    for row in range(out.shape[0]):
        s_pos = batch["token_mask"][row].nonzero().flatten()
        t_pos = teacher["token_mask"][row].nonzero().flatten()
        if len(s_pos) != len(t_pos):
            raise RuntimeError(f"self-distillation: row {row} has {len(s_pos)} student but {len(t_pos)} teacher tokens")
        out[row, s_pos] = teacher_lp[row, t_pos].to(out.dtype) - student_lp[row, s_pos].to(out.dtype)
    return out


@REASONING.advantages.implement("segment")
def segment_advantage_columns(ctx: ReasoningContext, problems, groups, scored: StepScores,
                              batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """ExpRL-Process: the scorer's per-token segment advantages, no group normalisation."""
    if scored.token_advantages is None:
        raise ValueError(f"method {ctx.method.name!r}: advantage 'segment' needs a scorer that gives per-token "
                         f"advantages; scorer {ctx.scorer.name!r} gives none")
    batch["token_advantages"] = place_token_advantages(batch, groups, scored.valid, scored.token_advantages)
    batch["advantages"] = torch.zeros(batch["token_mask"].shape[0])
    return {}


@REASONING.advantages.implement("self_distillation")
def self_distillation_advantage_columns(ctx: ReasoningContext, problems, groups, scored: StepScores,
                                        batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """On-policy self-distillation: the reference-in-context teacher's per-token advantages."""
    batch["token_advantages"] = self_distillation_advantages(ctx, problems, groups, scored.valid, batch)
    batch["advantages"] = torch.zeros(batch["token_mask"].shape[0])
    mask = batch["token_mask"].bool()
    return {"distill/reverse_kl": float(-batch["token_advantages"][mask].mean()) if bool(mask.any()) else None}
