"""Local backend on a real tiny Qwen3: sampling, log-probs, training, state, loading, config errors."""

from __future__ import annotations

import pytest
import torch

from rise_nemo.backends.local import LocalConfigError, build, parse_local_config
from rise_nemo.backends.local.generator import inverse_cdf_sample, sampling_logprobs
from rise_nemo.interfaces import Generator, Policy, SamplingParams

PROMPTS = [
    [{"role": "user", "content": "hello world"}],
    [{"role": "system", "content": "give me advice"}, {"role": "user", "content": "how are you today ? the cat sat"}],
    [{"role": "user", "content": "tea"}],
]


def _batch(rollouts, tokenizer):
    """Right-padded input_ids [B, T], input_lengths [B] and token_mask [B, T] from rollouts."""
    seqs = [r.prompt_token_ids + r.response_token_ids for r in rollouts]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width))
    for i, (r, s) in enumerate(zip(rollouts, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, len(r.prompt_token_ids) : len(s)] = 1
    return {"input_ids": ids, "input_lengths": torch.tensor([len(s) for s in seqs]), "token_mask": mask}


def _nll_loss(lp, data):
    """Mean NLL over response tokens, normalised by the global token count carried in the data."""
    loss = -(lp * data["token_mask"]).sum() / data["global_tokens"][0]
    return loss, {"nll": float(loss.detach())}


def test_implements_interfaces(backend):
    policy, generator = backend
    assert isinstance(policy, Policy) and isinstance(generator, Generator)
    assert policy.engine is generator.engine


def test_generation_is_reproducible_with_seed(backend):
    _, gen = backend
    params = SamplingParams(max_new_tokens=10, seed=7)
    a = gen.generate(PROMPTS, 4, params)
    b = gen.generate(PROMPTS, 4, params)
    c = gen.generate(PROMPTS, 4, SamplingParams(max_new_tokens=10, seed=8))
    toks = lambda res: [[r.response_token_ids for r in row] for row in res]  # noqa: E731
    assert toks(a) == toks(b)
    assert toks(a) != toks(c)
    assert [len(row) for row in a] == [4, 4, 4]
    # Rows of different prompt lengths decoded together equal each prompt decoded alone (left padding).
    alone = gen.generate(PROMPTS[:1], 4, params)
    assert [len(r.prompt_token_ids) for r in a[0]] == [len(r.prompt_token_ids) for r in alone[0]]


def test_unseeded_generation_follows_engine_rng_and_state(backend):
    policy, gen = backend
    params = SamplingParams(max_new_tokens=8)
    state = policy.state_dict()
    first = gen.generate(PROMPTS, 2, params)
    second = gen.generate(PROMPTS, 2, params)
    assert [r.response_token_ids for r in first[1]] != [r.response_token_ids for r in second[1]]
    policy.load_state_dict(state)  # restores the sampling RNG too
    again = gen.generate(PROMPTS, 2, params)
    assert [[r.response_token_ids for r in row] for row in again] == [[r.response_token_ids for r in row] for row in first]


def test_eos_stop_and_finished_flag(backend):
    _, gen = backend
    eos = set(gen.engine.stop_token_ids)
    res = gen.generate(PROMPTS, 16, SamplingParams(max_new_tokens=6, seed=1))
    n_finished = 0
    for row in res:
        for r in row:
            assert len(r.response_token_ids) == len(r.sampling_logprobs) <= 6
            stops = [i for i, t in enumerate(r.response_token_ids) if t in eos]
            if r.finished:
                n_finished += 1
                assert stops == [len(r.response_token_ids) - 1]  # cut right after the first EOS
            else:
                assert stops == [] and len(r.response_token_ids) == 6  # ran to max_new_tokens
    # The random tiny model over a ~40-word vocabulary emits EOS often enough to see both cases.
    assert 0 < n_finished < 48


def test_sampling_logprobs_match_get_logprobs(backend):
    policy, gen = backend
    res = gen.generate(PROMPTS, 3, SamplingParams(max_new_tokens=12, temperature=1.0, top_p=1.0, seed=3))
    rollouts = [r for row in res for r in row]
    data = _batch(rollouts, policy.tokenizer)
    lp = policy.get_logprobs(data)
    assert lp.shape == data["input_ids"].shape and torch.all(lp[:, 0] == 0)
    for i, r in enumerate(rollouts):
        p, n = len(r.prompt_token_ids), len(r.response_token_ids)
        torch.testing.assert_close(lp[i, p : p + n], torch.tensor(r.sampling_logprobs), atol=1e-4, rtol=0)
        assert torch.all(lp[i, p + n :] == 0)


def test_top_p_and_temperature_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    full = sampling_logprobs(logits, 1.0, 1.0)
    torch.testing.assert_close(full, torch.log_softmax(logits, -1))
    p = full.exp()[0]
    # top_p just above the top token's mass keeps exactly the top two tokens, renormalised.
    cut = sampling_logprobs(logits, 1.0, float(p[0]) + 1e-3).exp()[0]
    torch.testing.assert_close(cut[:2], p[:2] / p[:2].sum())
    assert torch.all(cut[2:] == 0)
    # top_p below the top token's mass keeps only the top token.
    assert sampling_logprobs(logits, 1.0, 0.1).exp()[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    cold = sampling_logprobs(logits, 0.5, 1.0)
    torch.testing.assert_close(cold, torch.log_softmax(logits / 0.5, -1))


def test_inverse_cdf_sampler_draws_the_distribution():
    """The sampler's frequencies match the probabilities (400k draws: 5 standard errors), tokens without mass
    (first, middle and last: top-p cut-offs) are never drawn, and a seed fixes the draws."""
    probs = torch.tensor([0.0, 0.5, 0.2, 0.0, 0.3, 0.0], dtype=torch.float64)
    logp = probs.log().float()[None].expand(400_000, -1)
    draws = inverse_cdf_sample(logp, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=6).double() / draws.numel()
    assert torch.all(freq[probs == 0] == 0)
    assert torch.all((freq - probs).abs() <= 5 * (probs * (1 - probs) / draws.numel()).sqrt())
    again = inverse_cdf_sample(logp, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


def test_inverse_cdf_sampler_draws_the_same_tokens_row_chunk_by_row_chunk(monkeypatch):
    """The CDF pass over a few rows at a time (to stay in cache) draws what one pass over the batch draws."""
    import rise_nemo.backends.local.generator as generator

    logp = torch.log_softmax(torch.randn(37, 300, generator=torch.Generator().manual_seed(3)) * 2, -1)
    logp[:, 250:] = float("-inf")  # a top-p style cut-off
    logp = torch.log_softmax(logp, -1)
    whole = inverse_cdf_sample(logp, torch.Generator().manual_seed(4))
    monkeypatch.setattr(generator, "SAMPLER_CHUNK_ELEMENTS", 5 * 300)  # 5 rows per pass, the last one 2
    assert torch.equal(inverse_cdf_sample(logp, torch.Generator().manual_seed(4)), whole)


def test_inverse_cdf_sampler_never_runs_past_the_last_token_with_mass(monkeypatch):
    """u * total can round up to the total: the draw is then the last token with mass, never a masked
    trailing one (or index V)."""
    logp = torch.tensor([[0.25, 0.75, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]).log()
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=kw.get("dtype")))
    assert inverse_cdf_sample(logp, torch.Generator()).tolist() == [1, 0]
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.zeros(shape, dtype=kw.get("dtype")))
    assert inverse_cdf_sample(logp[:, [2, 0, 1, 3]], torch.Generator()).tolist() == [1, 1]


def test_greedy_and_top_p_sampling_logprobs(backend):
    _, gen = backend
    greedy = gen.generate(PROMPTS[:1], 3, SamplingParams(max_new_tokens=5, temperature=0.0))
    assert len({tuple(r.response_token_ids) for r in greedy[0]}) == 1
    assert all(lp == 0.0 for r in greedy[0] for lp in r.sampling_logprobs)
    narrow = gen.generate(PROMPTS[:1], 3, SamplingParams(max_new_tokens=5, top_p=1e-6, seed=0))
    assert [r.response_token_ids for r in narrow[0]] == [r.response_token_ids for r in greedy[0]]


def test_train_lowers_loss_and_micro_batches_sum(tiny_cfg):
    target = " the cat sat on a mat ."
    policy, gen = build(tiny_cfg)
    prompts = [p for p in PROMPTS for _ in range(2)]  # 6 rows -> micro-batches of 4 + 2
    rollouts = []
    for p in prompts:
        r = gen.generate([p], 1, SamplingParams(max_new_tokens=1, seed=0))[0][0]
        r.response_token_ids = gen.encode_response(target)
        rollouts.append(r)
    data = _batch(rollouts, policy.tokenizer)
    data["global_tokens"] = torch.full((len(rollouts),), float(data["token_mask"].sum()))

    def mean_nll():
        lp = policy.get_logprobs(data)
        return float(-(lp * data["token_mask"]).sum() / data["token_mask"].sum())

    before = mean_nll()
    m = policy.train(data, _nll_loss)
    assert m["grad_norm"] > 0 and m["policy/entropy_exact"] > 0
    assert m["nll"] == pytest.approx(before, abs=1e-4)  # summed globally-normalised micro-batch losses
    for _ in range(4):
        policy.train(data, _nll_loss)
    assert mean_nll() < before - 0.5

    # Same update whether the batch is split in micro-batches of 4 or processed as one (global normalisation).
    # eps = 1 makes AdamW's first step ~ lr * grad (not ~ lr * sign(grad)), so a wrongly scaled gradient shows.
    exact = {"lr": 1.0, "eps": 1.0, "grad_clip": 0.0}
    p4, _ = build({**tiny_cfg, **exact})
    p1, _ = build({**tiny_cfg, **exact, "micro_batch_size": 64})
    p4.train(data, _nll_loss)
    p1.train(data, _nll_loss)
    for a, b in zip(p4.model.parameters(), p1.model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_begin_stage_takes_a_checkpoints_weights_with_a_fresh_optimiser_and_no_reference(tiny_cfg, tmp_path):
    """A pipeline's next stage (loop.pipeline.init_policy_from) through the policy's own method."""
    policy, gen = build(tiny_cfg)
    rollouts = [r for row in gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=6, seed=2)) for r in row]
    data = _batch(rollouts, policy.tokenizer)
    data["global_tokens"] = torch.full((len(rollouts),), float(data["token_mask"].sum()))
    policy.train(data, _nll_loss)
    policy.save_checkpoint(tmp_path / "policy")
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}

    other, _ = build({**tiny_cfg, "seed": 1})
    other.reference_logprobs(data)  # a KL reference snapshot of the old weights
    other.train(data, _nll_loss)
    assert other.reference is not None and other.train_steps == 1 and other.optimizer.state
    other.begin_stage(tmp_path / "policy")
    assert all(torch.equal(v, saved[k]) for k, v in other.model.state_dict().items())
    assert other.reference is None and other.train_steps == 0 and not other.optimizer.state
    with pytest.raises(FileNotFoundError, match="no saved state"):
        other.begin_stage(tmp_path / "missing")


