"""Chunked per-token log-probs and entropies equal the naive full-softmax versions (values, gradients)."""

import pytest
import torch

from rise_nemo.core.logprobs import naive_token_entropy, naive_token_logprobs, token_entropy, token_logprobs

torch.set_num_threads(1)


def _case(b=2, t=9, v=37, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, t, v, generator=g) * 3).to(dtype)
    ids = torch.randint(0, v, (b, t), generator=g)
    return logits, ids


def test_alignment_and_column_zero():
    logits, ids = _case()
    out = token_logprobs(logits, ids, chunk_size=4)
    assert out.shape == ids.shape and out.dtype == torch.float32
    assert (out[:, 0] == 0).all()
    b, t = 1, 5
    expected = torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]]
    assert out[b, t].item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 5, 1000])
def test_chunked_equals_naive_values_and_grads(chunk_size):
    logits, ids = _case()
    a = logits.clone().requires_grad_()
    c = logits.clone().requires_grad_()
    w = torch.randn(ids.shape)
    out_chunked = token_logprobs(a, ids, chunk_size=chunk_size)
    out_naive = naive_token_logprobs(c, ids)
    assert torch.allclose(out_chunked, out_naive, atol=1e-5)
    (out_chunked * w).sum().backward()
    (out_naive * w).sum().backward()
    assert torch.allclose(a.grad, c.grad, atol=1e-5)
    assert torch.equal(logits, a.detach())  # input never modified in place


def test_bf16_logits_keep_dtype_in_gradient():
    logits, ids = _case(dtype=torch.bfloat16)
    a = logits.clone().requires_grad_()
    out = token_logprobs(a, ids, chunk_size=3)
    ref = naive_token_logprobs(logits.float(), ids)
    assert torch.allclose(out, ref, atol=1e-5)  # computed in fp32 from the same bf16 values
    out.sum().backward()
    assert a.grad.dtype == torch.bfloat16


def test_entropy_equals_naive_values_and_grads():
    logits, _ = _case(v=11)
    a = logits.clone().requires_grad_()
    c = logits.clone().requires_grad_()
    w = torch.randn(logits.shape[:2])
    e1 = token_entropy(a, chunk_size=4)
    e2 = naive_token_entropy(c)
    assert torch.allclose(e1, e2, atol=1e-5)
    (e1 * w).sum().backward()
    (e2 * w).sum().backward()
    assert torch.allclose(a.grad, c.grad, atol=1e-5)
    assert torch.equal(logits, a.detach())


def test_shape_errors():
    with pytest.raises(ValueError, match="must match"):
        token_logprobs(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        token_entropy(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), chunk_size=0)
