"""Eq. 13 guidance schedule: fixed, auto plateau, never; serialisation."""

import json
import logging

import pytest

from rise_nemo.core.schedule import GuidanceSchedule as _GuidanceSchedule

# GuidanceSchedule takes every parameter (the recipe schema's ScheduleCfg holds the defaults); these tests
# state the ones they do not vary.
UNVARIED = {"s_switch": None, "ema": 0.9, "tol": 0.01, "patience": 10, "min_steps": 20, "floor": None}


def GuidanceSchedule(lambda0, **kw):  # noqa: N802 (the class, with UNVARIED filled in)
    return _GuidanceSchedule(lambda0, **{**UNVARIED, **kw})


def test_fixed_switch():
    s = GuidanceSchedule(0.05, mode="fixed", s_switch=3)
    assert [s.lambda_at(i) for i in range(5)] == [0.05, 0.05, 0.05, 0.0, 0.0]
    for step in range(3):
        assert s.active
        s.update(step, 0.2)
    assert not s.active  # step 3 is past the switch: no privileged rollouts
    assert "s_switch=3" in s.switch_reason
    with pytest.raises(ValueError, match="s_switch"):
        GuidanceSchedule(0.05, mode="fixed")


def test_never_mode_keeps_guidance():
    s = GuidanceSchedule(0.01, mode="never")
    for step in range(100):
        s.update(step, 0.0)
    assert s.active and s.lambda_at(10_000) == 0.01 and s.switch_reason is None


def test_auto_plateau_switches_after_patience_and_logs(caplog):
    s = GuidanceSchedule(0.05, mode="auto", ema=0.5, tol=0.01, patience=3, min_steps=4)
    # a decreasing gap, then flat
    gaps = [0.4, 0.3, 0.2, 0.1] + [0.05] * 12
    switched_at = None
    with caplog.at_level(logging.INFO, logger="rise_nemo.core.schedule"):
        for step, g in enumerate(gaps):
            s.update(step, g)
            if not s.active and switched_at is None:
                switched_at = step
    assert switched_at is not None
    assert s.lambda_at(switched_at) == 0.05 and s.lambda_at(switched_at + 1) == 0.0
    assert "patience=3" in s.switch_reason and "guidance removed" in caplog.text
    # once off, off forever even if the gap jumps back
    s.update(len(gaps), 0.9)
    assert not s.active and s.lambda_at(10**6) == 0.0


def test_auto_never_before_min_steps_and_moving_curve_does_not_switch():
    s = GuidanceSchedule(0.05, mode="auto", ema=0.0, tol=0.01, patience=2, min_steps=10)
    for step in range(9):
        s.update(step, 0.3)  # perfectly flat from the start
    assert s.active  # min_steps not reached
    s.update(9, 0.3)
    assert not s.active
    moving = GuidanceSchedule(0.05, mode="auto", ema=0.0, tol=0.01, patience=2, min_steps=0)
    for step in range(30):
        moving.update(step, 0.5 - 0.02 * step)  # still falling by more than tol each step
    assert moving.active
    floored = GuidanceSchedule(0.05, mode="auto", ema=0.0, patience=100, min_steps=2, floor=0.0)
    for step, g in enumerate([0.3, -0.01, 0.2]):
        floored.update(step, g)
    assert not floored.active and "floor" in floored.switch_reason


def test_missing_delta_r_does_not_count_and_state_round_trip():
    s = GuidanceSchedule(0.05, mode="auto", ema=0.8, tol=0.01, patience=4, min_steps=3)
    for step, g in enumerate([0.3, None, 0.25, 0.2]):
        s.update(step, g)
    assert s.num_updates == 3
    blob = json.dumps(s.state_dict())
    t = GuidanceSchedule(0.0, mode="never")
    t.load_state_dict(json.loads(blob))
    assert t.state_dict() == s.state_dict()
    for step, g in enumerate([0.2] * 30, start=4):
        s.update(step, g)
        t.update(step, g)
    assert t.state_dict() == s.state_dict() and t.switch_step == s.switch_step is not None
    with pytest.raises(KeyError, match="missing"):
        t.load_state_dict({"mode": "auto"})
    with pytest.raises(ValueError, match="go back"):
        s.update(0, 0.1)


def test_reward_gap_is_the_mean_of_per_prompt_gaps_not_a_pooled_difference():
    """Eq. 13 takes r_bar_priv and r_bar_nat over one prompt's group (1/G sums), so with
    unknown verdicts removing samples unevenly the step's Delta_r is the mean of per-prompt gaps."""
    import torch

    from rise_nemo.core.schedule import reward_gap
    from rise_nemo.steps.rubric import Scored, guidance_delta

    priv = torch.tensor([[0.9, 0.9], [0.3, 0.0]])
    priv_valid = torch.tensor([[True, True], [True, False]])
    nat = torch.tensor([[0.7, 0.0], [0.2, 0.2]])
    nat_valid = torch.tensor([[True, False], [True, True]])
    # prompt 0: 0.9 - 0.7 = 0.2; prompt 1: 0.3 - 0.2 = 0.1 -> 0.15 (pooling would give 0.7 - 0.3667 = 0.333)
    assert reward_gap(priv, priv_valid, nat, nat_valid) == pytest.approx(0.15)
    # A prompt with no valid sample on one side has no gap; none at all -> None.
    assert reward_gap(priv, torch.tensor([[True, True], [False, False]]), nat, nat_valid) == pytest.approx(0.2)
    assert reward_gap(priv, torch.zeros(2, 2, dtype=torch.bool), nat, nat_valid) is None
    # All valid, equal groups: identical to the pooled difference.
    full = torch.ones(2, 2, dtype=torch.bool)
    assert reward_gap(priv, full, nat, full) == pytest.approx(float(priv.mean() - nat.mean()))
    # The training step's Delta_r is this function (targets = rows of the natural batch that got guidance).
    nat_all = Scored([], [], torch.cat([torch.zeros(1, 2), nat]), torch.cat([torch.ones(1, 2, dtype=torch.bool), nat_valid]))
    assert guidance_delta(nat_all, Scored([], [], priv, priv_valid), [1, 2]) == pytest.approx(0.15)
