"""The reasoning batch's row order (steps.reasoning): row b is the b-th valid rollout in (problem,
sample) order. The readers that map rows back to rollouts (place_token_advantages, RRL's after_score, the
perplexity variance) check it through batch_rollouts: a reordered batch is an error, never a silent mismatch."""

from __future__ import annotations

import pytest
import torch
from tiny_task import chain_recipe

from rise_nemo.config import config_from_dict
from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.interfaces import Rollout
from rise_nemo.steps.reasoning import (
    batch_rollouts,
    place_token_advantages,
    rollout_batch,
    scratch_perplexity_variance,
)
from rise_nemo.steps.rrl import RRLHooks


def _rollout(prompt: list[int], response: list[int]) -> Rollout:
    return Rollout([{"role": "user", "content": "q"}], prompt, response, "", [-0.5] * len(response))


def _step():
    """2 problems x 3 samples, rollout (0, 1) invalid: 5 rows, every response distinct."""
    groups = [[_rollout([1, 2], [10 + j] * (j + 1)) for j in range(3)],
              [_rollout([3, 4, 5], [20 + j] * (2 + j)) for j in range(3)]]
    valid = torch.tensor([[True, False, True], [True, True, True]])
    return groups, valid, rollout_batch(groups, valid, pad_id=0)


def _swap_rows(batch: dict[str, torch.Tensor], a: int, b: int) -> dict[str, torch.Tensor]:
    order = list(range(batch["input_ids"].shape[0]))
    order[a], order[b] = order[b], order[a]
    return {k: v[order] for k, v in batch.items()}


def test_row_b_is_the_b_th_valid_rollout():
    groups, valid, batch = _step()
    rows = batch_rollouts(batch, groups, valid)
    assert [(i, j) for i, j, _ in rows] == [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2)]
    per_rollout = {(i, j): torch.full((len(r.response_token_ids),), float(10 * i + j)) for i, j, r in rows}
    placed = place_token_advantages(batch, groups, valid, per_rollout)
    for b, (i, j, r) in enumerate(rows):
        assert placed[b][batch["token_mask"][b].bool()].tolist() == [float(10 * i + j)] * len(r.response_token_ids)


def test_every_reader_rejects_reordered_rows():
    groups, valid, batch = _step()
    swapped = _swap_rows(batch, 0, 1)
    batch["prev_logprobs"] = swapped["prev_logprobs"] = -torch.ones_like(batch["token_mask"])
    assert scratch_perplexity_variance(batch, groups, valid) is not None  # the batch as built is accepted
    per_rollout = {(i, j): torch.ones(len(r.response_token_ids)) for i, j, r in batch_rollouts(batch, groups, valid)}
    msg = r"batch row 0 does not hold valid rollout 0 \(problem 0, sample 0\)"
    with pytest.raises(ValueError, match=msg):
        place_token_advantages(swapped, groups, valid, per_rollout)
    with pytest.raises(ValueError, match=msg):
        scratch_perplexity_variance(swapped, groups, valid)
    cfg = config_from_dict(chain_recipe("rrl"))
    hooks = RRLHooks(cfg, n_train_problems=2)
    problems = [ReasoningProblem(f"p{i}", [{"role": "user", "content": "q"}], reference_solution="1", answer="1")
                for i in range(2)]
    rewards = torch.zeros(2, 3)
    swapped["values"] = batch["values"] = torch.zeros_like(batch["token_mask"])
    hooks.after_score(None, problems, groups, rewards, valid, batch)  # accepted as built
    with pytest.raises(ValueError, match=msg):
        hooks.after_score(None, problems, groups, rewards, valid, swapped)
    with pytest.raises(ValueError, match=r"batch has 4 rows for 5 valid rollouts"):
        batch_rollouts({k: v[:4] for k, v in batch.items()}, groups, valid)
