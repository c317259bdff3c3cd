"""Losses of RISE-RL: clipped policy gradient on natural rollouts, the selective guide loss (eqs. 9-11)
and the decoupled objective (eq. 12), plus the k3 KL, an entropy bonus and DAPO's overlong penalty.

Everything works on per-token log-probs [B, T] aligned with input_ids (rise_nemo.interfaces) and masks,
so the same function serves the local policy and NeMo-RL's LossFunction wrapper.

Normalisation (why the per-sample count columns exist): NeMo-RL and our local policy split a global batch
into micro-batches, call the loss on each and SUM the losses (and metrics). A loss is micro-batch
invariant only if every term divides by a count taken over the WHOLE global batch. The caller therefore
puts these counts in the data as per-sample columns (every row holds the same value):
  natural_token_count [B]  valid response tokens of natural rows in the global batch (token-level loss)
  guided_seq_count   [B]  |O_ref|, retained guided trajectories in the global batch (eq. 11's 1/|O_ref|)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from rise_nemo.core.loss_defaults import LOSS_DEFAULTS, loss_rule_violations

__all__ = [
    "ObjectiveConfig",
    "clipped_pg_loss",
    "kl_k3",
    "entropy_bonus",
    "overlong_penalty",
    "log_policy_support",
    "guide_loss",
    "policy_objective",
    "policy_loss_fn",
    "loss_needs_reference_logprobs",
]

# The data column ``kind`` [B]: which rows are natural rollouts (clipped PG) and which guided (eq. 11).
KIND_NATURAL = 0
KIND_GUIDED = 1

TokenWeighting = Literal["policy_support", "uniform"]


@dataclass(frozen=True)
class ObjectiveConfig:
    """Hyper-parameters of eq. 12. Defaults are the paper's (docs/DESIGN.md §2): clip 0.2 / 0.28, KL 0,
    entropy 0, gamma 0.1; lambda_guide 0.05 (writing/chat; use 0.01 for health/science).

    token_weighting: "policy_support" uses log rho = log p/(p+gamma) (eqs. 9-10); "uniform" is the
    ablation that uses log p, i.e. every guided token weighted equally (plain weighted SFT).
    a_max: cap of the trajectory weight clip(A_ref, 0, a_max) (eq. 11); rewards lie in [<=0, 1], so 1.0
    leaves every gain uncapped unless the rubric reward is rescaled.
    """

    clip_low: float = LOSS_DEFAULTS["clip_low"]
    clip_high: float = LOSS_DEFAULTS["clip_high"]
    kl_coef: float = LOSS_DEFAULTS["kl_coef"]
    entropy_coef: float = LOSS_DEFAULTS["entropy_coef"]
    lambda_guide: float = LOSS_DEFAULTS["lambda_guide"]
    gamma: float = LOSS_DEFAULTS["gamma"]
    a_max: float = LOSS_DEFAULTS["a_max"]
    token_weighting: TokenWeighting = "policy_support"

    def __post_init__(self) -> None:
        # One rule set with the recipe schema (core.loss_defaults); the loader applies it at load time.
        # token_weighting is checked once, where it is read (guide_loss).
        for key, msg in loss_rule_violations({k: getattr(self, k) for k in LOSS_DEFAULTS}):
            raise ValueError(f"{key} {msg}")


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(x * mask) that ignores whatever (even inf/NaN) sits at masked-out positions."""
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum()


