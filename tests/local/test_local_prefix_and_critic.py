"""Local backend: rollouts that continue a given prefix, a masked prefix gets exactly zero gradient while
conditioning the continuation, and the LocalCritic (right-shifted values, training, exact state)."""

from __future__ import annotations

import torch

from rise_nemo.backends.local import LocalCritic, build
from rise_nemo.core.losses import ObjectiveConfig, policy_loss_fn
from rise_nemo.core.value import make_value_loss
from rise_nemo.interfaces import KIND_NATURAL, SamplingParams
from rise_nemo.steps.rollouts import TrainSample, build_batch

CFG = {"tokenizer": "builtin:reasoning_task", "seed": 0, "lr": 1e-3, "num_threads": 1,
       "tiny": {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16, "intermediate_size": 64}}
PROMPT = [{"role": "user", "content": "mod 61 start 5 a add 3 b sub 2"}]


def test_generate_continues_a_given_prefix():
    policy, gen = build(CFG)
    prefix = gen.encode_response("step a add 3 = 8")[:-1]  # without EOS
    out = gen.generate([PROMPT], 3, SamplingParams(max_new_tokens=6, seed=1), prefixes=[prefix])
    for r in out[0]:
        assert r.response_token_ids[: len(prefix)] == prefix
        assert r.given_token_count == len(prefix)
        assert r.sampling_logprobs[: len(prefix)] == [0.0] * len(prefix)
        assert len(r.response_token_ids) - len(prefix) <= 6  # max_new_tokens counts sampled tokens only
    # the same call without prefixes samples from the prompt alone
    plain = gen.generate([PROMPT], 1, SamplingParams(max_new_tokens=6, seed=1))[0][0]
    assert plain.given_token_count == 0
    # sampled tokens are the continuation of prompt + prefix: the sampling log-prob of the first sampled
    # token equals the policy's log-prob at that position (temperature 1, top_p 1)
    r = out[0][0]
    ids = torch.tensor([r.prompt_token_ids + r.response_token_ids])
    lp = policy.get_logprobs({"input_ids": ids, "input_lengths": torch.tensor([ids.shape[1]])})
    first = len(r.prompt_token_ids) + len(prefix)
    assert abs(float(lp[0, first]) - r.sampling_logprobs[len(prefix)]) < 1e-4


def _prefix_batch(gen, given: int):
    prompt = gen.encode_prompt(PROMPT)
    response = gen.encode_response("step a add 3 = 8 step b sub 2 = 6 answer 6")
    s = TrainSample(prompt, response, KIND_NATURAL, 1.0, [0.0] * len(response), sampled_under_train_prompt=True,
                    given_tokens=given)
    batch = build_batch([s])
    return batch, len(prompt)


def test_masked_prefix_gets_zero_gradient_but_conditions_the_continuation():
    policy, gen = build(CFG)
    batch, p = _prefix_batch(gen, given=5)
    assert batch["token_mask"][0, p : p + 5].sum() == 0 and batch["token_mask"][0, p + 5 :].sum() > 0
    batch["prev_logprobs"] = policy.get_logprobs(batch)
    ids = batch["input_ids"].clone().requires_grad_(False)
    # gradient w.r.t. the per-token log-probs: exactly zero on given tokens
    logits = policy.engine.forward(ids)
    from rise_nemo.core.logprobs import token_logprobs

    lp = token_logprobs(logits, ids, 256)
    lp.retain_grad()
    loss, _ = policy_loss_fn(ObjectiveConfig())(lp, batch)
    loss.backward()
    assert torch.all(lp.grad[0, : p + 5] == 0)
    assert torch.all(lp.grad[0, p + 5 :][batch["token_mask"][0, p + 5 :].bool()] != 0)
    # the prefix still conditions the continuation: changing a given token changes the trained log-probs
    other = ids.clone()
    other[0, p + 2] = gen.encode_response("9")[0]
    lp2 = policy.get_logprobs({"input_ids": other, "input_lengths": batch["input_lengths"]})
    lp1 = policy.get_logprobs(batch)
    assert not torch.allclose(lp1[0, p + 5 :], lp2[0, p + 5 :])


