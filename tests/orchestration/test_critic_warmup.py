"""Critic warm-up (``ppo.critic_warmup_steps``, verl's ``trainer.critic_warmup``; docs/DESIGN.md §7): during the
first K steps every critic method trains only its critic, the policy is untouched; after them the step is the
ordinary one. Resume across the boundary is exact (only the step number decides)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_rrl import _cfg, _reproducible
from tiny_task import chain_recipe

from rise_nemo.config import config_from_dict
from rise_nemo.config.loader import ConfigError
from rise_nemo.loop.run import build_trainer
from rise_nemo.loop.trainer import read_metrics
from rise_nemo.steps.reasoning import reasoning_train_step


def _weights(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


class Alternating:
    """Half the rollouts right: non-zero returns (the critic's zero-initialised head gets a gradient) and
    non-zero advantages."""

    def verify(self, problems, responses):
        return [i % 2 == 0 for i in range(len(responses))]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("method", ["ppo", "rrl"])
def test_warmup_trains_the_critic_and_leaves_the_policy_unchanged(tmp_path: Path, method: str):
    trainer = build_trainer(_cfg(tmp_path / "run", 3, method, "ppo.critic_warmup_steps=2"))
    ctx, policy, critic = trainer.ctx, trainer.policy.model, trainer.critic
    ctx.verifier = Alternating()
    for step in (1, 2):
        p0, c0 = _weights(policy), _weights(critic)
        m = reasoning_train_step(ctx, trainer.sampler.next_batch(), step)
        assert _same(p0, _weights(policy)), f"policy changed during warm-up step {step}"
        assert not _same(c0, _weights(critic)), f"critic did not train during warm-up step {step}"
        assert m["critic/warmup"] == 1.0 and m["critic/value_loss"] is not None and m["loss/pg"] is None
    p0, c0 = _weights(policy), _weights(critic)
    m = reasoning_train_step(ctx, trainer.sampler.next_batch(), 3)
    assert not _same(p0, _weights(policy)) and not _same(c0, _weights(critic))
    assert m["critic/warmup"] == 0.0 and m["loss/pg"] is not None


def test_default_is_no_warmup_and_no_new_metric(tmp_path: Path):
    trainer = build_trainer(_cfg(tmp_path / "run", 1, "ppo"))
    trainer.ctx.verifier = Alternating()
    p0, c0 = _weights(trainer.policy.model), _weights(trainer.critic)
    m = reasoning_train_step(trainer.ctx, trainer.sampler.next_batch(), 1)
    assert not _same(c0, _weights(trainer.critic)) and m["critic/value_loss"] is not None
    assert not _same(p0, _weights(trainer.policy.model)) and "critic/warmup" not in m and m["loss/pg"] is not None


def test_resume_across_the_warmup_boundary_is_exact(tmp_path: Path):
    full, parts = tmp_path / "full", tmp_path / "parts"
    args = ("rrl", "ppo.critic_warmup_steps=2")
    assert build_trainer(_cfg(full, 4, *args)).run() == 0
    assert build_trainer(_cfg(parts, 4, *args), stop_after=1).run() == 0  # stops inside the warm-up
    resumed = build_trainer(_cfg(parts, 4, *args))
    assert resumed.run() == 0
    a, b = read_metrics(full), read_metrics(parts)
    assert _reproducible(a) == _reproducible(b)
    assert [m["critic/warmup"] for m in a] == [1.0, 1.0, 0.0, 0.0]


def test_negative_warmup_names_the_key():
    with pytest.raises(ConfigError, match=r"key .ppo\.critic_warmup_steps.*>= 0"):
        config_from_dict(chain_recipe("ppo"), ["ppo.critic_warmup_steps=-1"])
