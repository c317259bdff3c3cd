"""Guidance removal (RISE-RL eq. 13): the Delta_r tracker and the lambda_guide(s) schedule.

Delta_r(s) = mean r_priv(s) - mean r_nat(s) measures what the privileged hints still add (``reward_gap``:
the gap of each guided prompt's group means, averaged over the step's guided prompts). The paper
sets s_switch by eye near the plateau onset of the smoothed curve; ``lambda_guide(s) = lambda_0`` for
s < s_switch and 0 afterwards, and after the switch no privileged rollouts are generated at all.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Literal

import torch

__all__ = ["GuidanceSchedule", "ScheduleMode", "reward_gap"]

log = logging.getLogger(__name__)

ScheduleMode = Literal["fixed", "auto", "never"]
_MODES = ("fixed", "auto", "never")


def reward_gap(
    priv_rewards: torch.Tensor, priv_valid: torch.Tensor, nat_rewards: torch.Tensor, nat_valid: torch.Tensor
) -> float | None:
    """Eq. 13's Delta_r(s) for one step: the mean over guided prompts of (r_bar_priv - r_bar_nat).

    Row q of ``priv_*`` [N', G'] and ``nat_*`` [N', G] is the same guided prompt. Eq. 13 defines r_bar_priv
    and r_bar_nat as means over ONE prompt's group (1/G sum_j r_j^priv, 1/G sum_i r_i^nat, the same group
    means as eq. 7's baseline), so the gap is taken per prompt, over its valid (known-verdict) samples, and
    the step's value is the plain mean of the per-prompt gaps. Pooling all samples of the step instead
    would weigh prompts differently on the two sides as soon as unknown verdicts remove samples unevenly
    (privileged samples of an easy prompt against natural samples of a hard one). With every sample valid
    and equal group sizes the two readings agree. A prompt with no valid sample on either side has no gap
    and is left out; None when no prompt has one.
    """
    if priv_rewards.shape[0] != nat_rewards.shape[0]:
        raise ValueError(f"reward_gap: {priv_rewards.shape[0]} privileged groups vs {nat_rewards.shape[0]} natural")
    gaps = []
    for q in range(priv_rewards.shape[0]):
        pv, nv = priv_valid[q].bool(), nat_valid[q].bool()
        if bool(pv.any()) and bool(nv.any()):
            gaps.append(priv_rewards[q][pv].double().mean() - nat_rewards[q][nv].double().mean())
    return float(torch.stack(gaps).mean()) if gaps else None


class GuidanceSchedule:
    """lambda_guide(s) with three modes.

    fixed  lambda_0 for steps s < s_switch, then 0 (the paper's rule).
    auto   plateau rule on the EMA-smoothed Delta_r, evaluated at every ``update``:
             smoothed_s = ema * smoothed_{s-1} + (1 - ema) * Delta_r(s)   (first value taken as is)
           The curve is "flat" at step s when |smoothed_s - anchor| <= tol, where anchor is the smoothed
           value at the last step the curve moved by more than tol (a move resets the anchor and the
           count). Guidance is switched off when the curve has been flat for ``patience`` consecutive
           updates, or when ``floor`` is set and smoothed_s <= floor (the gap has vanished) — but never
           before ``min_steps`` updates have been seen, whatever the curve does. The decision uses step s's
           data, so lambda is 0 from step s + 1 on. Every switch is logged (logger ``rise_nemo.core.schedule``)
           and explained in ``switch_reason``.
    never  guidance is never removed (lambda_0 forever): the "no removal" ablation.

    After the switch lambda is 0 forever; the schedule's state round-trips through ``state_dict()`` /
    ``load_state_dict()`` as plain JSON-serialisable values (checkpoints).
    """

    def __init__(
        self,
        lambda0: float,
        *,
        mode: ScheduleMode,
        s_switch: int | None,
        ema: float,
        tol: float,
        patience: int,
        min_steps: int,
        floor: float | None,
    ) -> None:
        """Every parameter is given: the defaults are the recipe schema's (rise_nemo.config.schema ScheduleCfg:
        rise.lambda_guide -> lambda0, rise.schedule.switch_step -> s_switch, .tolerance -> tol, ...)."""
        if mode not in _MODES:
            raise ValueError(f"schedule mode must be one of {_MODES}, got {mode!r}")
        if mode == "fixed" and (s_switch is None or s_switch < 0):
            raise ValueError(f"mode 'fixed' needs s_switch >= 0, got {s_switch!r}")
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"ema must be in [0, 1), got {ema}")
        if patience < 1 or min_steps < 0 or tol < 0:
            raise ValueError(
                f"need patience >= 1, min_steps >= 0, tol >= 0; got {patience}, {min_steps}, {tol}"
            )
        self.lambda0 = float(lambda0)
        self.mode: ScheduleMode = mode
        self.ema, self.tol, self.patience, self.min_steps, self.floor = ema, tol, patience, min_steps, floor
        self.s_switch = s_switch
        self.switch_step: int | None = s_switch if mode == "fixed" else None
        self.switch_reason: str | None = (
            f"fixed schedule: guidance removed at s_switch={s_switch}" if mode == "fixed" else None
        )
        self.smoothed: float | None = None
        self.last_delta_r: float | None = None
        self.last_step: int = -1
        self.num_updates = 0
        self._anchor: float | None = None
        self._flat_count = 0

    # -- queries -------------------------------------------------------------------------------------
    def lambda_at(self, step: int) -> float:
        """lambda_guide(step) (eq. 13)."""
        if self.switch_step is not None and step >= self.switch_step:
            return 0.0
        return self.lambda0

    @property
    def active(self) -> bool:
        """Whether the next step (last updated step + 1) still uses guidance, i.e. needs privileged rollouts."""
        return self.switch_step is None or self.last_step + 1 < self.switch_step

    # -- tracking ------------------------------------------------------------------------------------
    def update(self, step: int, delta_r: float | None) -> None:
        """Record Delta_r(step) (None when no privileged rollouts were scored this step) and apply the rule."""
        if step < self.last_step:
            raise ValueError(f"schedule steps must not go back: got {step} after {self.last_step}")
        self.last_step = step
        if delta_r is None:
            return
        if not math.isfinite(delta_r):
            raise ValueError(f"delta_r must be finite, got {delta_r} at step {step}")
        self.num_updates += 1
        self.last_delta_r = float(delta_r)
        self.smoothed = (
            float(delta_r)
            if self.smoothed is None
            else self.ema * self.smoothed + (1 - self.ema) * float(delta_r)
        )
        if self.mode == "auto" and self.switch_step is None:
            self._apply_plateau_rule(step)

    def _apply_plateau_rule(self, step: int) -> None:
        s = self.smoothed
        assert s is not None
        if self._anchor is None or abs(s - self._anchor) > self.tol:
            self._anchor, self._flat_count = s, 0
        else:
            self._flat_count += 1
        if self.num_updates < self.min_steps:
            return
        if self.floor is not None and s <= self.floor:
            self._switch(step, f"smoothed delta_r={s:.4f} <= floor={self.floor}")
        elif self._flat_count >= self.patience:
            self._switch(
                step,
                f"smoothed delta_r={s:.4f} stayed within +/-{self.tol} of {self._anchor:.4f} "
                f"for {self._flat_count} updates (patience={self.patience})",
            )

    def _switch(self, step: int, why: str) -> None:
        self.switch_step = step + 1
        self.switch_reason = f"auto plateau at step {step} after {self.num_updates} updates: {why}; lambda=0 from step {step + 1}"
        log.info("guidance removed: %s", self.switch_reason)

    # -- checkpoints ---------------------------------------------------------------------------------
    _STATE_KEYS = (
        "lambda0", "mode", "s_switch", "ema", "tol", "patience", "min_steps", "floor", "switch_step",
        "switch_reason", "smoothed", "last_delta_r", "last_step", "num_updates", "_anchor", "_flat_count",
    )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {k.lstrip("_"): getattr(self, k) for k in self._STATE_KEYS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = [k for k in self._STATE_KEYS if k.lstrip("_") not in state]
        if missing:
            raise KeyError(f"GuidanceSchedule state is missing keys {missing}")
        if state["mode"] not in _MODES:
            raise ValueError(f"GuidanceSchedule state has unknown mode {state['mode']!r}")
        for k in self._STATE_KEYS:
            setattr(self, k, state[k.lstrip("_")])
