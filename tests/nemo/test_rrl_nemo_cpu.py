"""RRL's step on the nemo backend's pieces over CPU stand-ins of NeMo-RL (tests/nemo/cpu_nemo.py): the canonical
solution is scored by the value model (``NemoCritic.get_values``, nothing generated) and its argmax-V state is
the one the value model's own values pick; replayed rollouts reach vLLM as prompt + state token ids and
come back with the state as given (masked) tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "orchestration"))

from cpu_nemo import CpuMegatronPolicy, CpuValue, CpuVllm, make_refit, make_tokenizer, master_config  # noqa: E402
from tiny_task import chain_recipe  # noqa: E402

from rise_nemo.backends.nemo.critic import NemoCritic  # noqa: E402
from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoPolicy, NemoSession  # noqa: E402
from rise_nemo.config import config_from_dict  # noqa: E402
from rise_nemo.core.problem import ReasoningProblem  # noqa: E402
from rise_nemo.methods.registry import get_method  # noqa: E402
from rise_nemo.steps.reasoning import (  # noqa: E402
    ReasoningContext,
    make_hooks,  # noqa: E402
    reasoning_train_step,
)
from rise_nemo.steps.sft import SFTContext  # noqa: E402

torch.set_num_threads(1)
MAX_NEW = 5
REFERENCE = "alpha beta gamma delta sun moon"


class Wrong:
    def verify(self, problems, responses):
        return [False] * len(responses)


class RecordingVllm(CpuVllm):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.inputs: list[list[list[int]]] = []

    def generate(self, data, greedy=False):
        self.inputs.append([data["input_ids"][i, : int(n)].tolist() for i, n in enumerate(data["input_lengths"])])
        return super().generate(data, greedy)


def test_rrl_step_on_the_nemo_backend_pieces():
    events: list[str] = []
    tok = make_tokenizer()
    vllm = RecordingVllm(len(tok), MAX_NEW, tok.pad_token_id, tok.eos_token_id, events)
    session = NemoSession(CpuMegatronPolicy(len(tok), 2, events), vllm, tok, master_config(MAX_NEW, 2),
                          refit=make_refit(events), to_batched=dict)
    value = CpuValue(len(tok), 2, events, colocated_policy=session.policy)
    critic = NemoCritic(session, value, {"train_micro_batch_size": 2, "logprob_batch_size": 2,
                                         "make_sequence_length_divisible_by": 4, "train_global_batch_size": 8})
    cfg = config_from_dict(chain_recipe("rrl", group_size=2, max_new_tokens=MAX_NEW),
                           ["policy_loss.kl_coef=0", "sampling.temperature=1.0", "sampling.top_p=1.0", "rrl.granularity=token", "rrl.beta=1.0", "rrl.steps_per_epoch=1",
                            "rrl.stabilise.max_steps=0", "rrl.state_sources=[canonical]", "train.log_samples=4"])
    problems = [ReasoningProblem(f"q{i}", ({"role": "user", "content": f"describe the {topic}"},), REFERENCE, "x", 1)
                for i, topic in enumerate(("river", "sun"))]
    ctx = ReasoningContext(cfg=cfg, policy=NemoPolicy(session, False), generator=NemoGenerator(session), verifier=Wrong(),
                           method=get_method("rrl"), critic=critic, pad_id=tok.pad_token_id, samples_per_step=4,
                           hooks=make_hooks(get_method("rrl"), cfg, len(problems)))
    inference_calls = events.count("value.prepare_for_inference")
    w = value.model.weight.detach().squeeze(-1).clone()  # the value model at scoring time (before its update)
    m1 = reasoning_train_step(ctx, problems, 1)
    # two value-model passes: the batch's values (GAE) and ONE for both canonical solutions
    assert events.count("value.prepare_for_inference") - inference_calls == 2
    assert m1["rrl/canonical_scored"] == 2 and m1["rrl/states_added"] == 1 + 1
    # CpuValue: V(q; y_1..y_k) = w[y_k], the value after reading the state's last token: the canonical state is
    # the reference cut at argmax_k w[y_k] over 1 <= k < n
    ref_ids = tok.encode(REFERENCE, add_special_tokens=False)
    best = max(range(1, len(ref_ids)), key=lambda k: (float(w[ref_ids[k - 1]]), -k))
    state = tuple(ref_ids[:best])
    assert all(ctx.hooks.buffer.get(p.prompt_id)[0].tokens == state for p in problems)
    assert all(ctx.hooks.buffer.get(p.prompt_id)[0].source == "canonical" for p in problems)
    m2 = reasoning_train_step(ctx, problems, 2)  # p = 1: every rollout continues its problem's state
    assert m2["rrl/replay_fraction"] == 1.0 and m2["batch/given_tokens"] == 4 * len(state)
    prompt_ids = [ctx.generator.encode_prompt(list(p.messages)) for p in problems]
    assert vllm.inputs[-1] == [prompt_ids[i] + list(state) for i in (0, 0, 1, 1)]  # vLLM sees prompt + state
    assert all(r["given_tokens"] == len(state) for r in ctx.last_samples)
    assert m2["rrl/states_added"] == 0  # replayed rollouts push nothing, the canonical state is there already
    assert all(s.counter == 2 for p in problems for s in ctx.hooks.buffer.get(p.prompt_id))



def test_critic_warmup_on_the_nemo_backend_pieces():
    """``ppo.critic_warmup_steps=1``: step 1 trains only the value model (no ``policy.train``, so no optimiser or
    LR-scheduler step of the policy) and step 2 generates without a refit (vLLM's weights are still current);
    step 2 is an ordinary step whose policy update forces the refit before step 3."""
    events, session, ctx, problems = ppo_on_stand_ins("ppo.critic_warmup_steps=1")
    policy_w = session.policy.model.table.clone()
    m1 = reasoning_train_step(ctx, problems, 1)
    assert m1["critic/warmup"] == 1.0 and events.count("policy.train") == 0 and events.count("value.train") == 1
    assert torch.equal(session.policy.model.table, policy_w) and not session.stale
    refits = events.count("refit")
    m2 = reasoning_train_step(ctx, problems, 2)
    assert events.count("refit") == refits  # no policy update in step 1: vLLM still holds the current weights
    assert m2["critic/warmup"] == 0.0 and events.count("policy.train") == 1 and events.count("value.train") == 2
    reasoning_train_step(ctx, problems, 3)
    assert events.count("refit") == refits + 1


def test_policy_is_offloaded_before_the_critic_loads():
    """A PPO step trained the policy and then the critic with the policy's weights, grads
    and Adam state still resident; NeMo-RL's ppo.py has them off the GPUs whenever the value model is loaded
    (ppo.py:1166-1208, 1255-1287). CpuValue asserts the policy stand-in holds nothing at every
    prepare_for_inference/prepare_for_training; after the critic, the next step's refit reloads the weights
    it streams and the policy trains with everything back on the GPUs (both asserted by the stand-in)."""
    events, session, ctx, problems = ppo_on_stand_ins()
    for step in (1, 2):
        reasoning_train_step(ctx, problems, step)
    assert events.count("policy.train") == 2 and events.count("value.train") == 2 and events.count("refit") == 2
    train_at = [i for i, e in enumerate(events) if e == "value.prepare_for_training"]
    assert all(events[i - 1] == "policy.offload_after_refit" for i in train_at)


def ppo_on_stand_ins(*overrides: str):
    """A PPO ReasoningContext on the nemo backend's pieces over the stand-ins (policy, vLLM, value on one
    event list; the value stand-in checks the policy is offloaded whenever it loads)."""
    events: list[str] = []
    tok = make_tokenizer()
    session = NemoSession(CpuMegatronPolicy(len(tok), 2, events), CpuVllm(len(tok), MAX_NEW, tok.pad_token_id,
                                                                          tok.eos_token_id, events),
                          tok, master_config(MAX_NEW, 2), refit=make_refit(events), to_batched=dict)
    value = CpuValue(len(tok), 2, events, colocated_policy=session.policy)
    critic = NemoCritic(session, value, {"train_micro_batch_size": 2, "logprob_batch_size": 2,
                                         "make_sequence_length_divisible_by": 4, "train_global_batch_size": 8})
    cfg = config_from_dict(chain_recipe("ppo", group_size=2, max_new_tokens=MAX_NEW),
                           ["policy_loss.kl_coef=0", "sampling.temperature=1.0", "sampling.top_p=1.0", *overrides])
    problems = [ReasoningProblem(f"q{i}", ({"role": "user", "content": f"describe the {topic}"},), REFERENCE, "x", 1)
                for i, topic in enumerate(("river", "sun"))]
    ctx = ReasoningContext(cfg=cfg, policy=NemoPolicy(session, False), generator=NemoGenerator(session), verifier=Wrong(),
                           method=get_method("ppo"), critic=critic, pad_id=tok.pad_token_id)
    return events, session, ctx, problems


def test_sft_step_on_the_nemo_backend_pieces():
    """The SFT baseline's step on the nemo backend sent no prev_logprobs (NemoPolicy.train
    refused the batch), and padding rows carried global_tokens = 0, so a micro-batch of padding rows divided
    0 by 0 in sft_loss (NaN gradients). Three problems, DP 2 x micro-batch 1, padded to
    train_global_batch_size 32: 29 padding micro-batches; the step trains and every weight stays finite."""
    events: list[str] = []
    tok = make_tokenizer()
    policy = CpuMegatronPolicy(len(tok), 2, events)
    session = NemoSession(policy, CpuVllm(len(tok), MAX_NEW, tok.pad_token_id, tok.eos_token_id, events), tok,
                          master_config(MAX_NEW, 1), refit=make_refit(events), to_batched=dict)
    cfg = config_from_dict(chain_recipe("sft", group_size=2, max_new_tokens=MAX_NEW), ["policy_loss.kl_coef=0"])
    problems = [ReasoningProblem(f"q{i}", ({"role": "user", "content": f"describe the {topic}"},), REFERENCE, "x", 1)
                for i, topic in enumerate(("river", "sun", "moon"))]
    ctx = SFTContext(cfg=cfg, policy=NemoPolicy(session, False), generator=NemoGenerator(session), verifier=Wrong(),
                     method=get_method("sft"), pad_id=tok.pad_token_id)
    before = policy.model.table.detach().clone()
    metrics = ctx.method.training_step().train_step(ctx, problems, 1)  # the SFT step (no sampling)
    assert policy.train_calls[0]["input_ids"].shape[0] == 32 and events.count("policy.get_logprobs") == 0
    assert torch.isfinite(policy.model.table).all() and not torch.equal(policy.model.table, before)
    assert metrics["sft/nll"] > 0 and torch.isfinite(torch.tensor(metrics["sft/nll"]))
