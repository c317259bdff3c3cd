"""The reward-model reward (docs/methods.md "Reward-model reward"): a scorer of the reasoning step. (The HH-RLHF
verifier, which evaluates against the dataset's chosen reply under the same reward model, is
rise_nemo.steps.verifiers.PreferenceVerifier.)

  scorer ``reward_model``   every rollout's conversation (the problem's messages + the response as the final
                            assistant turn) is scored by the run's Bradley-Terry reward model in ONE call per
                            step; rewards = core.rewards.reward_model_rewards (offset, none | batch whitening,
                            clip). A recipe picks it with ``reward.scorer: reward_model`` for any reasoning method
                            (ppo / rrl / grpo): the method's step, advantages and hooks are unchanged. Metrics:
                            ``rm/score_mean`` / ``rm/score_std`` (raw scores), ``rm/truncated``. Problems with
                            a reference reply (HH's chosen turn) have it scored in the same call: a rollout
                            scored above it "solved" its problem (``StepScores.solved``: RRL's "correct",
                            Algorithm 1 lines 9 and 14; ``rm/beats_reference``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.core.rewards import reward_model_rewards
from rise_nemo.interfaces import Rollout, TruncatingRewardModel
from rise_nemo.methods.registry import REASONING
from rise_nemo.steps.reasoning import ReasoningContext, StepScores
from rise_nemo.steps.rollouts import flat_call
from rise_nemo.steps.verifiers import conversation, require_reward_model


def truncated(rm: Any) -> int:
    """Conversations the reward model has cut so far (0 for one that does not count them)."""
    return int(rm.truncated) if isinstance(rm, TruncatingRewardModel) else 0


@REASONING.scorers.implement("reward_model")
def reward_model_scores(ctx: ReasoningContext, problems: Sequence[ReasoningProblem],
                        groups: Sequence[Sequence[Rollout]]) -> StepScores:
    """The reward model's score of every rollout (module docstring); every rollout is valid."""
    rm = require_reward_model(ctx.reward_model, "reward.scorer=reward_model")
    block = ctx.cfg.reward_model
    n, g = len(groups), max((len(x) for x in groups), default=0)
    convs = [[conversation(p, r.response_text) for r in group] for p, group in zip(problems, groups)]
    # The problems' reference replies (HH: the chosen turn) in the same call: "solved" = scored above it.
    refs = [conversation(p, p.reference_solution) for p in problems] if all(
        p.reference_solution for p in problems) else []
    truncated_before = truncated(rm)
    *rollout_scores, ref_flat = flat_call(rm.score, [*convs, refs], "reward model")
    scores, valid = torch.zeros(n, g), torch.zeros(n, g, dtype=torch.bool)
    for i, row in enumerate(rollout_scores):
        for j, score in enumerate(row):
            scores[i, j], valid[i, j] = float(score), True
    rewards = reward_model_rewards(scores, valid, offset=float(block.offset), normalize=str(block.normalize),
                                   clip=block.clip)
    raw = scores[valid]
    metrics = {"rm/score_mean": float(raw.mean()) if raw.numel() else None,
               "rm/score_std": float(raw.std()) if raw.numel() > 1 else None,
               "rm/truncated": truncated(rm) - truncated_before}
    solved = None
    if refs:
        ref_scores = torch.tensor([float(x) for x in ref_flat]).reshape(-1, 1)
        solved = (scores > ref_scores) & valid
        metrics["rm/reference_score_mean"] = float(ref_scores.mean())
        metrics["rm/beats_reference"] = float(solved[valid].float().mean()) if bool(valid.any()) else None
    return StepScores(rewards, valid, metrics=metrics, solved=solved)


