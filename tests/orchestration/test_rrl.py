"""RRL end to end on the embedded task (rise_nemo.steps.rrl; docs/DESIGN.md §9): replayed rollouts continue
buffered states whose tokens get exactly zero policy gradient, GAE starts at the state, a correct completion
removes its state, the state sources give the CS / PGS ablations, resume is exact with a non-empty buffer,
and before stabilisation RRL is PPO exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_task import chain_recipe

from rise_nemo.config import config_from_dict
from rise_nemo.config.loader import ConfigError
from rise_nemo.core.logprobs import token_logprobs
from rise_nemo.data.chain_task import step_prefixes
from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.run import build_trainer
from rise_nemo.loop.trainer import read_metrics
from rise_nemo.steps.reasoning import reasoning_train_step
from rise_nemo.steps.rollouts import recipe_policy_loss_fn

# Two training problems (one per level), two per step: every step revisits both, so states replay from step 2.
# 20 warm-start steps: the policy then writes the task's step marker in most rollouts, so policy-sourced states
# exist whatever the sampler draws (with 3, some seeds' rollouts held no marker: 1 seed of 8 at 10 steps, 0 at 20).
DATA = {"source": "chain_arithmetic", "warm_start_cache": None,
        "task": {"max_steps": 3, "train_per_level": 1, "heldout_per_level": 1, "train_levels": [2, 3]},
        "warm_start": {"steps": 20, "batch_size": 4}}


def _cfg(run_dir: Path, steps: int = 3, method: str = "rrl", *overrides: str, **rrl):
    block = {"beta": 1.0, "steps_per_epoch": 1, "stabilise": {"max_steps": 0}, **rrl}
    return config_from_dict(chain_recipe(method, run_dir, steps=steps, data=DATA, rrl=block), list(overrides))


def _reproducible(metrics):
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


class RecordingPolicy:
    """Delegates to the real policy and keeps every training batch."""

    def __init__(self, policy):
        self.inner, self.batches = policy, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def train(self, batch, loss_fn):
        self.batches.append({k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
        return self.inner.train(batch, loss_fn)


def test_resume_with_a_non_empty_buffer_is_exact(tmp_path):
    full, parts = tmp_path / "full", tmp_path / "parts"
    trainer = build_trainer(_cfg(full, steps=4))
    assert trainer.run() == 0
    first = build_trainer(_cfg(parts, steps=4), stop_after=2)
    assert first.run() == 0
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(parts), first.policy, critic=first.critic)
    assert state["step"] == 2 and len(state["hooks"]["buffer"]["states"]) > 0  # the buffer is in the checkpoint
    resumed = build_trainer(_cfg(parts, steps=4))
    assert resumed.run() == 0
    a, b = read_metrics(full), read_metrics(parts)
    assert _reproducible(a) == _reproducible(b)
    assert resumed.ctx.hooks.state_dict() == trainer.ctx.hooks.state_dict()
    for x, y in zip(trainer.policy.model.state_dict().values(), resumed.policy.model.state_dict().values()):
        assert torch.equal(x, y)
    # replay happened after the checkpoint (p = 1 from step 1; states exist from step 1 on)
    assert a[0]["rrl/states_added"] > 0 and a[0]["rrl/replay_fraction"] == 0
    assert any(m["rrl/replay_fraction"] > 0 and m["batch/given_tokens"] > 0 for m in a[2:])
    for key in ("rrl/buffer_size", "rrl/states_removed", "rrl/states_evicted", "rrl/solve_rate_scratch",
                "rrl/stabilised", "critic/value_loss", "critic/explained_variance", "policy/entropy",
                "diversity/ppl_variance"):
        assert key in a[-1], key
    rise_only = sorted({k for m in a for k in m if k == "loss/guide" or k.startswith("guide/")})
    assert rise_only == [], rise_only  # no RISE-only keys in RRL's metrics


def test_replayed_state_tokens_get_zero_gradient_and_gae_starts_at_the_state(tmp_path):
    trainer = build_trainer(_cfg(tmp_path / "run", 2, "rrl", "ppo.normalize_advantages=false", "ppo.gae_lambda=1.0",
                                 "policy_loss.kl_coef=0"))
    trainer.policy = trainer.ctx.policy = RecordingPolicy(trainer.policy)
    problems = trainer.sampler.next_batch()
    reasoning_train_step(trainer.ctx, problems, 1)
    reasoning_train_step(trainer.ctx, problems, 2)
    batch = trainer.policy.batches[-1]
    hooks = trainer.ctx.hooks
    assert hooks._replayed, "step 2 should replay states buffered at step 1"
    given = batch["input_lengths"] * 0
    rows = [(i, j) for i in range(len(problems)) for j in range(4)]  # every rollout is valid (0/1 verifier)
    for row, (i, j) in enumerate(rows):
        given[row] = len(hooks._replayed.get((i, j), ()))
    replayed = [r for r in range(len(rows)) if given[r] > 0]
    assert replayed
    loss_fn = recipe_policy_loss_fn(trainer.cfg)
    logits = trainer.policy.inner.engine.forward(batch["input_ids"])
    lp = token_logprobs(logits, batch["input_ids"], 256)
    lp.retain_grad()
    # advantages 1 on EVERY position (state tokens included): only the token mask can zero their gradient
    loss, _ = loss_fn(lp, {**batch, "token_advantages": torch.ones_like(batch["token_advantages"])})
    loss.backward()
    for r in replayed:
        first = int(batch["token_mask"][r].nonzero()[0])  # first sampled token
        start = first - int(given[r])  # where the response (the state) starts
        assert torch.all(batch["token_mask"][r, start:first] == 0)
        assert torch.all(lp.grad[r, :first] == 0)  # state (and prompt) tokens: exactly zero gradient
        assert torch.all(lp.grad[r, first:int(batch["input_lengths"][r])] != 0)  # sampled tokens: trained
        assert torch.all(batch["token_advantages"][r, :first] == 0)
        # GAE (gamma = lambda = 1, sparse terminal reward) starts at the state, bootstrapped from V there:
        # A(first sampled token) = r - V(prompt + state), r the 0/1 reward on the last sampled token
        last = int(batch["token_mask"][r].nonzero()[-1])
        reward = float(batch["returns"][r, last])
        assert reward == pytest.approx(0.0, abs=1e-6) or reward == pytest.approx(1.0)
        v_state = float(batch["values"][r, first])
        assert float(batch["token_advantages"][r, first]) == pytest.approx(reward - v_state, abs=1e-5)


class AlwaysRight:
    def verify(self, problems, responses):
        return [True] * len(responses)


class AlwaysWrong:
    def verify(self, problems, responses):
        return [False] * len(responses)


@pytest.mark.parametrize("verifier,removed", [(AlwaysRight(), True), (AlwaysWrong(), False)])
def test_a_correct_replayed_completion_removes_its_state(tmp_path, verifier, removed):
    # the paper's buffer (no drop rule): a wrong completion only counts; the drop rule: test_rrl_premise.py
    trainer = build_trainer(_cfg(tmp_path / "run", 1, "rrl", state_sources=["canonical"], max_failed_replays=None))
    ctx = trainer.ctx
    ctx.verifier = verifier
    hooks = ctx.hooks
    problems = trainer.sampler.next_batch()
    states = {}
    for p in problems:  # the first step of the clean reference, as the canonical source would push it
        text = step_prefixes(p)[1]
        states[p.prompt_id] = tuple(trainer.generator.encode_response(text)[:-1])
        hooks.buffer.add(p.prompt_id, states[p.prompt_id], "canonical")
    metrics = reasoning_train_step(ctx, problems, 1)  # p = 1: every rollout replays its problem's one state
    assert metrics["rrl/replay_fraction"] == 1.0 and metrics["rrl/solve_rate_scratch"] is None
    assert metrics["rrl/solve_rate_replayed"] == (1.0 if removed else 0.0)
    for p in problems:
        left = [s.tokens for s in hooks.buffer.get(p.prompt_id)]
        if removed:
            assert states[p.prompt_id] not in left
        else:  # a wrong completion keeps it, counted once per replay (4 rollouts), and pushes nothing new
            assert left == [states[p.prompt_id]] and hooks.buffer.get(p.prompt_id)[0].counter == 4
    assert metrics["rrl/states_removed"] == (len(problems) if removed else 0)


@pytest.mark.parametrize("sources", [["canonical"], ["policy"]])
def test_state_sources_select_the_ablation(tmp_path, sources):
    trainer = build_trainer(_cfg(tmp_path / "run", 2, "rrl", state_sources=sources))
    ctx = trainer.ctx
    ctx.verifier = AlwaysWrong()  # every rollout wrong: the canonical source pushes for every problem
    problems = trainer.sampler.next_batch()
    m = reasoning_train_step(ctx, problems, 1)
    got = {s.source for p in problems for s in ctx.hooks.buffer.get(p.prompt_id)}
    assert got == set(sources)
    assert m["rrl/canonical_scored"] == (len(problems) if sources == ["canonical"] else 0)
    if sources == ["canonical"]:  # the reference's best inner step boundary: a prefix of whole steps
        for p in problems:
            (state,) = ctx.hooks.buffer.get(p.prompt_id)
            text = trainer.generator.decode_response(list(state.tokens))
            assert text in step_prefixes(p)[1:]


def test_before_stabilisation_rrl_is_ppo_exactly(tmp_path):
    ppo = build_trainer(_cfg(tmp_path / "ppo", 3, "ppo"))
    rrl = build_trainer(_cfg(tmp_path / "rrl", 3, "rrl", stabilise={"max_steps": 100, "tolerance": 0.0}))
    assert ppo.run() == 0 and rrl.run() == 0
    a, b = read_metrics(tmp_path / "ppo"), read_metrics(tmp_path / "rrl")
    assert all(not m["rrl/stabilised"] and m["rrl/buffer_size"] == 0 for m in b)
    strip = [{k: v for k, v in m.items() if not k.startswith(("time/", "rrl/"))} for m in b]
    assert _reproducible(a) == strip
    for x, y in zip(ppo.policy.model.state_dict().values(), rrl.policy.model.state_dict().values()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("override,key", [
    ("rrl.beta=1.5", "rrl.beta"),
    ("rrl.state_sources=[judge]", "rrl.state_sources.*judge"),
    ("rrl.state_sources=[]", "rrl.state_sources"),
    ("rrl.granularity=paragraph", "rrl.granularity"),
    ("rrl.capacity=0", "rrl.capacity"),
    ("rrl.stabilise.window=0", "rrl.stabilise.window"),
    ("rrl.stabilise.tolerance=-1", "rrl.stabilise.tolerance"),
    ("rrl.stabilise.windows=3", "rrl.stabilise.windows"),
    ("rrl.steps_per_epoch=0", "rrl.steps_per_epoch"),
])
def test_config_errors_name_the_key(override, key):
    with pytest.raises(ConfigError, match=f"key .{key}"):
        config_from_dict(chain_recipe("rrl"), [override])


def test_default_granularity_cuts_real_solutions_and_one_that_cuts_nothing_is_refused(tmp_path, caplog):
    """The default cut a literal "step" marker, which real solutions (GSM8K) never write, so
    no state was ever stored. The default is now line breaks; a granularity that cuts none of the training
    references is refused in one line naming the key, also through build_trainer."""
    import dataclasses

    from rise_nemo.core.replay import state_boundaries
    from rise_nemo.data.chain_task import make_chain_task
    from rise_nemo.data.reasoning import load_reasoning_problems
    from rise_nemo.errors import UserError
    from rise_nemo.steps.rrl import check_granularity

    gsm8k = load_reasoning_problems(Path(__file__).parents[1] / "data" / "fixtures" / "gsm8k_test_first8.jsonl").problems
    default = config_from_dict({"method": "rrl"})
    assert default.rrl.granularity == "line"
    check_granularity(default, gsm8k)
    for p in gsm8k:  # every reference has cut points (here one token per character)
        assert state_boundaries(list(p.reference_solution), default.rrl.granularity, default.rrl.step_marker)
    with pytest.raises(UserError, match=r"'rrl\.granularity': 'step' cuts states at the marker 'step'.* none of "
                                        r"the 8 training reference solutions"):
        check_granularity(config_from_dict({"method": "rrl", "rrl": {"granularity": "step"}}), gsm8k)
    assert "only" not in caplog.text
    one_line = [gsm8k[0]] + [dataclasses.replace(p, reference_solution=p.reference_solution.replace("\n", " "))
                             for p in gsm8k[1:]]
    check_granularity(default, one_line)  # one reference with line breaks: allowed, with a warning
    assert "only 1 of 8 training reference solutions have a line break" in caplog.text
    chain = make_chain_task(**DATA["task"]).train
    check_granularity(config_from_dict(chain_recipe("rrl")), chain)  # the embedded task: its step marker
    with pytest.raises(UserError, match=r"'rrl\.granularity': 'line' cuts states at a line break"):
        check_granularity(default, chain)
    with pytest.raises(UserError, match=r"rrl\.granularity"):
        build_trainer(_cfg(tmp_path / "run", 1, "rrl", "rrl.granularity=line"))
    assert not (tmp_path / "run").exists()
