"""The nemo backend's reasoning pieces on CPU stand-ins of NeMo-RL (tests/nemo/cpu_nemo.py): given response
prefixes through vLLM's token-id input, per-token advantages through the train batch, and the critic on
NeMo-RL's ``Value`` API. The same seams against NeMo-RL's own code are in test_with_nemo_rl.py."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from cpu_nemo import CpuMegatronPolicy, CpuValue, CpuVllm, make_refit, make_tokenizer, master_config  # noqa: E402

from rise_nemo.backends.nemo.batch import BatchError, check_train_batch, to_nemo_train_batch  # noqa: E402
from rise_nemo.backends.nemo.critic import (  # noqa: E402
    VALUE_COUNT_KEY,
    NemoCritic,
    ValueLossFunction,
    align_values,
    value_config,
)
from rise_nemo.backends.nemo.loss import RiseLossFunction  # noqa: E402
from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoPolicy, NemoSession  # noqa: E402
from rise_nemo.interfaces import Critic, Generator, SamplingParams  # noqa: E402

torch.set_num_threads(1)
MAX_NEW = 6


def make(dp=2, mbs=2):
    events: list[str] = []
    tok = make_tokenizer()
    policy = CpuMegatronPolicy(len(tok), dp, events)
    vllm = CpuVllm(len(tok), MAX_NEW, tok.pad_token_id, tok.eos_token_id, events)
    session = NemoSession(policy, vllm, tok, master_config(MAX_NEW, mbs), refit=make_refit(events), to_batched=dict)
    value = CpuValue(len(tok), dp, events, colocated_policy=policy)
    cfg = {"train_micro_batch_size": mbs, "logprob_batch_size": mbs, "make_sequence_length_divisible_by": 4,
           "train_global_batch_size": 4 * dp * mbs}
    return session, NemoGenerator(session), NemoPolicy(session, False), NemoCritic(session, value, cfg), value, tok


PROMPTS = [[{"role": "user", "content": "describe the river"}], [{"role": "user", "content": "describe the sun"}]]
PARAMS = SamplingParams(max_new_tokens=MAX_NEW, temperature=1.0, top_p=1.0)


def test_prefix_is_context_for_vllm_and_recorded_as_given():
    session, gen, _, _, _, tok = make()
    assert isinstance(gen, Generator)
    given = [tok.convert_tokens_to_ids(["alpha", "beta"]), tok.convert_tokens_to_ids(["moon"])]
    out = gen.generate(PROMPTS, 3, PARAMS, prefixes=given)
    assert [len(g) for g in out] == [3, 3]
    for group, prefix, prompt in zip(out, given, PROMPTS):
        for r in group:
            assert r.prompt_token_ids == gen.encode_prompt(prompt)  # the ORIGINAL prompt, not prompt + prefix
            assert r.response_token_ids[: len(prefix)] == prefix and r.given_token_count == len(prefix)
            assert r.sampling_logprobs[: len(prefix)] == [0.0] * len(prefix)
            sampled = len(r.response_token_ids) - len(prefix)
            assert 1 <= sampled <= MAX_NEW  # max_new_tokens counts sampled tokens only
            assert all(lp < 0 for lp in r.sampling_logprobs[len(prefix):])
            assert r.response_text.split()[: len(prefix)] == tok.convert_ids_to_tokens(prefix)


def test_prefix_conditions_the_continuation():
    """The bigram stand-in samples from the last context token: greedy continuations of two prefixes that end
    in different tokens differ from each other and each equals vLLM continuing prompt + prefix."""
    session, gen, _, _, _, tok = make()
    vllm = session.generation
    a, b = tok.convert_tokens_to_ids(["alpha"]), tok.convert_tokens_to_ids(["river"])
    greedy = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0)
    ra, rb = (gen.generate(PROMPTS[:1], 1, greedy, prefixes=[p])[0][0] for p in (a, b))
    first = lambda last: int(torch.log_softmax(vllm.model.table[last], -1).argmax())  # noqa: E731
    assert ra.response_token_ids[1] == first(a[0]) and rb.response_token_ids[1] == first(b[0])
    assert ra.response_token_ids[1:] != rb.response_token_ids[1:]


def test_no_prefix_and_empty_prefix_match_plain_generation():
    _, gen, _, _, _, _ = make()
    greedy = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0)
    plain = gen.generate(PROMPTS, 1, greedy)
    empty = gen.generate(PROMPTS, 1, greedy, prefixes=[[], []])
    assert [r[0].response_token_ids for r in plain] == [r[0].response_token_ids for r in empty]
    assert all(r[0].given_token_count == 0 for r in plain + empty)
    with pytest.raises(ValueError, match="1 prefixes for 2 prompts"):
        gen.generate(PROMPTS, 1, greedy, prefixes=[[]])


def _ppo_batch(b=4, t=12, given=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    token_mask = torch.zeros(b, t)
    token_mask[:, 4 + given: t - 1] = 1  # prompt 0..3, given prefix 4..4+given-1 (context only), then sampled
    tadv = torch.randn(b, t, generator=g) * token_mask
    return {
        "input_ids": torch.randint(1, 20, (b, t), generator=g),
        "input_lengths": torch.full((b,), t),
        "token_mask": token_mask,
        "sample_mask": torch.ones(b),
        "kind": torch.zeros(b, dtype=torch.long),
        "token_advantages": tadv,
        "prev_logprobs": -torch.rand(b, t, generator=g),
        "returns": torch.rand(b, t, generator=g) * token_mask,
        "values": torch.rand(b, t, generator=g) * token_mask,
    }


def test_token_advantages_travel_to_the_loss_unchanged():
    batch = _ppo_batch()
    check_train_batch(batch)  # per-token advantages alone are a valid batch
    train, rows = to_nemo_train_batch(batch, dp_size=2, micro_batch_size=3, seq_multiple=8, pad_id=0,
                                      behaviour_ratio=False)
    assert train["token_advantages"].shape == (6, 16) and rows == 4
    torch.testing.assert_close(train["token_advantages"][:4, :12], batch["token_advantages"])
    assert float(train["token_advantages"][4:].abs().sum()) == 0.0 and float(train["token_advantages"][:, 12:].abs().sum()) == 0
    seen = {}

    def objective(logprobs, data):
        seen["tadv"] = data["token_advantages"]
        return (logprobs * data["token_mask"]).sum() * 0.0, {}

    RiseLossFunction(objective)(torch.zeros(6, 15), train)
    assert seen["tadv"] is train["token_advantages"]
    bad = {k: v for k, v in batch.items() if k != "token_advantages"}
    with pytest.raises(BatchError, match="missing key 'advantages'"):
        check_train_batch(bad)
    with pytest.raises(BatchError, match="'token_advantages' has shape"):
        check_train_batch({**batch, "token_advantages": torch.zeros(4)})


def clipped_value_loss(values, data, clip=0.2):
    """The PPO clipped value loss (NeMo-RL's MseValueLossFn formula), globally normalised by the count the
    critic attaches: a stand-in for the core's loss (rise_nemo.core, written alongside)."""
    mask = data["token_mask"] * data["sample_mask"][:, None]
    old, ret = data["values"], data["returns"]
    clipped = old + (values - old).clamp(-clip, clip)
    per_tok = torch.max((values - ret) ** 2, (clipped - ret) ** 2)
    loss = 0.5 * (per_tok * mask).sum() / data[VALUE_COUNT_KEY][0]
    return loss, {"value_loss": float(loss.detach())}


def test_critic_values_follow_the_right_shift_and_phases():
    session, gen, _, critic, value, _ = make()
    assert isinstance(critic, Critic)
    batch = _ppo_batch(b=3, t=10)
    gen.generate(PROMPTS, 1, PARAMS)  # opens the generation window
    values = critic.get_values(batch)
    assert values.shape == (3, 10) and torch.all(values[:, 0] == 0)
    raw = value.model(batch["input_ids"]).squeeze(-1).detach()
    torch.testing.assert_close(values[:, 1:], raw[:, :-1])  # values[t] = V(input_ids[:t])
    ev = value.events
    assert ev.index("vllm.finish_generation") < ev.index("value.prepare_for_inference") < ev.index(
        "value.get_values") < ev.index("value.finish_inference")
    assert not value.on_gpu


def test_critic_trains_to_lower_value_loss_and_sums_microbatches_exactly():
    _, _, _, critic, value, _ = make(dp=2, mbs=1)
    batch = _ppo_batch(b=3, t=10, seed=1)
    loss = functools.partial(clipped_value_loss, clip=10.0)

    def full_loss():
        v = critic.get_values(batch)
        data = {**batch, VALUE_COUNT_KEY: torch.full((3,), float(batch["token_mask"].sum()))}
        return float(loss(v, data)[0])

    before = full_loss()
    metrics = critic.train(batch, loss)
    # NeMo-RL's sum over 8 micro-batches (3 rows padded to train_global_batch_size 8) is the global loss
    assert metrics["critic/value_loss"] == pytest.approx(before, rel=1e-5)
    call = value.train_calls[0]
    assert call["input_ids"].shape[0] == 8 and float(call["sample_mask"][3:].sum()) == 0
    assert torch.all(call[VALUE_COUNT_KEY] == batch["token_mask"].sum())
    for _ in range(30):
        critic.train(batch, loss)
    assert full_loss() < 0.5 * before
    assert not value.on_gpu and value.events[-2:] == ["value.get_values", "value.finish_inference"]
    with pytest.raises(ValueError, match="missing key"):
        critic.train({k: v for k, v in batch.items() if k != "returns"}, loss)


def test_value_loss_wrapper_accepts_nemo_shapes():
    fn = ValueLossFunction(lambda v, d: ((v * d["token_mask"]).sum(), {"n": 1.0}))
    assert fn.input_type.value == "logit" and fn.loss_type.value == "token_level"
    data = {"token_mask": torch.ones(2, 5), "sample_mask": torch.tensor([1.0, 0.0])}
    loss3, m = fn(torch.ones(2, 5, 1), data)  # [B, S, 1] before NeMo-RL squeezes it
    assert float(loss3) == 10.0 and m["loss"] == 10.0 and m["n"] == 1.0
    # With sequence packing the value worker passes the values as ``logits=``
    # (SequencePackingLossWrapper, wrapper.py:136-141), and NeMo-RL's workers read num_valid_samples
    loss_kw, m_kw = fn(logits=torch.ones(2, 5), data=data, global_valid_seqs=None, global_valid_toks=None)
    assert float(loss_kw) == 10.0 and m_kw["num_valid_samples"] == m["num_valid_samples"] == 2.0  # rows, as MseValueLossFn
    assert align_values(torch.ones(2, 3), 5).tolist() == [[1, 1, 1, 0, 0]] * 2
    assert align_values(torch.ones(2, 7), 5).shape == (2, 5)


def test_critic_checkpoint_between_training_phases(tmp_path):
    _, _, _, critic, value, _ = make()
    critic.save_checkpoint(tmp_path / "critic")
    assert (tmp_path / "critic" / "weights" / "model.pt").exists()
    assert (tmp_path / "critic" / "optimizer" / "optim.pt").exists()
    assert value.events[-3:] == ["value.prepare_for_training", "value.save_checkpoint", "value.finish_training"]
    with pytest.raises(RuntimeError, match="built from scratch"):
        critic.load_checkpoint(tmp_path / "critic")
    critic.resumed_from = tmp_path / "critic"
    critic.load_checkpoint(tmp_path / "critic")


def test_value_config_derives_from_the_policy():
    policy = {"model_name": "Qwen/Qwen2.5-Math-7B", "tokenizer": {"name": "Qwen/Qwen2.5-Math-7B"},
              "train_global_batch_size": 512, "train_micro_batch_size": 1, "max_total_sequence_length": 3072,
              "make_sequence_length_divisible_by": 2, "precision": "bfloat16", "generation": {"backend": "vllm"},
              "megatron_cfg": {"enabled": True, "tensor_model_parallel_size": 2, "fp8_cfg": {"enabled": True},
                               "optimizer": {"lr": 5e-7, "weight_decay": 0.1}}}
    cfg = value_config(policy, {"megatron_cfg": {"optimizer": {"lr": 1.5e-6}}})
    assert cfg["model_name"] == "Qwen/Qwen2.5-Math-7B" and "generation" not in cfg
    assert cfg["megatron_cfg"]["optimizer"] == {"lr": 1.5e-6, "weight_decay": 0.1}
    assert cfg["megatron_cfg"]["tensor_model_parallel_size"] == 2 and not cfg["megatron_cfg"]["fp8_cfg"]["enabled"]
    assert cfg["dtensor_cfg"] == {"enabled": False} and cfg["reward_model_cfg"] == {"enabled": False}
    assert policy["megatron_cfg"]["optimizer"]["lr"] == 5e-7  # the policy's config is not modified


def test_build_critic_places_the_value_model_from_the_recipe_and_resumes_it(tmp_path, monkeypatch):
    """backends.nemo.build_critic(cfg, policy, checkpoint=): the factory signature both backends share. The
    value model goes on the session's training cluster and loads ``<checkpoint>/critic`` when it holds weights."""
    from types import SimpleNamespace

    import rise_nemo.backends.nemo as nemo_backend
    from rise_nemo.backends.nemo.config import NemoConfigError
    from rise_nemo.backends.nemo.placement import NemoPlacementError

    session, _, policy, _, value, tok = make()
    cluster = SimpleNamespace(name="grpo_policy_cluster", max_colocated_worker_groups=3)  # as build_backend builds it
    session.train_cluster = cluster
    built = []

    def fake_build_value(cluster, tokenizer, config, resume_dir, policy=None):
        built.append((cluster, tokenizer, config, resume_dir, policy))
        return value

    monkeypatch.setattr("rise_nemo.backends.nemo.critic.build_value", fake_build_value)
    recipe = {"backend": "nemo", "method": "ppo", "nemo": {"value": {"megatron_cfg": {"optimizer": {"lr": 2e-6}}}}}
    (tmp_path / "step_000004" / "critic" / "weights").mkdir(parents=True)
    fresh = nemo_backend.build_critic(recipe, policy)
    assert session.colocated_groups == 3  # policy, vLLM and now the value model
    session.colocated_groups = 2  # a run builds its critic once: the resumed one stands for a second run
    resumed = nemo_backend.build_critic(recipe, policy, checkpoint=tmp_path / "step_000004")
    assert isinstance(fresh, Critic) and isinstance(resumed, NemoCritic)
    assert [b[0] for b in built] == [cluster] * 2 and built[0][1] is tok and built[0][4] is session.policy
    assert built[0][2]["megatron_cfg"]["optimizer"]["lr"] == 2e-6
    assert built[0][3] is None and built[1][3] == tmp_path / "step_000004" / "critic"
    resumed.load_checkpoint(tmp_path / "step_000004" / "critic")  # the hook accepts the dir it was built from
    with pytest.raises(NemoConfigError, match="nemo.value block"):
        nemo_backend.build_critic({"backend": "nemo", "method": "ppo", "nemo": {}}, policy)
    # grpo.setup's own cluster, built for the policy and vLLM: the value model would wait for a GPU share for ever
    session.train_cluster = SimpleNamespace(name="grpo_policy_cluster", max_colocated_worker_groups=2)
    session.colocated_groups = 2
    with pytest.raises(NemoPlacementError, match="built for 2 colocated worker group.*holds 2"):
        nemo_backend.build_critic(recipe, policy)
    assert len(built) == 2  # refused before NeMo-RL was asked


def test_critic_lr_schedule_advances_one_iteration_per_step():
    """Megatron's value worker steps its LR scheduler by the ``gbs`` of each train call
    (megatron_value_worker.py:702-706) and counts warmup/decay in iterations x train_global_batch_size
    (megatron/setup.py:1013); the critic passed its padded row count, so the schedule moved by a different,
    smaller amount each step. Every step now trains exactly train_global_batch_size rows (one iteration), and
    a step with more rows than that is refused naming the recipe key."""
    _, _, _, critic, value, _ = make(dp=2, mbs=1)
    loss = functools.partial(clipped_value_loss, clip=10.0)
    for rows in (3, 6):
        critic.train(_ppo_batch(b=rows, t=10, seed=rows), loss)
    assert [c["input_ids"].shape[0] for c in value.train_calls] == [8, 8]  # CpuValue asserts gbs == rows
    with pytest.raises(BatchError, match="nemo.value.train_global_batch_size: this step has 9 training rows"):
        critic.train(_ppo_batch(b=9, t=10), loss)
