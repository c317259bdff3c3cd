"""Losses: clipped PG, k3 KL, entropy bonus, overlong penalty, policy support (eqs. 9-10), guide loss
(eq. 11) and the decoupled objective (eq. 12), with hand-computed values and gradient checks."""

import math

import pytest
import torch

from rise_nemo.core.losses import (
    ObjectiveConfig,
    clipped_pg_loss,
    entropy_bonus,
    guide_loss,
    kl_k3,
    log_policy_support,
    overlong_penalty,
    policy_objective,
)
from rise_nemo.interfaces import KIND_GUIDED, KIND_NATURAL


def test_clipped_pg_hand_computed_asymmetric_clip():
    # three tokens of one sequence with ratios 0.5, 1.0, 1.5
    prev = torch.zeros(1, 3)
    lp = torch.log(torch.tensor([[0.5, 1.0, 1.5]]))
    mask = torch.ones(1, 3)
    loss_pos, frac_pos = clipped_pg_loss(lp, prev, torch.tensor([2.0]), mask, 3.0)
    # A > 0: min(r A, clip(r, 0.8, 1.28) A) = 0.5*2, 1*2, 1.28*2
    assert loss_pos.item() == pytest.approx(-(1.0 + 2.0 + 2.56) / 3)
    assert frac_pos.item() == pytest.approx(1 / 3)
    loss_neg, frac_neg = clipped_pg_loss(lp, prev, torch.tensor([-1.0]), mask, 3.0)
    # A < 0: min(-r, -clip(r)) = -max(r, clip r): -0.8, -1, -1.5
    assert loss_neg.item() == pytest.approx((0.8 + 1.0 + 1.5) / 3)
    assert frac_neg.item() == pytest.approx(1 / 3)


def test_clipped_pg_gradient_is_policy_gradient_on_policy():
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    loss, _ = clipped_pg_loss(lp, lp.detach(), torch.tensor([0.7]), mask, 4.0)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([0.0, -0.7 / 4, -0.7 / 4])


def test_kl_k3_and_entropy_bonus():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    assert kl_k3(lp, lp.detach()).abs().max().item() == 0.0
    ref = torch.tensor([[-1.5, -1.0]])
    k = kl_k3(lp, ref)
    d = ref - lp.detach()
    assert torch.allclose(k, d.exp() - d - 1)
    assert (k > 0).all()
    h = entropy_bonus(lp)
    assert h[0].tolist() == pytest.approx([1.0, 2.0])
    h.sum().backward()
    # score-function gradient of the entropy: -log p per token
    assert lp.grad[0].tolist() == pytest.approx([1.0, 2.0])


def test_overlong_penalty_dapo():
    pen = overlong_penalty(torch.tensor([100, 4096, 6144, 8192, 9000]), max_len=8192, buffer=4096, factor=0.5)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -0.5])
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), max_len=10, buffer=20)


def test_log_policy_support_value_and_gradient_profile():
    gamma = 0.1
    p = torch.tensor([1e-4, 0.05, 0.5, 0.99])
    lp = p.log().requires_grad_()
    lr = log_policy_support(lp, gamma)
    assert torch.allclose(lr, torch.log(p / (p + gamma)), atol=1e-6)
    lr.sum().backward()
    assert torch.allclose(lp.grad, gamma / (p + gamma), atol=1e-6)
    # ~1 for unsupported tokens, ~gamma/(1+gamma) for confident ones
    assert lp.grad[0].item() == pytest.approx(1.0, abs=1e-3)
    assert lp.grad[-1].item() == pytest.approx(gamma / (1 + gamma), abs=1e-3)


def _guided_example():
    # 3 rows: two retained guided trajectories (lengths 2 and 3) and one padding row
    p = torch.tensor([[0.9, 0.2, 0.5, 0.0], [0.01, 0.6, 0.3, 0.8], [0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 1, 1]]).float()
    a_ref = torch.tensor([0.3, 1.7, 0.4])
    rows = torch.tensor([True, True, False])
    return p, mask, a_ref, rows