def test_state_round_trip(tiny_cfg):
    policy, gen = build(tiny_cfg)
    rollouts = [r for row in gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=6, seed=2)) for r in row]
    data = _batch(rollouts, policy.tokenizer)
    data["global_tokens"] = torch.full((len(rollouts),), float(data["token_mask"].sum()))
    policy.train(data, _nll_loss)  # non-empty AdamW state
    state = policy.state_dict()
    m1 = policy.train(data, _nll_loss)
    after1 = [p.detach().clone() for p in policy.model.parameters()]
    sample1 = gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=6))

    fresh, fresh_gen = build(tiny_cfg)
    fresh.load_state_dict(state)
    assert fresh.train_steps == 1
    m2 = fresh.train(data, _nll_loss)
    assert m2["nll"] == pytest.approx(m1["nll"], abs=1e-6)
    for a, b in zip(after1, fresh.model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    sample2 = fresh_gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=6))
    assert [[r.response_token_ids for r in row] for row in sample1] == [[r.response_token_ids for r in row] for row in sample2]


def test_state_from_another_model_is_rejected(tiny_cfg):
    policy, _ = build(tiny_cfg)
    other, _ = build({**tiny_cfg, "tiny": {**tiny_cfg["tiny"], "hidden_size": 48}})
    with pytest.raises(ValueError, match="checkpoint was written for"):
        other.load_state_dict(policy.state_dict())