def test_critic_values_are_right_shifted_and_training_lowers_the_value_loss():
    policy, gen = build(CFG)
    critic = LocalCritic(policy.engine, lr=3e-3)
    batch, p = _prefix_batch(gen, given=0)
    ids = batch["input_ids"]
    v = critic.get_values(batch)
    assert v.shape == ids.shape and torch.all(v == 0)  # zero-initialised head
    # right shift: values[t] depends on ids[:t] only; changing token t leaves values[: t + 1] unchanged
    torch.nn.init.normal_(critic.head.weight)
    v1 = critic.get_values(batch)
    other = ids.clone()
    other[0, p + 3] = gen.encode_response("9")[0]
    v2 = critic.get_values({"input_ids": other, "input_lengths": batch["input_lengths"]})
    assert torch.equal(v1[0, : p + 4], v2[0, : p + 4]) and not torch.equal(v1[0, p + 4 :], v2[0, p + 4 :])
    torch.nn.init.zeros_(critic.head.weight)
    mask = batch["token_mask"]
    data = {**batch, "values": critic.get_values(batch), "returns": mask * 0.8,
            "value_token_count": torch.full((1,), float(mask.sum()))}
    loss_fn = make_value_loss(clip=None)
    losses = [critic.train(data, loss_fn)["critic/value_loss"] for _ in range(15)]
    assert losses[-1] < 0.25 * losses[0]
    # the policy's weights are untouched by critic training (separate weights)
    before = {k: t.clone() for k, t in policy.model.state_dict().items()}
    critic.train(data, loss_fn)
    assert all(torch.equal(before[k], t) for k, t in policy.model.state_dict().items())


def test_critic_state_dict_restores_weights_and_optimizer_exactly():
    policy, gen = build(CFG)
    batch, _ = _prefix_batch(gen, given=0)
    mask = batch["token_mask"]
    data = {**batch, "values": torch.zeros_like(mask), "returns": mask * 0.5,
            "value_token_count": torch.full((1,), float(mask.sum()))}
    loss_fn = make_value_loss(clip=0.2)
    a = LocalCritic(policy.engine, lr=1e-3)
    a.train(data, loss_fn)
    state = a.state_dict()
    b = LocalCritic(policy.engine, lr=1e-3)
    b.load_state_dict(state)
    a.train(data, loss_fn)
    b.train(data, loss_fn)
    assert torch.equal(a.get_values(batch), b.get_values(batch))


def test_checkpoint_hooks_write_state_pt_and_read_the_older_layout(tmp_path):
    """interfaces.Policy/Critic hooks: <dir>/state.pt; a checkpoint written before the hooks held the same
    state as step_N/policy.pt and step_N/critic.pt, and still resumes."""
    policy, gen = build(CFG)
    batch, _ = _prefix_batch(gen, given=0)
    mask = batch["token_mask"]
    data = {**batch, "values": torch.zeros_like(mask), "returns": mask * 0.5,
            "value_token_count": torch.full((1,), float(mask.sum()))}
    critic = LocalCritic(policy.engine, lr=1e-3)
    critic.train(data, make_value_loss(clip=0.2))
    policy.save_checkpoint(tmp_path / "new" / "policy")
    critic.save_checkpoint(tmp_path / "new" / "critic")
    assert sorted(p.name for p in (tmp_path / "new" / "policy").iterdir()) == ["state.pt"]
    legacy = tmp_path / "old"
    legacy.mkdir()
    torch.save(policy.state_dict(), legacy / "policy.pt")
    torch.save(critic.state_dict(), legacy / "critic.pt")
    for root in (tmp_path / "new", legacy):
        other, _ = build(CFG)
        with torch.no_grad():
            for param in other.model.parameters():
                param.add_(1.0)  # so that only a real load makes it equal again
        other_critic = LocalCritic(other.engine, lr=1e-3)
        assert not torch.equal(critic.get_values(batch), other_critic.get_values(batch))
        other.load_checkpoint(root / "policy")
        other_critic.load_checkpoint(root / "critic")
        assert all(torch.equal(a, b) for a, b in zip(policy.model.state_dict().values(), other.model.state_dict().values()))
        assert torch.equal(critic.get_values(batch), other_critic.get_values(batch))
    try:
        policy.load_checkpoint(tmp_path / "nowhere" / "policy")
    except FileNotFoundError as exc:
        assert "state.pt is missing" in str(exc)
    else:
        raise AssertionError("a missing checkpoint loaded")
