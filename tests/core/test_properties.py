"""Property tests (hypothesis) for the core formulas."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rise_nemo.core.advantages import group_advantages
from rise_nemo.core.logprobs import naive_token_logprobs, token_logprobs
from rise_nemo.core.losses import ObjectiveConfig, policy_objective
from rise_nemo.core.rewards import criterion_priority, failure_matrix, rubric_reward, select_feedback

torch.set_num_threads(1)

weights_st = st.lists(st.integers(-10, 10), min_size=1, max_size=8).filter(lambda w: any(x > 0 for x in w))


@st.composite
def rubric_case(draw):
    w = draw(weights_st)
    g = draw(st.integers(1, 6))
    z = draw(st.lists(st.lists(st.booleans(), min_size=len(w), max_size=len(w)), min_size=g, max_size=g))
    return torch.tensor(z), torch.tensor(w, dtype=torch.float32)


@settings(max_examples=60, deadline=None)
@given(rubric_case())
def test_reward_in_range(case):
    z, w = case
    r = rubric_reward(z, w)
    pos, neg = w.clamp(min=0).sum(), (-w).clamp(min=0).sum()
    assert (r <= 1 + 1e-6).all() and (r >= -neg / pos - 1e-6).all()
    rc = rubric_reward(z, w, clip_min=0.0)
    assert ((rc >= 0) & (rc <= 1 + 1e-6)).all()


@settings(max_examples=60, deadline=None)
@given(rubric_case(), st.data())
def test_priority_monotone_in_failures(case, data):
    z, w = case
    fails = failure_matrix(z, w)
    i = data.draw(st.integers(0, z.shape[0] - 1))
    k = data.draw(st.integers(0, z.shape[1] - 1))
    p = criterion_priority(z, w)
    z2 = z.clone()
    z2[i, k] = ~z2[i, k]  # flip one verdict: turns a failure into a success or vice versa
    p2 = criterion_priority(z2, w)
    became_failure = bool(failure_matrix(z2, w)[i, k]) and not bool(fails[i, k])
    if w[k] == 0:
        assert p2[k] == p[k] == 0
    elif became_failure:
        assert p2[k] == p[k] + abs(w[k])
    else:
        assert p2[k] <= p[k]
    others = [j for j in range(len(w)) if j != k]
    assert torch.equal(p2[others], p[others])


@settings(max_examples=60, deadline=None)
@given(rubric_case(), st.one_of(st.none(), st.integers(0, 10)))
def test_topm_size_and_order(case, m):
    z, w = case
    f = failure_matrix(z, w).sum(0)
    p = criterion_priority(z, w)
    sel = select_feedback(p, f, m)
    n_failed = int((f > 0).sum())
    assert len(sel) == (n_failed if m is None else min(m, n_failed))
    assert len(set(sel)) == len(sel) and all(f[k] > 0 for k in sel)
    assert all(p[a] >= p[b] for a, b in zip(sel, sel[1:]))
    # nothing left out beats anything selected
    left = [k for k in range(len(w)) if f[k] > 0 and k not in sel]
    assert all(p[k] <= p[sel[-1]] for k in left) if sel else True
    assert sel == select_feedback(p, f, m)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=10), st.floats(0.1, 10), st.floats(-3, 3)
)
def test_group_advantages_standardised_and_affine_invariant(rewards, scale, shift):
    r = torch.tensor([rewards], dtype=torch.float64)
    a = group_advantages(r, eps=0.0)
    if r.std() > 1e-6:
        assert abs(a.mean().item()) < 1e-9 and abs(a.std().item() - 1) < 1e-6
        assert torch.allclose(group_advantages(r * scale + shift, eps=0.0), a, atol=1e-6)
    elif r.std() == 0:
        assert (a == 0).all()


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(2, 9),
    st.integers(2, 70),
    st.integers(1, 20),
    st.sampled_from([torch.float32, torch.bfloat16]),
    st.integers(0, 2**31 - 1),
)
def test_chunked_logprobs_equal_naive(b, t, v, chunk, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, t, v, generator=g) * 4).to(dtype)
    ids = torch.randint(0, v, (b, t), generator=g)
    w = torch.randn(b, t, generator=g)
    a = logits.clone().requires_grad_()
    c = logits.float().requires_grad_()  # same values; naive path in fp32
    out = token_logprobs(a, ids, chunk_size=chunk)
    ref = naive_token_logprobs(c, ids)
    assert torch.allclose(out, ref, atol=1e-5)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    if dtype == torch.float32:
        assert torch.allclose(a.grad, c.grad, atol=1e-5)
    else:  # the gradient comes back in bf16: allow one bf16 rounding step (2^-8 relative)
        assert a.grad.dtype == torch.bfloat16
        assert torch.allclose(a.grad.float(), c.grad, rtol=8e-3, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 8), st.integers(0, 2**31 - 1), st.data())
def test_policy_objective_microbatch_invariant(b, seed, data):
    g = torch.Generator().manual_seed(seed)
    t = 6
    token_mask = (torch.rand(b, t, generator=g) > 0.3).float()
    token_mask[:, 0] = 0
    kind = torch.randint(0, 2, (b,), generator=g)
    sample_mask = (torch.rand(b, generator=g) > 0.2).float()
    nat = (kind == 0) & sample_mask.bool()
    lp = -torch.rand(b, t, generator=g) * 4
    batch = {
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "kind": kind,
        "advantages": torch.randn(b, generator=g),
        "prev_logprobs": lp + 0.3 * torch.randn(b, t, generator=g),
        "reference_policy_logprobs": lp + 0.3 * torch.randn(b, t, generator=g),
        "natural_token_count": torch.full((b,), float((token_mask * nat[:, None]).sum())),
        "guided_seq_count": torch.full((b,), float(((kind == 1) & sample_mask.bool()).sum())),
    }
    cfg = ObjectiveConfig(kl_coef=0.1, entropy_coef=0.01, lambda_guide=0.3)
    full, _ = policy_objective(lp, batch, cfg)
    cut = data.draw(st.integers(1, b - 1))
    parts = [
        policy_objective(lp[s], {k: v[s] for k, v in batch.items()}, cfg)[0]
        for s in (slice(0, cut), slice(cut, b))
    ]
    assert abs((parts[0] + parts[1]).item() - full.item()) < 1e-5
