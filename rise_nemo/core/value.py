"""Value-based advantages for PPO-style reasoning methods (PPO baseline, RRL): GAE, the clipped value loss,
explained variance (docs/DESIGN.md §7).

Conventions (NeMo-RL's ``GeneralizedAdvantageEstimator`` and ``MseValueLossFn``, v0.7.0):
- Every tensor is [B, T], aligned with ``input_ids``. ``values[b, t] = V(input_ids[b, :t])`` is the value of
  the state a token at position t is sampled from (the right shift of interfaces.Critic).
- ``mask`` [B, T] is 1 on the tokens that are actions (sampled response tokens). Given (replayed) prefix
  tokens, the prompt and padding are 0: the recursion carries its accumulators across them unchanged
  ("carry-forward masking"), so the first sampled token after a given prefix starts its advantage from
  V(prompt + prefix): GAE starts at the state and is bootstrapped from the critic there.
- The sparse reward of a response sits on its LAST action token; the state after it is terminal (V = 0).
"""

from __future__ import annotations

import torch

__all__ = ["terminal_token_rewards", "gae", "monte_carlo_returns", "whiten", "clipped_value_loss",
           "explained_variance", "value_objective", "make_value_loss"]


def terminal_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] sequence rewards -> [B, T] token rewards: r on the last mask=1 position of each row, else 0."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has = mask.bool().any(dim=1)
    last = mask.shape[1] - 1 - mask.bool().fliplr().to(torch.int8).argmax(dim=1)
    rows = has.nonzero().squeeze(1)
    out[rows, last[rows]] = rewards.to(out.dtype)[rows]
    return out


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al., 2016, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", eqs. 11-16), computed by the backward recursion

        delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lambda * A_{t+1}          (A after the last action = 0, V(terminal) = 0)

    over the action positions (mask 1) only; s_{t+1} is the state of the NEXT action position of the row.
    lambda = 0 gives the one-step TD error, lambda = 1 the Monte-Carlo return minus V(s_t).

    token_rewards, values, mask: [B, T]. Returns (advantages, returns) [B, T], both 0 off the mask;
    returns = advantages + values are the value targets.
    """
    if not (0.0 <= lam <= 1.0 and 0.0 <= gamma <= 1.0):
        raise ValueError(f"gae: gamma and lambda must be in [0, 1], got gamma={gamma}, lambda={lam}")
    m = mask.to(torch.float32)
    r = token_rewards.to(torch.float32)
    v = values.to(torch.float32)
    b, t = m.shape
    next_value = torch.zeros(b, dtype=torch.float32, device=m.device)
    last_adv = torch.zeros_like(next_value)
    adv = torch.zeros(b, t, dtype=torch.float32, device=m.device)
    for i in reversed(range(t)):
        delta = r[:, i] + gamma * next_value - v[:, i]
        new_adv = delta + gamma * lam * last_adv
        # Carry-forward: off the mask the accumulators keep the values of the next action position.
        next_value = m[:, i] * v[:, i] + (1 - m[:, i]) * next_value
        last_adv = m[:, i] * new_adv + (1 - m[:, i]) * last_adv
        adv[:, i] = last_adv
    adv = adv * m
    return adv, (adv + v) * m


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    normalizer: float | torch.Tensor,
    clip: float | None = 0.2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss (NeMo-RL ``MseValueLossFn``):

        v_clip = old_v + clamp(v - old_v, -clip, clip)
        loss   = 0.5 * sum_{masked t} max((v - R)^2, (v_clip - R)^2) / normalizer

    ``clip`` None or <= 0 disables clipping (plain 0.5 * MSE). ``normalizer`` is the GLOBAL masked-token
    count, so micro-batch losses add up. Returns (loss, clipped-fraction numerator / normalizer).
    """
    mk = mask.bool()
    returns = returns.detach().to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip is not None and clip > 0:
        old = old_values.detach().to(values.dtype)
        clipped = (old + (values - old).clamp(-clip, clip) - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        frac = torch.where(mk, (clipped > unclipped).to(values.dtype), torch.zeros_like(values)).sum().detach()
    else:
        per_token, frac = unclipped, values.new_zeros(())
    loss = 0.5 * torch.where(mk, per_token, torch.zeros_like(per_token)).sum() / normalizer
    return loss, frac / normalizer


def monte_carlo_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """[B, T] discounted reward-to-go G_t = sum_k gamma^k r_(t+k) over the action positions (0 off the mask):
    ``gae`` with lambda = 1 and V = 0. With a sparse terminal reward and gamma = 1, every action token of a
    rollout holds the rollout's reward."""
    return gae(token_rewards, torch.zeros_like(token_rewards), mask, gamma, 1.0)[1]


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       mc_returns: torch.Tensor | None = None) -> float | None:
    """1 - Var[R - V] / Var[R] over masked tokens (1 = perfect critic, 0 = as good as a constant, < 0 worse),
    R = the value targets (GAE's lambda-returns, as NeMo-RL's ``critic/explained_var`` and verl's
    ``critic/vf_explained_var``).

    None (undefined, Stable-Baselines3 / CleanRL's NaN) when there is no return variance to explain:
    Var[R] = 0, or, given the Monte-Carlo returns ``mc_returns`` (``monte_carlo_returns``), Var[G] = 0. With
    lambda < 1, R = A + V mixes in the critic's own values, so in a batch where every rollout earned the same
    reward Var[R] is only the critic's own spread and the ratio is an arbitrary (often large negative)
    number; NeMo-RL and verl clamp the denominator and report it."""
    mk = mask.bool()
    r, v = returns[mk].double(), values[mk].double()
    if r.numel() < 2:
        return None
    if mc_returns is not None and float(mc_returns[mk].double().var(unbiased=False)) == 0.0:
        return None
    var_r = r.var(unbiased=False)
    if float(var_r) == 0.0:
        return None
    return float(1.0 - (r - v).var(unbiased=False) / var_r)


