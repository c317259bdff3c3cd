"""On the local backend: the old log-probs (the PPO ratio's pi_old) come from the training forward
(one optimiser step per train call), exact entropy on the response positions only, length-sorted micro-batches."""

from __future__ import annotations

import torch

from rise_nemo.backends.local import build
from rise_nemo.backends.local.policy import has_active_dropout, micro_batch_rows
from rise_nemo.config import load_config
from rise_nemo.core.logprobs import masked_token_entropy, token_entropy
from rise_nemo.core.losses import ObjectiveConfig, policy_loss_fn
from rise_nemo.interfaces import KIND_GUIDED, KIND_NATURAL
from rise_nemo.steps.rollouts import TrainSample, build_batch

CFG = {"tokenizer": "builtin:persistent_task", "seed": 0, "lr": 1e-2, "num_threads": 1, "micro_batch_size": 3,
       "logprob_batch_size": 3}


def _batch(policy, rows: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """Natural and guided rows of different lengths with non-zero advantages (a real eq. 12 batch)."""
    g = torch.Generator().manual_seed(seed)
    vocab = policy.engine.model.config.vocab_size
    samples = []
    for i in range(rows):
        prompt = torch.randint(3, vocab, (int(torch.randint(4, 9, (1,), generator=g)),), generator=g).tolist()
        resp = torch.randint(3, vocab, (int(torch.randint(2, 14, (1,), generator=g)),), generator=g).tolist()
        kind = KIND_GUIDED if i % 4 == 3 else KIND_NATURAL
        samples.append(TrainSample(prompt, resp, kind, float(torch.randn(1, generator=g)), [-1.0] * len(resp),
                                   sampled_under_train_prompt=kind == KIND_NATURAL))
    return build_batch(samples, policy.engine.pad_token_id)


def _loss():
    return policy_loss_fn(ObjectiveConfig(lambda_guide=0.5))


def test_training_forward_logprobs_equal_the_removed_forward_exactly():
    """The loss sees, as prev_logprobs, exactly what get_logprobs (the removed no-grad forward) gives for the same
    rows in the same micro-batch layout: bit for bit, natural and guided rows alike."""
    policy, _ = build(CFG)
    batch = _batch(policy)
    removed = policy.get_logprobs(batch)  # the separate forward the step no longer runs
    seen, loss = torch.zeros_like(removed), _loss()

    def spy(lp, mb):
        rows = [int(r) for r in mb["row"]]
        seen[rows, : lp.shape[1]] = mb["prev_logprobs"].cpu()
        assert torch.equal(mb["prev_logprobs"], torch.where(mb["prev_logprobs"] != 0, lp.detach(), 0.0))
        return loss(lp, mb)

    policy.train({**batch, "row": torch.arange(batch["input_ids"].shape[0])}, spy)
    assert torch.equal(seen, removed)
    assert bool((removed[batch["token_mask"].bool()] < 0).all())  # real log-probs, not placeholders


def test_train_without_prev_logprobs_is_the_old_two_forward_step_exactly():
    """Same weights, AdamW state and metrics as a step given get_logprobs' prev_logprobs (equal layouts)."""
    (old, _), (new, _) = build(CFG), build(CFG)
    batch = _batch(old)
    m_old = old.train({**batch, "prev_logprobs": old.get_logprobs(batch)}, _loss())
    m_new = new.train(batch, _loss())
    assert m_old == m_new
    assert all(torch.equal(a, b) for a, b in zip(old.model.parameters(), new.model.parameters(), strict=True))
    assert m_new["pg/clip_fraction"] == 0.0  # one step on the sampling weights: every ratio is exactly 1


def test_dropout_model_keeps_the_separate_forward(monkeypatch):
    """A model whose training forward is not its eval forward (dropout) gets get_logprobs' log-probs."""
    policy, _ = build(CFG)
    assert not has_active_dropout(policy.model)
    policy.model.config.attention_dropout = 0.1
    assert has_active_dropout(policy.model)
    calls = []
    real = policy.get_logprobs
    monkeypatch.setattr(policy, "get_logprobs", lambda data: calls.append(1) or real(data))
    policy.train(_batch(policy), _loss())
    assert calls == [1]


def test_rubric_step_skips_the_separate_logprob_forward_on_the_local_backend(tmp_path, monkeypatch):
    """The rubric step (rise, guided rows included) no longer calls get_logprobs on the local backend."""
    from rise_nemo.loop.run import build_trainer
    from rise_nemo.steps.rubric import train_step

    cfg = load_config("recipes/rise_tiny_cpu.yaml", [
        f"run.dir={tmp_path}", "sampling.prompts_per_step=2", "sampling.group_size=2", "sampling.max_new_tokens=6",
        "train.steps=1", "train.progress=false", "eval.at_start=false", "eval.every=0", "local.num_threads=1",
        "rise.schedule.switch_step=5", f"data.warm_start_cache={tmp_path / 'cache'}", "++data.warm_start.steps=3",
        "++data.warm_start.eval_samples=1", "++data.task.train_per_topic=1"])
    trainer = build_trainer(cfg)
    calls = []
    monkeypatch.setattr(trainer.policy, "get_logprobs", lambda data: calls.append(1))
    m = train_step(trainer.ctx, trainer.sampler.next_batch(), 1)
    assert calls == [] and m["guidance/active"] and m["loss/pg"] is not None


def test_entropy_on_response_positions_only_keeps_the_metric():
    """masked_token_entropy is token_entropy at the masked positions; the logged policy/entropy_exact is still the
    mean over natural response tokens (the old pass computed every position, then masked the prompt out)."""
    logits = torch.randn(3, 7, 11, dtype=torch.float64)
    mask = torch.rand(3, 7) > 0.4
    mask[0, 0] = True
    torch.testing.assert_close(masked_token_entropy(logits, mask, 2), token_entropy(logits, 2)[mask].float())

    policy, _ = build({**CFG, "lr": 0.0})
    batch = _batch(policy)
    metrics = policy.train(batch, _loss())
    with torch.no_grad():
        ent = token_entropy(policy.engine.forward(batch["input_ids"]))
    natural = batch["token_mask"].bool() & (batch["kind"] == KIND_NATURAL)[:, None]
    assert abs(metrics["policy/entropy_exact"] - float(ent[natural].mean())) < 1e-5


def test_length_sorted_micro_batches_keep_the_loss_and_cut_padding():
    rows = micro_batch_rows(torch.tensor([5, 9, 2, 9, 7]), 2, True)
    assert [r.tolist() for r in rows] == [[1, 3], [4, 0], [2]]  # longest first, stable among equals
    assert [r.tolist() for r in micro_batch_rows(torch.tensor([5, 9, 2]), 2, False)] == [[0, 1], [2]]

    (plain, _), (sorted_, _) = build({**CFG, "sort_by_length": False}), build(CFG)
    grads = {}
    for name, policy in (("plain", plain), ("sorted", sorted_)):
        step = policy._clip_and_step
        policy._clip_and_step = lambda p=policy, n=name, s=step: grads.setdefault(
            n, [x.grad.clone() for x in p.model.parameters()]) and s()
    batch = _batch(plain, rows=12, seed=3)
    m_plain, m_sorted = plain.train(batch, _loss()), sorted_.train(batch, _loss())
    for key, value in m_plain.items():  # globally normalised: only the float summation order differs
        assert abs(m_sorted[key] - value) <= 1e-5 * max(1.0, abs(value)), key
    for a, b in zip(grads["plain"], grads["sorted"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    lengths = batch["input_lengths"]
    width = {s: sum(int(lengths[r].max()) * len(r) for r in micro_batch_rows(lengths, 3, s)) for s in (False, True)}
    assert width[True] < width[False]
