"""Group-relative advantages (RISE-RL eq. 1), reference advantages for guidance (eqs. 7-8) and the
coupled ablation (eq. 1 over the joined natural + privileged group).

Standard deviation: we use the *unbiased* (Bessel-corrected, divide by n-1) sample std, which is torch's
default ``Tensor.std`` and what NeMo-RL's GRPO (``calculate_baseline_and_std_per_prompt``) uses, so the
local and nemo backends give identical advantages. A group with fewer than 2 valid samples, or with
all-equal rewards, has std 0 and gets advantage exactly 0 (never NaN): such a group carries no
group-relative signal.

Exactness: the statistics are accumulated in float64. A float32 sum of n copies of 0.3 is not n * 0.3, so a
float32 mean of an all-equal group differs from its members and the group got advantages of +-0.03 instead of
0 (and a privileged reward equal to every natural reward looked like a gain, A_ref > 0). In float64 the sum
of n float32 values is exact for any realistic n, so mean == r_i holds exactly for an equal group; the
equal-group test (max == min over valid entries) is explicit as well.
"""

from __future__ import annotations

import torch

__all__ = [
    "group_advantages",
    "reference_advantages",
    "retained",
    "coupled_group_advantages",
    "masked_group_stats",
]


def masked_group_stats(
    rewards: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, unbiased std and valid count over the last dim, counting only ``valid`` entries.

    rewards, valid: [..., G]. Returns (mean [...], std [...], count [...]) in ``rewards``' dtype; std is 0
    where count < 2 and exactly 0 where every valid reward is equal. Accumulated in float64 (module doc).
    """
    r64 = rewards.to(torch.float64)
    v = valid.bool()
    vf = v.to(torch.float64)
    count = vf.sum(-1)  # [...]
    mean = (r64 * vf).sum(-1) / count.clamp(min=1)
    centred = (r64 - mean.unsqueeze(-1)) * vf
    var = (centred**2).sum(-1) / (count - 1).clamp(min=1)  # Bessel's correction, like torch.std
    highest = torch.where(v, r64, torch.full_like(r64, -torch.inf)).amax(-1)
    lowest = torch.where(v, r64, torch.full_like(r64, torch.inf)).amin(-1)
    varied = (count >= 2) & (highest > lowest)
    std = torch.where(varied, var.sqrt(), torch.zeros_like(var))
    out = rewards.dtype
    return mean.to(out), std.to(out), count.to(out)


def group_advantages(rewards, eps: float = 1e-6, valid=None) -> torch.Tensor:
    """Eq. 1: A_i = (r_i - mean_G r) / (std_G r + eps), one value per response, shared by its tokens.

    rewards: [N, G] (N prompts, G responses each; any leading shape works, the group is the last dim).
    valid: optional bool [N, G]; False marks a response whose reward is unknown (a judge verdict could not
    be obtained). Invalid responses are excluded from the mean and std and get advantage 0.
    Groups with std 0 (all valid rewards equal, or < 2 valid samples) get advantage 0.
    Returns float [N, G].
    """
    r = torch.as_tensor(rewards)
    r = r if r.is_floating_point() else r.to(torch.float32)
    v = (
        torch.ones_like(r, dtype=torch.bool)
        if valid is None
        else torch.as_tensor(valid, device=r.device).bool()
    )
    if v.shape != r.shape:
        raise ValueError(f"valid mask shape {tuple(v.shape)} != rewards shape {tuple(r.shape)}")
    # Unknown rewards may be NaN placeholders: zero them before they can poison the sums.
    r = torch.where(v, r, torch.zeros_like(r))
    mean, std, _ = masked_group_stats(r, v)
    adv = (r - mean.unsqueeze(-1)) / (std.unsqueeze(-1) + eps)
    informative = (std > 0).unsqueeze(-1) & v
    return torch.where(informative, adv, torch.zeros_like(adv))


def reference_advantages(priv_rewards, natural_rewards, natural_valid=None) -> torch.Tensor:
    """Eq. 7: A_ref_j = r_priv_j - mean(r_nat), the privileged response's gain over the natural baseline.

    priv_rewards: [..., G'] (scored on the complete ORIGINAL rubric); natural_rewards: [..., G].
    natural_valid: optional bool [..., G] excluding unknown natural rewards from the baseline; a group with
    no valid natural reward gets NaN (never retained).
    No std normalisation: the guide loss weights trajectories by clip(A_ref, 0, A_max) (eq. 11).
    """
    rp = torch.as_tensor(priv_rewards, dtype=torch.float32)
    rn = torch.as_tensor(natural_rewards, dtype=torch.float32)
    v = (
        torch.ones_like(rn, dtype=torch.bool)
        if natural_valid is None
        else torch.as_tensor(natural_valid).bool()
    )
    rn = torch.where(v, rn, torch.zeros_like(rn))
    mean, _, count = masked_group_stats(rn, v)
    # A group without any known natural reward has no baseline: A_ref is NaN there, which ``retained``
    # (A_ref > 0) rejects, so such privileged responses are never trained on.
    mean = torch.where(count > 0, mean, torch.full_like(mean, float("nan")))
    return rp - mean.unsqueeze(-1)


def retained(a_ref) -> torch.Tensor:
    """Eq. 8: keep only reward-improving privileged trajectories, A_ref > 0. Returns bool, same shape."""
    return torch.as_tensor(a_ref) > 0


def coupled_group_advantages(
    nat_rewards, priv_rewards, eps: float = 1e-6, nat_valid=None, priv_valid=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Coupled ablation (docs/DESIGN.md §2, also RuscaRL's training rule): eq. 1 over the joined group.

    The privileged responses, re-scored under the original prompt, join the natural ones in one GRPO
    group, so they DO shift the natural mean/std (the effect RISE-RL's decoupling avoids).
    nat_rewards: [N, G]; priv_rewards: [N, G']. Returns (natural advantages [N, G], privileged [N, G']).
    """
    rn = torch.as_tensor(nat_rewards, dtype=torch.float32)
    rp = torch.as_tensor(priv_rewards, dtype=torch.float32)
    if rn.shape[:-1] != rp.shape[:-1]:
        raise ValueError(
            f"natural {tuple(rn.shape)} and privileged {tuple(rp.shape)} rewards differ in leading dims"
        )
    vn = torch.ones_like(rn, dtype=torch.bool) if nat_valid is None else torch.as_tensor(nat_valid).bool()
    vp = torch.ones_like(rp, dtype=torch.bool) if priv_valid is None else torch.as_tensor(priv_valid).bool()
    joined = group_advantages(torch.cat([rn, rp], -1), eps=eps, valid=torch.cat([vn, vp], -1))
    g = rn.shape[-1]
    return joined[..., :g], joined[..., g:]