def clipped_pg_loss(
    logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    normalizer: float | torch.Tensor,
    clip_low: float = LOSS_DEFAULTS["clip_low"],
    clip_high: float = LOSS_DEFAULTS["clip_high"],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level PPO/GRPO clipped surrogate with asymmetric clip (DAPO's clip-higher), the L_GRPO of eq. 12.

    ratio_t = exp(logp_t - prev_logp_t);  l_t = -min(ratio_t A, clip(ratio_t, 1-clip_low, 1+clip_high) A)
    loss = sum_{masked t} l_t / normalizer   (token-level aggregation: normalizer = global token count)

    logprobs, prev_logprobs, token_mask: [B, T]; advantages: [B] (shared by the sequence's tokens) or [B, T]
    per-token (GAE, segment advantages; docs/DESIGN.md §7). [B] is exactly the [B, T] broadcast.
    Returns (loss, clipped-token fraction numerator / normalizer), both scalars.
    """
    mask = token_mask.bool()
    log_ratio = torch.where(mask, logprobs - prev_logprobs.detach(), torch.zeros_like(logprobs))
    ratio = log_ratio.exp()
    adv = advantages.detach().to(logprobs.dtype)
    if adv.dim() == 1:
        adv = adv[:, None]  # [B, 1], shared by the row's tokens
    elif adv.shape != logprobs.shape:
        raise ValueError(f"per-token advantages {tuple(adv.shape)} must match logprobs {tuple(logprobs.shape)}")
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = _masked_sum(per_token, mask) / normalizer
    clip_frac = _masked_sum((clipped < unclipped).to(logprobs.dtype), mask).detach() / normalizer
    return loss, clip_frac


KL_INPUT_CLAMP, KL_OUTPUT_CLAMP = 20.0, 10.0  # NeMo-RL's kl_input_clamp_value / kl_output_clamp_value defaults


def kl_k3(logprobs: torch.Tensor, reference_logprobs: torch.Tensor, input_clamp: float | None = KL_INPUT_CLAMP,
          output_clamp: float | None = KL_OUTPUT_CLAMP) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) (Schulman 2020): w * (exp(d) - d - 1), d = ref_logp - logp.

    As NeMo-RL's ClippedPGLossFn computes it (nemo_rl/algorithms/loss/loss_functions.py:418-438 and
    algorithms/utils.py:41-100, v0.7.0): ``w = exp(logp - logp.detach())`` has value 1 and adds the
    score-function gradient through the sampling probability (the samples come from the optimised policy,
    arXiv:2506.09477), so the per-token gradient is ``logp - ref_logp`` instead of ``1 - exp(d)``; ``d`` is
    clamped to +-``input_clamp`` (where it is, ``w`` is detached and the token gets no gradient) and the result
    to +-``output_clamp``. Value: non-negative, unbiased under samples from pi. Returns [B, T] (mask it)."""
    d = reference_logprobs.detach() - logprobs
    w = torch.nan_to_num(torch.exp(logprobs - logprobs.detach()), nan=0.0, posinf=0.0, neginf=0.0)
    if input_clamp is not None:
        clamped = d.clamp(-input_clamp, input_clamp)
        w = torch.where(d == clamped, w, w.detach())
        d = clamped
    kl = w * (d.exp() - d - 1.0)
    return kl.clamp(-output_clamp, output_clamp) if output_clamp is not None else kl


def entropy_bonus(logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token entropy estimate from sampled-token log-probs only (NeMo-RL passes no full distribution).

    Value: -log p(o_t), an unbiased estimate of the entropy when o_t ~ pi. Gradient: -log p grad log p, the
    score-function estimate of grad H (E[grad log p] = 0 removes the '+1' term), obtained from the
    surrogate -(log p)^2 / 2. Returns [B, T] whose value is -logp and whose gradient is the H estimate's.
    """
    value = -logprobs.detach()
    surrogate = -0.5 * logprobs**2
    return value + (surrogate - surrogate.detach())


def overlong_penalty(lengths, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment, added to the reward (paper: buffer 4096, factor 0.5, max 8192).

    With L = response length, L_max = max_len, B = buffer:
        0                                  if L <= L_max - B
        ((L_max - B) - L) / B * factor     if L_max - B < L <= L_max   (linear ramp from 0 to -factor)
        -factor                            if L > L_max
    lengths: [...] response token counts. Returns float32 [...] (<= 0).
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(f"overlong buffer must be in (0, max_len={max_len}], got {buffer}")
    length = torch.as_tensor(lengths, dtype=torch.float32)
    start = max_len - buffer
    ramp = (start - length) / buffer * factor
    pen = torch.where(length <= start, torch.zeros_like(length), ramp)
    return torch.where(length > max_len, torch.full_like(length, -factor), pen)


def log_policy_support(logprobs: torch.Tensor, gamma: float) -> torch.Tensor:
    """Eqs. 9-10: log rho_t with rho_t = p_t / (p_t + gamma), p_t = exp(logprobs).

    Computed stably as -softplus(log gamma - log p). Its derivative with respect to log p is
    gamma / (p + gamma): ~1 for unsupported (p << gamma) tokens, ~gamma/(1+gamma) for confident ones.
    """
    return -torch.nn.functional.softplus(math.log(gamma) - logprobs)


def guide_loss(
    logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    a_ref: torch.Tensor,
    row_mask: torch.Tensor,
    guided_seq_count: float | torch.Tensor,
    gamma: float = LOSS_DEFAULTS["gamma"],
    a_max: float = LOSS_DEFAULTS["a_max"],
    token_weighting: TokenWeighting = "policy_support",
) -> torch.Tensor:
    """Eq. 11: L_guide = -(1/|O_ref|) sum_j (clip(A_ref_j, 0, A_max) / |o_j|) sum_t log rho_jt.

    logprobs [B, T] are teacher-forced under the ORIGINAL prompt (gradients flow only through them);
    token_mask [B, T] marks o_j's response tokens (|o_j| = the row's own token count); a_ref [B] is eq. 7's
    A_ref (a constant); row_mask [B] selects the guided rows of this (micro-)batch; guided_seq_count is
    |O_ref| over the whole global batch. With no retained row the loss is an exact 0 that still has a
    graph (backward works, gradients are 0). token_weighting="uniform" replaces log rho by log p.
    """
    rows = row_mask.bool()
    mask = token_mask.bool() & rows[:, None]  # [B, T]
    if token_weighting == "policy_support":
        per_token = log_policy_support(logprobs, gamma)
    elif token_weighting == "uniform":
        per_token = logprobs
    else:
        raise ValueError(f"token_weighting must be 'policy_support' or 'uniform', got {token_weighting!r}")
    # [B], A~_j; a NaN A_ref (no natural baseline, see advantages.reference_advantages) weighs 0.
    weight = torch.nan_to_num(a_ref.detach().to(logprobs.dtype), nan=0.0).clamp(0.0, a_max)
    length = mask.sum(-1).clamp(min=1).to(logprobs.dtype)  # [B], |o_j|
    per_row = torch.where(mask, per_token, torch.zeros_like(per_token)).sum(-1)  # [B]
    per_row = torch.where(rows, weight * per_row / length, torch.zeros_like(per_row))
    count = torch.as_tensor(guided_seq_count, dtype=logprobs.dtype, device=logprobs.device).clamp(min=1)
    # When nothing is retained every term is 0 but the sum keeps the graph to logprobs.
    return -per_row.sum() / count


def _column_value(data: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    """A global normaliser carried as a per-sample column (every row holds the same value)."""
    if key not in data:
        raise KeyError(f"policy_objective: data is missing the global normaliser column {key!r}")
    col = torch.as_tensor(data[key])
    return col.reshape(-1)[0].to(torch.float32) if col.numel() else torch.tensor(0.0)


def _require(data: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    if key not in data:
        raise KeyError(f"policy_objective: data is missing required key {key!r}")
    return data[key]


def policy_objective(
    logprobs: torch.Tensor, data: Mapping[str, torch.Tensor], cfg: ObjectiveConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 12: L = L_GRPO(natural rows) + lambda_guide * L_guide(guided rows) [+ kl_coef * KL - entropy_coef * H],
    the policy objective of every RL method (without guided rows and with lambda_guide 0: the clipped PG loss).

    logprobs: [B, T] aligned with data['input_ids'], under the current weights (with grad).
    data: token_mask [B, T], sample_mask [B], kind [B] (KIND_NATURAL / KIND_GUIDED), advantages [B]
    (natural: eq. 1; guided: A_ref of eq. 7) and/or token_advantages [B, T] (per-token advantages of the
    natural rows, e.g. GAE; when present the PG term uses them; docs/DESIGN.md §7), prev_logprobs [B, T], natural_token_count [B],
    guided_seq_count [B], and reference_policy_logprobs [B, T] when cfg.kl_coef > 0.

    Natural and guided rows never mix: guided rows contribute only through L_guide, so they affect neither
    the natural group's advantages (computed outside) nor the PG normaliser. The coupled ablation simply
    feeds privileged rows as natural rows with coupled advantages (advantages.coupled_group_advantages).
    Every term and metric is divided by a global count, so summing over micro-batches gives the
    global value. Returns (scalar loss, metrics dict of floats, already globally normalised).
    """
    token_mask = _require(data, "token_mask").to(logprobs.device)
    sample_mask = _require(data, "sample_mask").to(logprobs.device).bool()
    kind = _require(data, "kind").to(logprobs.device)
    if "token_advantages" in data:
        pg_advantages = data["token_advantages"].to(logprobs.device)  # [B, T]
        advantages = data["advantages"].to(logprobs.device) if "advantages" in data else logprobs.new_zeros(
            logprobs.shape[0])
    else:
        advantages = _require(data, "advantages").to(logprobs.device)  # [B]
        pg_advantages = advantages
    prev_logprobs = _require(data, "prev_logprobs").to(logprobs.device)
    if logprobs.shape != token_mask.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and token_mask {tuple(token_mask.shape)} differ")

    # Padding may hold -inf/garbage log-probs; zero them once so no term can turn them into NaN gradients.
    logprobs = torch.where(token_mask.bool(), logprobs, torch.zeros_like(logprobs))
    natural_rows = sample_mask & (kind == KIND_NATURAL)  # [B]
    guided_rows = sample_mask & (kind == KIND_GUIDED)  # [B]
    nat_mask = token_mask.bool() & natural_rows[:, None]  # [B, T]
    n_tokens = _column_value(data, "natural_token_count").clamp(min=1)
    n_guided = _column_value(data, "guided_seq_count")

    pg, clip_frac = clipped_pg_loss(
        logprobs, prev_logprobs, pg_advantages, nat_mask, n_tokens, cfg.clip_low, cfg.clip_high
    )
    total = pg

    kl = logprobs.new_zeros(())
    if cfg.kl_coef > 0:
        if "reference_policy_logprobs" not in data:
            raise KeyError("policy_objective: kl_coef > 0 needs data['reference_policy_logprobs']")
        ref = data["reference_policy_logprobs"].to(logprobs.device)
        kl = _masked_sum(kl_k3(logprobs, ref), nat_mask) / n_tokens
        total = total + cfg.kl_coef * kl

    entropy = _masked_sum(entropy_bonus(logprobs), nat_mask) / n_tokens
    if cfg.entropy_coef > 0:
        total = total - cfg.entropy_coef * entropy

    guide = guide_loss(
        logprobs, token_mask, advantages, guided_rows, n_guided, cfg.gamma, cfg.a_max, cfg.token_weighting
    )
    if cfg.lambda_guide != 0:
        total = total + cfg.lambda_guide * guide

    metrics = {
        "loss/total": float(total.detach()),
        "loss/pg": float(pg.detach()),
        "loss/guide": float(guide.detach()),
        "loss/kl": float(kl.detach()),
        "policy/entropy": float(entropy.detach()),  # sampled-token estimate over natural tokens
        "pg/clip_fraction": float(clip_frac),
        **_guide_diagnostics(logprobs.detach(), token_mask, guided_rows, n_guided, cfg.gamma),
    }
    return total, metrics


def _guide_diagnostics(
    logprobs: torch.Tensor, token_mask: torch.Tensor, rows: torch.Tensor, n_guided: torch.Tensor, gamma: float
) -> dict[str, float]:
    """Per-trajectory means of p_t and of the support weight gamma/(p_t+gamma), averaged over |O_ref|
    (globally normalised like eq. 11, so micro-batch sums are exact)."""
    mask = token_mask.bool() & rows[:, None]
    length = mask.sum(-1).clamp(min=1).to(logprobs.dtype)
    p = logprobs.exp()
    count = n_guided.clamp(min=1)
    mean_p = (torch.where(mask, p, torch.zeros_like(p)).sum(-1) / length)[rows].sum() / count
    w = gamma / (p + gamma)
    mean_w = (torch.where(mask, w, torch.zeros_like(w)).sum(-1) / length)[rows].sum() / count
    return {"guide/mean_prob": float(mean_p), "guide/mean_support_weight": float(mean_w)}


def policy_loss_fn(cfg: ObjectiveConfig):
    """``policy_objective`` bound to ``cfg``: the policy loss of every RL method (eq. 12; with lambda_guide 0 plain
    clipped PG, GAE advantages or not), as a picklable ``functools.partial`` of ``policy_objective`` (NeMo-RL ships the loss to its workers) that
    says whether it needs reference log-probs: ``loss.needs_reference_logprobs`` (kl_coef > 0)."""
    import functools

    loss = functools.partial(policy_objective, cfg=cfg)
    loss.needs_reference_logprobs = cfg.kl_coef > 0
    return loss


def loss_needs_reference_logprobs(loss_fn) -> bool:
    """Whether a backend must put ``reference_policy_logprobs`` into the batch before calling ``loss_fn``."""
    return bool(getattr(loss_fn, "needs_reference_logprobs", False))


def loss_needs_prev_logprobs(loss_fn) -> bool:
    """Whether ``loss_fn`` reads ``prev_logprobs`` (every policy-gradient loss does; a loss that does not, such
    as the SFT baseline's NLL, sets ``needs_prev_logprobs = False``)."""
    return bool(getattr(loss_fn, "needs_prev_logprobs", True))
