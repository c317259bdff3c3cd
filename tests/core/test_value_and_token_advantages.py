"""Per-token advantages in the PG loss, GAE against a naive loop, the clipped value loss, explained variance
(docs/DESIGN.md §7)."""

from __future__ import annotations

import pytest
import torch

from rise_nemo.core.losses import ObjectiveConfig, clipped_pg_loss, policy_loss_fn, policy_objective
from rise_nemo.core.value import clipped_value_loss, explained_variance, gae, terminal_token_rewards, whiten
from rise_nemo.interfaces import KIND_NATURAL


def _batch(b=3, t=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, t)
    mask[0, 2:6] = 1
    mask[1, 3:7] = 1
    mask[2, 1:4] = 1
    data = {
        "token_mask": mask,
        "sample_mask": torch.ones(b),
        "kind": torch.full((b,), KIND_NATURAL),
        "prev_logprobs": -torch.rand(b, t, generator=g),
        "natural_token_count": torch.full((b,), float(mask.sum())),
        "guided_seq_count": torch.zeros(b),
    }
    return data, -torch.rand(b, t, generator=g)


def test_per_token_advantages_equal_per_sample_broadcast():
    data, logp = _batch()
    adv = torch.tensor([0.7, -1.2, 0.3])
    cfg = ObjectiveConfig(kl_coef=0.0, lambda_guide=0.0)
    lp1 = logp.clone().requires_grad_(True)
    lp2 = logp.clone().requires_grad_(True)
    loss1, m1 = policy_objective(lp1, {**data, "advantages": adv}, cfg)
    per_token = adv[:, None] * data["token_mask"]
    loss2, m2 = policy_objective(lp2, {**data, "token_advantages": per_token}, cfg)
    loss1.backward()
    loss2.backward()
    assert torch.equal(loss1.detach(), loss2.detach())
    assert torch.equal(lp1.grad, lp2.grad)
    assert m1["pg/clip_fraction"] == m2["pg/clip_fraction"]


def test_token_advantages_take_precedence_and_differ_per_token():
    data, logp = _batch()
    tok = torch.randn(3, 7) * data["token_mask"]
    data["prev_logprobs"] = logp.clone()  # ratio 1: no clipping
    lp = logp.clone().requires_grad_(True)
    loss, _ = policy_objective(lp, {**data, "advantages": torch.full((3,), 99.0), "token_advantages": tok},
                             ObjectiveConfig())
    loss.backward()
    # at ratio 1 the gradient of the surrogate is -A_t / N per masked token
    expected = -tok / data["token_mask"].sum()
    assert torch.allclose(lp.grad, expected, atol=1e-6)


def test_pg_loss_rejects_misaligned_token_advantages():
    lp = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="per-token advantages"):
        clipped_pg_loss(lp, lp, torch.zeros(2, 4), torch.ones(2, 5), 10.0)


def test_policy_loss_says_whether_it_needs_reference_logprobs():
    assert policy_loss_fn(ObjectiveConfig(kl_coef=0.001)).needs_reference_logprobs is True
    assert policy_loss_fn(ObjectiveConfig(kl_coef=0.0)).needs_reference_logprobs is False
    import pickle

    loss = pickle.loads(pickle.dumps(policy_loss_fn(ObjectiveConfig(kl_coef=0.5))))
    assert loss.needs_reference_logprobs is True and loss.keywords["cfg"].kl_coef == 0.5


def naive_gae(rewards, values, mask, gamma, lam):
    """Row by row over the list of action positions: delta_k = r_k + gamma V_{k+1} - V_k, A_k = sum_l
    (gamma lam)^l delta_{k+l}, V after the last action = 0 (the direct sum of GAE paper eq. 16)."""
    adv = torch.zeros_like(values)
    for b in range(values.shape[0]):
        pos = mask[b].nonzero().squeeze(1).tolist()
        deltas = []
        for i, t in enumerate(pos):
            v_next = values[b, pos[i + 1]] if i + 1 < len(pos) else 0.0
            deltas.append(float(rewards[b, t] + gamma * v_next - values[b, t]))
        for i, t in enumerate(pos):
            adv[b, t] = sum((gamma * lam) ** j * deltas[i + j] for j in range(len(pos) - i))
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_equals_naive_loop_with_gaps_in_the_mask(gamma, lam):
    g = torch.Generator().manual_seed(1)
    b, t = 4, 12
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[:, :2] = 0  # prompt
    mask[3] = 0  # a row without actions
    values = torch.randn(b, t, generator=g)
    rewards = torch.randn(b, t, generator=g) * mask
    adv, ret = gae(rewards, values, mask, gamma, lam)
    ref = naive_gae(rewards, values, mask, gamma, lam)
    assert torch.allclose(adv, ref, atol=1e-5)
    assert torch.allclose(ret, (ref + values) * mask, atol=1e-5)
    assert torch.all(adv[mask == 0] == 0)


def test_gae_lambda_one_is_return_minus_value_and_lambda_zero_is_td_error():
    values = torch.tensor([[0.0, 0.0, 0.3, 0.5, 0.8]])
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]])
    r = terminal_token_rewards(torch.tensor([1.0]), mask)
    assert r.tolist() == [[0, 0, 0, 0, 1.0]]
    mc, _ = gae(r, values, mask, 1.0, 1.0)
    assert torch.allclose(mc[0, 2:], 1.0 - values[0, 2:])
    td, _ = gae(r, values, mask, 1.0, 0.0)
    assert torch.allclose(td[0, 2:], torch.tensor([0.5 - 0.3, 0.8 - 0.5, 1.0 - 0.8]))


