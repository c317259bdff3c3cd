"""Eq. 1 (group advantages, valid mask), eqs. 7-8 (reference advantages) and the coupled ablation."""

import pytest
import torch

from rise_nemo.core.advantages import (
    coupled_group_advantages,
    group_advantages,
    reference_advantages,
    retained,
)
from rise_nemo.core.rewards import rubric_reward


def test_group_advantages_hand_computed_unbiased_std():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.5]])
    mean = 0.5
    std = (((0.5**2) * 2) / 3) ** 0.5  # unbiased, like torch.std and NeMo-RL
    adv = group_advantages(r, eps=0.0)
    assert adv[0].tolist() == pytest.approx([(1 - mean) / std, (0 - mean) / std, 0.0, 0.0])
    assert torch.allclose(
        group_advantages(r, eps=0.0), (r - r.mean(-1, keepdim=True)) / r.std(-1, keepdim=True)
    )


def test_zero_std_group_gives_zero_not_nan():
    r = torch.tensor([[0.3, 0.3, 0.3], [1.0, 0.0, 1.0]])
    adv = group_advantages(r)
    assert torch.isfinite(adv).all()
    assert adv[0].tolist() == [0.0, 0.0, 0.0]
    assert adv[1].abs().sum() > 0


def test_valid_mask_excludes_unknown_rewards():
    r = torch.tensor([[1.0, 0.0, float("nan"), 0.5]])
    valid = torch.tensor([[True, True, False, True]])
    adv = group_advantages(r, valid=valid)
    expected = group_advantages(torch.tensor([[1.0, 0.0, 0.5]]))
    assert adv[0, 2].item() == 0.0
    assert torch.allclose(adv[0, [0, 1, 3]], expected[0])
    # one valid sample: no group signal
    assert group_advantages(torch.tensor([[0.7, 0.1]]), valid=torch.tensor([[True, False]])).tolist() == [
        [0.0, 0.0]
    ]
    with pytest.raises(ValueError, match="valid mask shape"):
        group_advantages(r, valid=torch.tensor([True]))


def test_reference_advantages_and_retained():
    nat = torch.tensor([0.2, 0.4, 0.6])
    priv = torch.tensor([0.9, 0.4, 0.1, 0.41])
    a_ref = reference_advantages(priv, nat)
    assert a_ref.tolist() == pytest.approx([0.5, 0.0, -0.3, 0.01], abs=1e-6)
    assert retained(a_ref).tolist() == [True, False, False, True]
    # unknown natural rewards are excluded from the baseline
    a2 = reference_advantages(
        priv, torch.tensor([0.2, 0.4, 9.9]), natural_valid=torch.tensor([True, True, False])
    )
    assert a2[0].item() == pytest.approx(0.9 - 0.3)
    # a group with no known natural reward has no baseline: NaN, never retained
    a3 = reference_advantages(
        torch.tensor([[0.5, 0.9], [0.5, 0.9]]),
        torch.tensor([[0.1, 0.2], [0.3, 0.4]]),
        natural_valid=torch.tensor([[False, False], [True, True]]),
    )
    assert torch.isnan(a3[0]).all() and retained(a3).tolist() == [[False, False], [True, True]]


def test_privileged_samples_do_not_touch_natural_advantages_but_coupled_does():
    nat = torch.tensor([[0.1, 0.5, 0.3, 0.6]])
    priv = torch.tensor([[0.95, 0.9, 1.0, 0.85]])
    decoupled = group_advantages(nat)
    # RISE-RL: the natural advantages depend on the natural rewards only
    a_ref = reference_advantages(priv[0], nat[0])
    assert torch.equal(group_advantages(nat), decoupled)
    assert a_ref.tolist() == pytest.approx((priv[0] - nat[0].mean()).tolist())
    # coupled ablation: eq. 1 over the joined group shifts the natural advantages
    c_nat, c_priv = coupled_group_advantages(nat, priv)
    joined = torch.cat([nat, priv], -1)
    expected = (joined - joined.mean()) / (joined.std() + 1e-6)
    assert torch.allclose(torch.cat([c_nat, c_priv], -1), expected, atol=1e-6)
    assert not torch.allclose(c_nat, decoupled)
    assert (c_nat < 0).all() and (c_priv > 0).all()


@pytest.mark.parametrize("value", [0.3, 0.7, 0.8, 0.1, 1 / 3])
@pytest.mark.parametrize("group_size", [2, 6, 8, 16])
def test_equal_rewards_give_exactly_zero_advantage(value, group_size):
    # float32 sums of non-representable values used to give +-0.03 for every member of an equal group.
    adv = group_advantages(torch.full((3, group_size), value))
    assert torch.equal(adv, torch.zeros_like(adv))
    # ... also with unknown members, and as the baseline of eq. 7 (an equal privileged reward is no gain).
    valid = torch.ones(3, group_size, dtype=torch.bool)
    valid[:, 0] = False
    assert torch.equal(group_advantages(torch.full((3, group_size), value), valid=valid), torch.zeros(3, group_size))
    a_ref = reference_advantages(torch.full((3, 4), value), torch.full((3, group_size), value))
    assert torch.equal(a_ref, torch.zeros(3, 4))
    assert not retained(a_ref).any()


def test_equal_verdict_rows_give_exactly_zero_advantage():
    # 8 identical verdict rows on a 5-criterion rubric: the reward is a non-representable fraction.
    weights = torch.tensor([7.0, 5.0, 10.0, -6.0, 3.0])
    verdicts = torch.tensor([[1.0, 0.0, 1.0, 1.0, 1.0]]).expand(8, 5)
    rewards = rubric_reward(verdicts, weights).unsqueeze(0)  # [1, 8]
    assert torch.equal(group_advantages(rewards), torch.zeros(1, 8))
