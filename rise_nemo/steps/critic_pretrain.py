"""Critic pre-training on the warm start's rollouts (docs/DESIGN.md §9.5); how well the critic ranks states is
``critic/auc`` (rise_nemo.steps.reasoning.prefix_value_auc), reported before and after.

``pretrain_critic`` (``ppo.critic_pretrain_*``): before RL, sample ``critic_pretrain_rollouts`` completions
per training problem from the warm-started policy, score them with the verifier (0/1), and fit the critic
to the Monte-Carlo returns (gamma = ``ppo.gae_gamma``; with a sparse terminal reward every token's target is
the rollout's reward) for ``critic_pretrain_updates`` AdamW steps at ``critic_pretrain_lr`` on minibatches of
``critic_pretrain_batch`` rollouts drawn from a fresh seeded permutation each pass (shuffled: minibatches
sorted by level collapsed the critic to a constant). No value clipping (there is no old critic to stay near).
A fifth of the problems is held out of the fit; the AUC on their rollouts before and after is reported.
verl's ``ppo.critic_warmup_steps`` is a different thing (on-policy, one update per step at ``critic_lr``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from rise_nemo.core.value import make_value_loss, monte_carlo_returns, terminal_token_rewards
from rise_nemo.interfaces import TunableCritic
from rise_nemo.steps.reasoning import prefix_value_auc, rollout_batch, verify_rewards
from rise_nemo.steps.rollouts import STREAM_NATURAL, sampling_params

STREAM_CRITIC_PRETRAIN = 7  # the pre-training rollouts' sampling stream (never a training step's)


def pretrain_critic(ctx: Any, problems: Sequence[Any], seed: int, progress: bool = False) -> dict[str, Any]:
    """``ppo.critic_pretrain_*`` (module docstring) on ``ctx.critic``; returns metrics
    (critic_pretrain/auc_before, auc_after on the held-out fifth, value_loss, rollouts, seconds)."""
    import time

    p = ctx.cfg.ppo
    updates, lr = int(p.critic_pretrain_updates), float(p.critic_pretrain_lr)
    size, per_problem = int(p.critic_pretrain_batch), int(p.critic_pretrain_rollouts)
    if not isinstance(ctx.critic, TunableCritic):
        raise ValueError("config key 'ppo.critic_pretrain_updates': critic pre-training needs the local backend's "
                         "critic (an optimizer to set critic_pretrain_lr on)")
    optimizer = ctx.critic.optimizer
    t0 = time.perf_counter()
    rng = random.Random(f"critic-pretrain-{seed}")
    order = list(range(len(problems)))
    rng.shuffle(order)
    n_hold = max(1, len(problems) // 5) if len(problems) >= 2 else 0
    held, fit = [problems[i] for i in order[:n_hold]], [problems[i] for i in order[n_hold:]]
    params = sampling_params(ctx.cfg, 0, STREAM_NATURAL + STREAM_CRITIC_PRETRAIN)

    def rollouts(probs):
        groups = ctx.generator.generate([list(q.messages) for q in probs], per_problem, params)
        rewards, valid = verify_rewards(ctx.verifier, probs, groups)
        batch = rollout_batch(groups, valid, ctx.pad_id)
        batch["returns"] = monte_carlo_returns(terminal_token_rewards(rewards[valid], batch["token_mask"]),
                                               batch["token_mask"], float(p.gae_gamma))
        return groups, valid, batch

    fit_groups, _, fit_batch = rollouts(fit)
    held_groups, held_valid, held_batch = (rollouts(held) if held else (None, None, None))

    def held_auc():
        if not held:
            return None
        return prefix_value_auc(ctx, held, held_groups, held_valid, held_batch, ctx.critic.get_values(held_batch))

    before = held_auc()
    value_loss = make_value_loss(None)
    saved = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = lr
    rows, perm, losses = fit_batch["input_ids"].shape[0], [], []
    try:
        for u in range(updates):
            take = []
            while len(take) < min(size, rows):
                if not perm:
                    perm = list(range(rows))
                    rng.shuffle(perm)
                take.append(perm.pop())
            mb = _rows(fit_batch, take)
            losses.append(float(ctx.critic.train(mb, value_loss).get("critic/value_loss", float("nan"))))
            if progress and (u + 1) % max(1, updates // 10) == 0:
                print(f"critic pre-training {u + 1}/{updates}: value loss {losses[-1]:.4f}", flush=True)
    finally:
        for g, old in zip(optimizer.param_groups, saved):
            g["lr"] = old
    return {"critic_pretrain/auc_before": before, "critic_pretrain/auc_after": held_auc(),
            "critic_pretrain/value_loss_first": losses[0] if losses else None,
            "critic_pretrain/value_loss_last": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
            "critic_pretrain/rollouts": rows, "critic_pretrain/reward_mean":
                float(fit_batch["returns"].amax(dim=1).mean()),
            "critic_pretrain/seconds": time.perf_counter() - t0}


def _rows(batch: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    """The minibatch of ``rows`` with the value-loss columns: no clip anchor (zeros), the minibatch's own
    masked-token count as the normaliser."""
    idx = torch.tensor(rows, dtype=torch.long)
    out = {k: v[idx] for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() >= 1
           and v.shape[0] == batch["input_ids"].shape[0]}
    out["values"] = torch.zeros_like(out["returns"])
    out["value_token_count"] = torch.full((len(rows),), float(out["token_mask"].sum()))
    return out