def test_guide_loss_gradient_matches_eq11_formula():
    gamma, a_max, n_ref = 0.1, 1.0, 2
    p, mask, a_ref, rows = _guided_example()
    lp = p.clamp(min=1e-8).log().requires_grad_()
    loss = guide_loss(lp, mask, a_ref, rows, n_ref, gamma=gamma, a_max=a_max)
    a_tilde = a_ref.clamp(0, a_max)
    lengths = mask.sum(-1)
    # value: -(1/|O_ref|) sum_j A~_j/|o_j| sum_t log rho
    rho = p / (p + gamma)
    expected = (
        -sum(a_tilde[j] / lengths[j] * torch.log(rho[j])[mask[j].bool()].sum() for j in range(2)) / n_ref
    )
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    expected_grad = torch.zeros_like(p)
    for j in range(2):
        for t in range(p.shape[1]):
            if mask[j, t]:
                expected_grad[j, t] = -(a_tilde[j] / (n_ref * lengths[j])) * gamma / (p[j, t] + gamma)
    assert torch.allclose(lp.grad, expected_grad, atol=1e-6)
    assert lp.grad[2].abs().sum() == 0  # non-guided row untouched


def test_guide_loss_uniform_ablation_uses_log_p():
    p, mask, a_ref, rows = _guided_example()
    lp = p.clamp(min=1e-8).log().requires_grad_()
    loss = guide_loss(lp, mask, a_ref, rows, 2, token_weighting="uniform", a_max=10.0)
    loss.backward()
    # gradient per token: -(A~_j / (|O_ref| |o_j|)), no support weighting
    assert lp.grad[0, 1].item() == pytest.approx(-0.3 / (2 * 2))
    assert lp.grad[1, 3].item() == pytest.approx(-1.7 / (2 * 3))


def test_guide_loss_zero_when_nothing_retained_keeps_graph():
    lp = torch.randn(2, 4, requires_grad=True)
    loss = guide_loss(lp, torch.ones(2, 4), torch.tensor([0.5, 0.5]), torch.tensor([False, False]), 0)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert lp.grad.abs().sum().item() == 0.0
    # a non-positive A_ref gives zero weight too
    lp.grad = None
    guide_loss(lp, torch.ones(2, 4), torch.tensor([-0.5, 0.0]), torch.tensor([True, True]), 2).backward()
    assert lp.grad.abs().sum().item() == 0.0


def _batch(seed=0, b=6, t=7):
    g = torch.Generator().manual_seed(seed)
    token_mask = torch.zeros(b, t)
    for i in range(b):
        start = 2 + i % 2
        token_mask[i, start : t - (i % 3)] = 1
    kind = torch.tensor([KIND_NATURAL, KIND_NATURAL, KIND_GUIDED, KIND_NATURAL, KIND_GUIDED, KIND_NATURAL])[
        :b
    ]
    sample_mask = torch.ones(b)
    sample_mask[3] = 0  # one padded natural row
    nat_rows = (kind == KIND_NATURAL) & sample_mask.bool()
    n_nat = (token_mask * nat_rows[:, None]).sum()
    n_guided = ((kind == KIND_GUIDED) & sample_mask.bool()).sum()
    logits_like = -torch.rand(b, t, generator=g) * 3 * token_mask
    data = {
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "kind": kind,
        "advantages": torch.randn(b, generator=g),
        "prev_logprobs": logits_like + 0.3 * torch.randn(b, t, generator=g) * token_mask,
        "reference_policy_logprobs": logits_like + 0.2 * torch.randn(b, t, generator=g) * token_mask,
        "natural_token_count": torch.full((b,), float(n_nat)),
        "guided_seq_count": torch.full((b,), float(n_guided)),
    }
    data["advantages"][2] = 0.4
    data["advantages"][4] = 0.2
    return logits_like, data