def test_load_saved_model_from_local_path(tiny_cfg, tmp_path):
    policy, gen = build(tiny_cfg)
    path = policy.save_pretrained(tmp_path / "model")
    loaded, loaded_gen = build({"model_path": str(path), "seed": 0})
    assert loaded.engine.cfg.model_path == str(path) and loaded.tokenizer.chat_template
    rollouts = [r for row in gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=5)) for r in row]
    data = _batch(rollouts, policy.tokenizer)
    torch.testing.assert_close(loaded.get_logprobs(data), policy.get_logprobs(data), atol=1e-5, rtol=0)
    again = loaded_gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=8, seed=5))
    assert [r.response_token_ids for row in again for r in row] == [r.response_token_ids for r in rollouts]


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"tokenizer": "x", "learning_rate": 1e-3}, r"local\.learning_rate: unknown key"),
        ({"tokenizer": "x", "tiny": {"layers": 2}}, r"local\.tiny\.layers: unknown key"),
        ({"lr": 1e-3}, r"local\.tokenizer: a tiny model"),
        ({"tokenizer": "x", "dtype": "fp8"}, r"local\.dtype"),
        ({"tokenizer": "x", "micro_batch_size": 0}, r"local\.micro_batch_size"),
        ({"tokenizer": "x", "betas": [0.9]}, r"local\.betas"),
        ({"tokenizer": "x", "tiny": {"num_heads": 4, "num_kv_heads": 3}}, r"local\.tiny\.num_kv_heads"),
    ],
)
def test_config_errors_name_the_key(cfg, match):
    with pytest.raises(LocalConfigError, match=match):
        parse_local_config(cfg)