def test_gae_starts_at_the_state_after_a_given_prefix():
    """A given prefix (mask 0) between prompt and sampled tokens: the first sampled token's advantage is
    bootstrapped from V at the state (prompt + prefix), nothing before it has an advantage."""
    values = torch.tensor([[0.0, 0.1, 0.2, 0.25, 0.6, 0.7]])  # V(ids[:t]); 0.6 = V(prompt + prefix)
    mask = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0, 1.0]])  # tokens 1..3 prompt/prefix, 4..5 sampled
    r = terminal_token_rewards(torch.tensor([1.0]), mask)
    adv, ret = gae(r, values, mask, 1.0, 1.0)
    assert adv[0, :4].abs().sum() == 0
    assert adv[0, 4] == pytest.approx(1.0 - 0.6)  # return from the state minus V(state)
    assert ret[0, 4] == pytest.approx(1.0)


def test_whiten_is_zero_mean_unit_variance_on_the_mask():
    x = torch.randn(3, 6)
    mask = torch.zeros(3, 6)
    mask[:, 2:] = 1
    w = whiten(x, mask)
    assert torch.all(w[mask == 0] == 0)
    assert w[mask.bool()].mean().abs() < 1e-5
    # Bessel's correction, as NeMo-RL's masked_var (the docstring once claimed population variance)
    assert w[mask.bool()].var(unbiased=True) == pytest.approx(1.0, abs=1e-4)
    one = torch.zeros(3, 6)
    one[1, 3] = 1
    assert torch.all(whiten(x, one) == 0)


def test_clipped_value_loss_matches_nemo_formula_and_clips():
    v = torch.tensor([[0.0, 1.0, 0.5]], requires_grad=True)
    old = torch.tensor([[0.0, 0.5, 0.5]])
    ret = torch.tensor([[0.0, 0.0, 1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    loss, frac = clipped_value_loss(v, old, ret, mask, 2.0, clip=0.2)
    # token 1: unclipped (1-0)^2 = 1, clipped (0.7-0)^2 = .49 -> max 1; token 2: .25 both
    assert float(loss.detach()) == pytest.approx(0.5 * (1.0 + 0.25) / 2)
    assert float(frac) == 0.0
    plain, _ = clipped_value_loss(v, old, ret, mask, 2.0, clip=None)
    assert float(plain.detach()) == pytest.approx(0.5 * (1.0 + 0.25) / 2)
    # a value that moved toward the target beyond the clip is held to the clipped (larger) error
    v2 = torch.tensor([[0.0, 0.0, 0.5]], requires_grad=True)
    old2 = torch.tensor([[0.0, 1.0, 0.5]])
    loss2, frac2 = clipped_value_loss(v2, old2, ret, mask, 2.0, clip=0.2)
    assert float(loss2.detach()) == pytest.approx(0.5 * (0.8**2 + 0.25) / 2)
    assert float(frac2) == pytest.approx(0.5)
    loss2.backward()
    assert v2.grad[0, 1] == 0  # the clipped branch is flat in v


def test_explained_variance():
    ret = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(ret, 2.5), ret, mask) == pytest.approx(0.0)
    assert explained_variance(ret, torch.ones_like(ret), mask) is None


def test_explained_variance_is_undefined_when_every_rollout_earned_the_same_return():
    """With lambda < 1 the value targets R = A + V mix in the critic's own values, so a batch
    in which every rollout earned the same reward still has Var[R] > 0 and the old statistic came out as an
    arbitrary negative number (-0.6..-3.5 were seen). Undefined (None) when the Monte-Carlo returns have
    no variance; unchanged otherwise."""
    from rise_nemo.core.value import monte_carlo_returns

    mask = torch.zeros(3, 6)
    mask[0, 1:5] = 1
    mask[1, 2:6] = 1
    mask[2, 1:4] = 1
    values = torch.tensor([[0.0, 0.3, -0.2, 0.5, 0.1, 0.0], [0.0, 0.0, 0.4, 0.2, -0.3, 0.6],
                           [0.0, -0.1, 0.2, 0.7, 0.0, 0.0]])
    for reward in (0.0, 1.0):
        token_rewards = terminal_token_rewards(torch.full((3,), reward), mask)
        _, returns = gae(token_rewards, values, mask, gamma=1.0, lam=0.95)
        assert returns[mask.bool()].var() > 0  # the lambda-returns vary: the old EV was a number
        mc = monte_carlo_returns(token_rewards, mask, gamma=1.0)
        assert torch.equal(mc[mask.bool()], torch.full((int(mask.sum()),), reward))
        assert explained_variance(values, returns, mask, mc_returns=mc) is None
    # a batch with different outcomes: defined, and the same number as without the Monte-Carlo check
    token_rewards = terminal_token_rewards(torch.tensor([1.0, 0.0, 0.0]), mask)
    _, returns = gae(token_rewards, values, mask, gamma=1.0, lam=0.95)
    mc = monte_carlo_returns(token_rewards, mask, gamma=1.0)
    ev = explained_variance(values, returns, mask, mc_returns=mc)
    assert ev is not None and ev == pytest.approx(explained_variance(values, returns, mask))
    # discounting makes equal rewards differ by position: defined then
    mc_discounted = monte_carlo_returns(terminal_token_rewards(torch.ones(3), mask), mask, gamma=0.9)
    assert explained_variance(values, returns, mask, mc_returns=mc_discounted) is not None