def test_policy_objective_microbatch_sum_equals_full_batch():
    cfg = ObjectiveConfig(kl_coef=0.05, entropy_coef=0.01, lambda_guide=0.5)
    base, data = _batch()
    lp_full = base.clone().requires_grad_()
    loss_full, m_full = policy_objective(lp_full, data, cfg)
    loss_full.backward()

    lp_micro = base.clone().requires_grad_()
    total, summed = 0.0, {}
    for idx in ([0, 1], [2, 3, 4], [5]):
        micro = {k: v[idx] for k, v in data.items()}
        loss, m = policy_objective(lp_micro[idx], micro, cfg)
        loss.backward()
        total += loss.item()
        for k, v in m.items():
            summed[k] = summed.get(k, 0.0) + v
    assert total == pytest.approx(loss_full.item(), rel=1e-5, abs=1e-7)
    for k, v in m_full.items():
        assert summed[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert torch.allclose(lp_micro.grad, lp_full.grad, atol=1e-6)
    assert m_full["loss/guide"] != 0.0 and m_full["loss/pg"] != 0.0


def test_policy_objective_decomposes_into_terms_and_keeps_kinds_apart():
    cfg = ObjectiveConfig(lambda_guide=0.25)
    base, data = _batch()
    lp = base.clone().requires_grad_()
    loss, m = policy_objective(lp, data, cfg)
    assert loss.item() == pytest.approx(m["loss/pg"] + 0.25 * m["loss/guide"], rel=1e-6)
    loss.backward()
    # the padded row (sample_mask 0) gets no gradient
    assert lp.grad[3].abs().sum() == 0
    # changing a guided row's log-probs leaves the PG term unchanged; changing a natural row leaves L_guide
    shifted = base.clone()
    shifted[2] -= 1.0
    _, m2 = policy_objective(shifted, data, cfg)
    assert m2["loss/pg"] == pytest.approx(m["loss/pg"]) and m2["loss/guide"] != pytest.approx(m["loss/guide"])
    shifted = base.clone()
    shifted[0] -= 1.0
    _, m3 = policy_objective(shifted, data, cfg)
    assert m3["loss/guide"] == pytest.approx(m["loss/guide"]) and m3["loss/pg"] != pytest.approx(m["loss/pg"])


def test_policy_objective_lambda_zero_and_missing_keys():
    base, data = _batch()
    lp = base.clone().requires_grad_()
    loss, m = policy_objective(lp, data, ObjectiveConfig(lambda_guide=0.0))
    assert loss.item() == pytest.approx(m["loss/pg"])
    loss.backward()
    assert lp.grad[2].abs().sum() == 0 and lp.grad[4].abs().sum() == 0  # guided rows get no gradient
    no_ref = {k: v for k, v in data.items() if k != "reference_policy_logprobs"}
    with pytest.raises(KeyError, match="reference_policy_logprobs"):
        policy_objective(base, no_ref, ObjectiveConfig(kl_coef=0.1))
    with pytest.raises(KeyError, match="natural_token_count"):
        policy_objective(base, {k: v for k, v in data.items() if k != "natural_token_count"}, ObjectiveConfig())


def test_policy_objective_ignores_inf_at_padding():
    base, data = _batch()
    lp = base.clone()
    lp[data["token_mask"] == 0] = -math.inf
    lp.requires_grad_()
    loss, _ = policy_objective(lp, data, ObjectiveConfig(kl_coef=0.1, entropy_coef=0.1))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()


def test_objective_config_validation():
    base, data = _batch()
    with pytest.raises(ValueError, match="token_weighting must be 'policy_support' or 'uniform', got 'flat'"):
        policy_objective(base, data, ObjectiveConfig(token_weighting="flat"))
    with pytest.raises(ValueError, match="gamma"):
        ObjectiveConfig(gamma=0.0)


def test_kl_k3_gradient_and_clamps_are_nemo_rls():
    """NeMo-RL multiplies k3 by exp(logp - logp.detach()) (value 1, adds the score-function
    term, loss_functions.py:418-438), so each token's gradient is logp - ref_logp, not 1 - exp(ref - logp) (an
    8e-3 difference at KL 0.001 was measured); it clamps d = ref - logp to +-20 (no gradient there) and the
    KL to +-10 (utils.py:41-100)."""
    lp = torch.tensor([[-1.0, -2.0, -0.5, -30.0, -0.1]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5, -2.0, -14.0]])
    k = kl_k3(lp, ref)
    d = (ref - lp.detach()).clamp(-20, 20)
    assert torch.allclose(k, (d.exp() - d - 1).clamp(max=10.0))  # the value is unchanged by the weight
    k.sum().backward()
    expected = (lp.detach() - ref)
    expected[0, 3] = 0.0  # d = 28 > 20: input clamp, no gradient
    expected[0, 4] = 0.0  # k3 = e^-13.9 + 12.9 > 10: output clamp, no gradient
    assert torch.allclose(lp.grad, expected, atol=1e-6), lp.grad