def value_objective(values: torch.Tensor, data, clip: float | None = 0.2) -> tuple[torch.Tensor, dict[str, float]]:
    """interfaces.LossFn of a Critic: ``clipped_value_loss`` on ``data``'s ``returns`` [B, T], ``values``
    [B, T] (the critic's values when the batch was built: the clipping anchor), ``token_mask`` [B, T]
    (action tokens) and ``value_token_count`` [B] (the global masked-token count, every row the same)."""
    mask = data["token_mask"].to(values.device)
    count = torch.as_tensor(data["value_token_count"]).reshape(-1)[0].to(values.dtype).clamp(min=1)
    loss, clip_frac = clipped_value_loss(values, data["values"].to(values.device), data["returns"].to(values.device),
                                         mask, count, clip)
    return loss, {"critic/value_loss": float(loss.detach()), "critic/clip_fraction": float(clip_frac)}


def make_value_loss(clip: float | None = 0.2):
    """A picklable ``value_objective`` with its clip range."""
    import functools

    return functools.partial(value_objective, clip=clip)


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked positions, 0 elsewhere, as NeMo-RL's GAE
    ``normalize_advantages`` does it (``_reward_whiten``, nemo_rl/algorithms/advantage_estimator.py:308-321):
    ``masked_var`` with Bessel's correction, n / (n - 1) (algorithms/utils.py:259-273), over the batch's
    action tokens. One masked token: x - mean = 0, so 0 (NeMo-RL would divide 0 by 0 there)."""
    mk = mask.bool()
    if not bool(mk.any()):
        return torch.zeros_like(x)
    vals = x[mk].double()
    mean = vals.mean()
    var = vals.var(unbiased=True) if vals.numel() > 1 else vals.new_zeros(())
    out = ((x.double() - mean) * torch.rsqrt(var + eps)).to(x.dtype)
    return torch.where(mk, out, torch.zeros_like(out))
