"""The loss adapter (CPU, no NeMo-RL): splitting a global batch into data-parallel shards and micro-batches,
the way NeMo-RL's Megatron worker does, and summing the adapter's losses/metrics/gradients reproduces the
unsplit core objective (eq. 12) exactly."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch

from rise_nemo.backends.nemo.batch import attach_global_counts, pad_train_batch
from rise_nemo.backends.nemo.loss import RiseLossFunction, align_next_token_logprobs
from rise_nemo.core.losses import ObjectiveConfig, policy_objective
from rise_nemo.interfaces import KIND_GUIDED, KIND_NATURAL

torch.set_num_threads(1)


def make_batch(seed: int = 0, b: int = 12, t: int = 20) -> dict[str, torch.Tensor]:
    """Mixed natural/guided rows, ragged right-padded responses, a masked-out row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, t + 1, (b,), generator=g)
    prompt = torch.randint(2, 6, (b,), generator=g)
    token_mask = torch.zeros(b, t)
    for i in range(b):
        token_mask[i, prompt[i]: lengths[i]] = 1.0
    kind = torch.tensor([KIND_GUIDED if i % 3 == 2 else KIND_NATURAL for i in range(b)])
    sample_mask = torch.ones(b)
    sample_mask[1] = 0.0
    batch = {
        "input_ids": torch.randint(0, 50, (b, t), generator=g),
        "input_lengths": lengths,
        "token_mask": token_mask,
        "sample_mask": sample_mask,
        "kind": kind,
        "advantages": torch.randn(b, generator=g),
        "prev_logprobs": -torch.rand(b, t, generator=g) * 3,
        "generation_logprobs": -torch.rand(b, t, generator=g) * 3,
    }
    return attach_global_counts(batch)


def objective(token_weighting="policy_support"):
    cfg = ObjectiveConfig(clip_low=0.2, clip_high=0.28, lambda_guide=0.05, gamma=0.1, token_weighting=token_weighting)
    return functools.partial(policy_objective, cfg=cfg)


def nemo_style_logprobs(batch, seed=1):
    """What NeMo-RL hands the loss: next-token log-probs [B, T-1] (with grad)."""
    b, t = batch["input_ids"].shape
    return (-torch.rand(b, t - 1, generator=torch.Generator().manual_seed(seed)) * 3).requires_grad_(True)


def slice_rows(batch, lo, hi):
    return {k: v[lo:hi] for k, v in batch.items()}


def run_sharded(loss_fn, batch, next_lp, dp: int, mbs: int):
    """NeMo-RL: shard rows over DP ranks, each rank loops over micro-batches; losses/metrics are summed."""
    b = batch["input_ids"].shape[0]
    assert b % (dp * mbs) == 0
    per_rank = b // dp
    total, metrics = 0.0, {}
    for rank in range(dp):
        for start in range(rank * per_rank, (rank + 1) * per_rank, mbs):
            loss, m = loss_fn(data=slice_rows(batch, start, start + mbs), global_valid_seqs=None,
                              global_valid_toks=None, next_token_logprobs=next_lp[start: start + mbs])
            total = total + loss
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v
    return total, metrics


@pytest.mark.parametrize("dp, mbs", [(1, 1), (2, 3), (3, 2), (4, 1), (1, 12)])
@pytest.mark.parametrize("weighting", ["policy_support", "uniform"])
def test_sharded_sum_equals_unsplit_core_loss(dp, mbs, weighting):
    batch = make_batch()
    next_lp = nemo_style_logprobs(batch)
    aligned = align_next_token_logprobs(next_lp, batch["token_mask"].shape[1])
    ref_loss, ref_metrics = objective(weighting)(aligned, batch)
    ref_grad, = torch.autograd.grad(ref_loss, next_lp)

    loss, metrics = run_sharded(RiseLossFunction(objective(weighting)), batch, next_lp, dp, mbs)
    grad, = torch.autograd.grad(loss, next_lp)
    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), abs=1e-6)
    torch.testing.assert_close(grad, ref_grad, atol=1e-7, rtol=1e-5)
    for k, v in ref_metrics.items():
        assert metrics[k] == pytest.approx(v, abs=1e-6), k
    assert metrics["loss"] == pytest.approx(float(ref_loss.detach()), abs=1e-6)
    assert float(ref_loss.detach()) != 0.0 and float(ref_metrics["loss/guide"]) != 0.0  # both terms are exercised


def test_padding_rows_change_nothing():
    batch = make_batch(b=10)
    next_lp = nemo_style_logprobs(batch)
    ref, _ = RiseLossFunction(objective())(next_lp, batch)
    padded, rows = pad_train_batch(batch, row_multiple=4, seq_multiple=8, pad_id=0)  # 12 rows x 24 tokens
    assert rows == 10 and padded["input_ids"].shape == (12, 24)
    lp = torch.zeros(12, 23)
    lp[:10, :19] = next_lp.detach()
    loss, _ = run_sharded(RiseLossFunction(objective()), padded, lp, dp=2, mbs=2)
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), abs=1e-6)


def test_counts_are_global_not_per_shard():
    batch = make_batch()
    natural = (batch["kind"] == KIND_NATURAL) & batch["sample_mask"].bool()
    assert float(batch["natural_token_count"][0]) == float(batch["token_mask"][natural].sum())
    assert float(batch["guided_seq_count"][0]) == float(((batch["kind"] == KIND_GUIDED) & batch["sample_mask"].bool()).sum())
    assert batch["natural_token_count"].unique().numel() == 1


def test_alignment_matches_our_convention():
    next_lp = torch.tensor([[-1.0, -2.0, -3.0]])
    assert align_next_token_logprobs(next_lp, 4).tolist() == [[0.0, -1.0, -2.0, -3.0]]
    assert align_next_token_logprobs(next_lp, 3).tolist() == [[0.0, -1.0, -2.0]]  # packing: trimmed
    assert align_next_token_logprobs(next_lp, 6).tolist() == [[0.0, -1.0, -2.0, -3.0, 0.0, 0.0]]


def test_picklable_and_declares_nemo_types():
    fn = RiseLossFunction(objective())
    clone = pickle.loads(pickle.dumps(fn))
    batch = make_batch()
    lp = nemo_style_logprobs(batch)
    assert float(clone(lp, batch)[0].detach()) == pytest.approx(float(fn(lp, batch)[0].detach()))
    assert fn.input_type.value == "logprob" and fn.loss_type.value == "token_level"


def test_adapter_reports_num_valid_samples_per_micro_batch():
    """NeMo-RL's DTensor worker reads ``loss_metrics["num_valid_samples"]`` for every micro-batch
    (dtensor_policy_worker.py:916) and every NeMo-RL loss reports it as the micro-batch's sample_mask sum;
    summed over micro-batches (as NeMo-RL sums metrics) it is the global count of valid samples."""
    batch = make_batch()
    loss_fn = RiseLossFunction(objective())
    next_lp = nemo_style_logprobs(batch)
    total = 0.0
    for lo in range(0, 12, 4):
        _, m = loss_fn(data=slice_rows(batch, lo, lo + 4), global_valid_seqs=None, global_valid_toks=None,
                       next_token_logprobs=next_lp[lo: lo + 4])
        assert m["num_valid_samples"] == float(batch["sample_mask"][lo: lo + 4].sum())
        total += m["num_valid_samples"]
    assert total == 11.0
