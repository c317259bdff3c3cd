"""Rubric rewards and criterion selection (RISE-RL eqs. 2-5).

Verdict convention (docs/DESIGN.md §2): ``verdicts[..., k]`` is 1 when the response *meets* criterion k, i.e.
the statement of the criterion holds. For a negative-points criterion (an undesirable behaviour) "met"
means the behaviour occurred, which subtracts its points (HealthBench convention) and counts as a
*failure* for selection.
"""

from __future__ import annotations

import torch

__all__ = ["rubric_reward", "failure_matrix", "criterion_priority", "select_feedback", "reward_model_rewards"]


def _as_float_tensor(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.is_floating_point():
        return t
    return t.to(torch.float32)


def _check_weights(verdicts: torch.Tensor, weights: torch.Tensor) -> None:
    if weights.dim() != 1:
        raise ValueError(f"weights must be 1-D [K], got shape {tuple(weights.shape)}")
    if verdicts.dim() < 1 or verdicts.shape[-1] != weights.shape[0]:
        raise ValueError(
            f"verdicts last dim must equal the number of criteria K={weights.shape[0]}, "
            f"got verdicts shape {tuple(verdicts.shape)}"
        )


def rubric_reward(verdicts, weights, clip_min: float | None = None) -> torch.Tensor:
    """Weighted rubric reward, eq. 3, with the HealthBench negative-points convention.

    r = sum_k w_k z_k / sum_{k: w_k > 0} w_k

    The paper writes the denominator as sum_k w_k, which equals the positive total when all points are
    positive; with negative points (HealthBench) the denominator is the positive total, so a response
    meeting every positive and no negative criterion scores exactly 1, and met negative criteria subtract
    (the reward can be < 0 unless ``clip_min`` is given, e.g. 0.0).

    verdicts: [..., K] bool or float in {0, 1}; weights: [K]. Returns [...] (dtype float32 or the
    verdicts' float dtype).
    Example (HealthBench README): points 7, 5, 10, -6 met T, F, T, T -> (7 + 10 - 6) / 22 = 0.5.
    """
    z = _as_float_tensor(verdicts, "verdicts")
    w = torch.as_tensor(weights, dtype=z.dtype, device=z.device)
    _check_weights(z, w)
    positive_total = w.clamp(min=0).sum()
    if positive_total <= 0:
        raise ValueError("rubric has no criterion with positive points: eq. 3 is undefined")
    r = (z * w).sum(-1) / positive_total
    if clip_min is not None:
        r = r.clamp(min=clip_min)
    return r


def failure_matrix(verdicts, weights) -> torch.Tensor:
    """Which responses fail which criterion: bool [G, K].

    A positive criterion fails when *not met*; a negative criterion (w_k < 0) fails when *met*
    (the undesirable behaviour occurred). Zero-weight criteria never count as failures (priority 0).
    """
    z = torch.as_tensor(verdicts).bool()
    w = torch.as_tensor(weights, dtype=torch.float32)
    _check_weights(z, w)
    positive = (w > 0).to(z.device)
    negative = (w < 0).to(z.device)
    return (positive & ~z) | (negative & z)


def criterion_priority(verdicts, weights) -> torch.Tensor:
    """Eq. 4 generalised to signed points: p_k = |w_k| f_k, f_k = sum_i fail_ik over the G natural responses.

    The paper writes p_k = w_k sum_i (1 - z_ik), which assumes positive weights; with a negative criterion
    "failing" means meeting it, and its importance is |w_k| (docs/DESIGN.md §2). Returns float32 [K].
    """
    fails = failure_matrix(verdicts, weights)  # [G, K]
    f = fails.sum(0).to(torch.float32)  # [K]
    w = torch.as_tensor(weights, dtype=torch.float32, device=f.device)
    return w.abs() * f


def select_feedback(priority, failures, top_m: int | None) -> list[int]:
    """Eq. 5, TopM: indices of the ``top_m`` highest-priority criteria among those with f_k > 0.

    priority: [K] (eq. 4); failures: [K] failure counts f_k. Ties are broken by the lower criterion index
    (deterministic, so runs are reproducible). ``top_m=None`` selects every failed criterion. The result is
    ordered by decreasing priority.
    """
    p = torch.as_tensor(priority, dtype=torch.float64).flatten()
    f = torch.as_tensor(failures).flatten()
    if p.shape != f.shape:
        raise ValueError(
            f"priority {tuple(p.shape)} and failures {tuple(f.shape)} must have the same shape [K]"
        )
    if top_m is not None and top_m < 0:
        raise ValueError(f"top_m must be >= 0 or None, got {top_m}")
    candidates = [k for k in range(p.numel()) if f[k] > 0]
    # Python's sort is stable: sorting by -priority keeps lower indices first among equal priorities.
    candidates.sort(key=lambda k: -float(p[k]))
    return candidates if top_m is None else candidates[:top_m]


def reward_model_rewards(scores, valid, offset: float = 0.0, normalize: str = "none",
                         clip: float | None = None) -> torch.Tensor:
    """Rewards [N, G] from a Bradley-Terry reward model's scalar scores [N, G] (docs/methods.md
    "Reward-model reward"): ``scores - offset`` (a fixed baseline, e.g. the RM's mean score on reference
    replies), then ``normalize``: ``none`` (the raw score, as TRL's RLOO/PPO and NeMo-RL's reward-model
    environment use it) or ``batch`` (whitened over the step's valid rollouts with core.value.whiten, Bessel's
    correction), then clipped to [-clip, clip] when ``clip`` is set (OpenRLHF's reward clip). Invalid entries
    are 0 (never trained on)."""
    from rise_nemo.core.value import whiten

    s = _as_float_tensor(scores, "scores") - float(offset)
    mask = torch.as_tensor(valid, dtype=torch.bool)
    if s.shape != mask.shape:
        raise ValueError(f"scores {tuple(s.shape)} and valid {tuple(mask.shape)} differ in shape")
    if normalize == "batch":
        s = whiten(s, mask)
    elif normalize != "none":
        raise ValueError(f"normalize must be 'none' or 'batch', got {normalize!r}")
    if clip is not None:
        s = s.clamp(-float(clip), float(clip))
    return torch.where(mask, s, torch.zeros_like(s))