def test_model_key_older_name_and_chat_template_option(tiny_cfg, tmp_path):
    """``local.model`` (the key's older name) still means ``local.model_path``; ``local.chat_template``
    renders prompts of a tokenizer without a template (``passthrough``: NeMo-RL's, the contents only)."""
    policy, _ = build(tiny_cfg)
    path = policy.save_pretrained(tmp_path / "model")
    assert parse_local_config({"model": str(path)}).model_path == str(path)
    with pytest.raises(LocalConfigError, match=r"local\.model: the older name of local\.model_path"):
        parse_local_config({"model": str(path), "model_path": str(tmp_path)})
    _, gen = build({"model_path": str(path), "chat_template": "passthrough"})
    assert gen.encode_prompt(PROMPTS[0]) == gen.engine.tokenizer.encode(PROMPTS[0][0]["content"],
                                                                        add_special_tokens=False)
    _, gen = build({"model_path": str(path), "chat_template": "{{ messages[-1]['content'] }} today ?"})
    assert gen.engine.tokenizer.decode(gen.encode_prompt(PROMPTS[0])) == "hello world today ?"


def test_critic_on_a_model_whose_body_is_not_named_model(tmp_path):
    """GPT-2's transformer body is ``.transformer`` (its base_model_prefix): the critic copies it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rise_nemo.backends.local import LocalCritic
    from rise_nemo.backends.local.tokenizer import build_word_tokenizer

    tok = build_word_tokenizer(["hello world"])
    tok.save_pretrained(tmp_path / "gpt2")
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2)).save_pretrained(tmp_path / "gpt2")
    policy, _ = build({"model_path": str(tmp_path / "gpt2")})
    critic = LocalCritic(policy.engine)
    values = critic.get_values({"input_ids": torch.tensor([[5, 6, 5]])})
    assert values.shape == (1, 3) and float(values.abs().sum()) == 0.0  # zero-initialised head


def test_missing_paths_are_clear_errors(tmp_path):
    with pytest.raises(LocalConfigError, match=r"local\.model_path: .* is not a directory"):
        build({"model_path": str(tmp_path / "nope")})
    (tmp_path / "empty").mkdir()
    with pytest.raises(LocalConfigError, match=r"local\.model_path: .* holds no config\.json"):
        build({"model_path": str(tmp_path / "empty")})
    with pytest.raises(FileNotFoundError, match=r"local\.tokenizer: tokenizer path"):
        build({"tokenizer": str(tmp_path / "nope")})


def test_omegaconf_block_is_accepted(word_tokenizer_dir):
    from omegaconf import OmegaConf

    cfg = parse_local_config(OmegaConf.create({"tokenizer": word_tokenizer_dir, "betas": [0.8, 0.9], "tiny": {"num_layers": 1}}))
    assert cfg.betas == (0.8, 0.9) and cfg.tiny["num_layers"] == 1 and cfg.tiny["hidden_size"] == 64


def test_core_objective_step_is_micro_batch_invariant(tiny_cfg):
    """One RISE-RL update (eq. 12, natural + guided rows) through the real core objective: splitting the
    batch into micro-batches of 3 gives the same summed metrics and the same weights as one pass."""
    from rise_nemo.core.losses import ObjectiveConfig, policy_objective

    objective = ObjectiveConfig(lambda_guide=0.5)
    results = []
    for mbs in (3, 64):
        # eps = 1 makes AdamW's first step ~ lr * grad (not ~ lr * sign(grad)), so a wrongly scaled gradient shows.
        policy, gen = build({**tiny_cfg, "micro_batch_size": mbs, "lr": 1.0, "eps": 1.0, "grad_clip": 0.0})
        rollouts = [r for row in gen.generate(PROMPTS, 3, SamplingParams(max_new_tokens=8, seed=4)) for r in row]
        data = _batch(rollouts, policy.tokenizer)
        b = len(rollouts)
        g = torch.Generator().manual_seed(0)
        data["kind"] = torch.tensor([i % 3 == 2 for i in range(b)], dtype=torch.long)  # every third row guided
        data["sample_mask"] = torch.ones(b)
        data["advantages"] = torch.randn(b, generator=g).abs() * torch.where(data["kind"] == 1, 1.0, 0.0) + torch.randn(
            b, generator=g
        ) * (data["kind"] == 0)
        data["prev_logprobs"] = policy.get_logprobs(data)
        nat = (data["kind"] == 0).float()
        data["natural_token_count"] = torch.full((b,), float((data["token_mask"] * nat[:, None]).sum()))
        data["guided_seq_count"] = torch.full((b,), float((1 - nat).sum()))
        metrics = policy.train(data, lambda lp, mb: policy_objective(lp, mb, objective))
        results.append((metrics, [p.detach().clone() for p in policy.model.parameters()]))
    (m3, w3), (m64, w64) = results
    assert m3["pg/clip_fraction"] == 0.0  # prev_logprobs are the current policy's: ratio 1
    for key in ("loss/total", "loss/pg", "loss/guide", "policy/entropy", "policy/entropy_exact"):
        assert m3[key] == pytest.approx(m64[key], abs=1e-5), key
    assert m3["loss/guide"] > 0
    for a, b in zip(w3, w64):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_bfloat16_weights_sample_and_score(tiny_cfg):
    policy, gen = build({**tiny_cfg, "dtype": "bfloat16"})
    assert next(policy.model.parameters()).dtype == torch.bfloat16
    rollouts = [r for row in gen.generate(PROMPTS, 2, SamplingParams(max_new_tokens=6, seed=1)) for r in row]
    data = _batch(rollouts, policy.tokenizer)
    lp = policy.get_logprobs(data)
    assert lp.dtype == torch.float32
    for i, r in enumerate(rollouts):
        p, n = len(r.prompt_token_ids), len(r.response_token_ids)
        # bf16 logits of a batched KV-cache decode vs one full forward differ by bf16 rounding only.
        torch.testing.assert_close(lp[i, p : p + n], torch.tensor(r.sampling_logprobs), atol=0.1, rtol=0)


def test_tokenizer_without_chat_template_is_a_clear_error(tiny_cfg):
    _, gen = build(tiny_cfg)
    gen.engine.tokenizer.chat_template = None
    with pytest.raises(ValueError, match=r"local\.tokenizer: the tokenizer at .* has no chat template"):
        gen.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2))
