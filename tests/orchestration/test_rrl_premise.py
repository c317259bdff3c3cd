"""RRL's additions beyond Algorithm 1 (docs/DESIGN.md §9.5) end to end on the embedded task: a buffered state whose replays keep failing is
dropped (rrl.max_failed_replays), candidate states scored by the reference judge's prefix score
(rrl.state_scorer), the critic's prefix AUC (critic/auc) and critic pre-training on warm-start rollouts
(ppo.critic_pretrain_*)."""

from __future__ import annotations

import json

import pytest
import torch
from test_critic_warmup import Alternating
from test_rrl import AlwaysWrong, _cfg

from rise_nemo.data.chain_task import step_prefixes
from rise_nemo.interfaces import Rollout
from rise_nemo.loop.run import build_trainer
from rise_nemo.loop.trainer import read_metrics
from rise_nemo.steps.reasoning import prefix_value_auc, reasoning_train_step
from rise_nemo.steps.rollouts import TrainSample, build_batch


@pytest.mark.parametrize("limit,dropped", [(2, True), (None, False)])
def test_a_state_whose_replays_keep_failing_is_dropped(tmp_path, limit, dropped):
    trainer = build_trainer(_cfg(tmp_path / "run", 1, "rrl", state_sources=["canonical"], max_failed_replays=limit))
    ctx, hooks = trainer.ctx, trainer.ctx.hooks
    ctx.verifier = AlwaysWrong()
    problems = trainer.sampler.next_batch()
    for p in problems:
        hooks.buffer.add(p.prompt_id, tuple(trainer.generator.encode_response(step_prefixes(p)[1])[:-1]), "canonical")
    m = reasoning_train_step(ctx, problems, 1)  # p = 1: each of the 4 rollouts per problem replays its state
    assert m["rrl/replay_fraction"] == 1.0 and m["rrl/solve_rate_replayed"] == 0.0
    assert m["rrl/states_dropped"] == (len(problems) if dropped else 0)
    assert m["rrl/states_removed"] == 0
    assert all((hooks.buffer.get(p.prompt_id) == []) == dropped for p in problems)


def test_reference_scorer_buffers_the_judges_best_prefix(tmp_path):
    # a zero-initialised critic head gives V = 0 everywhere: argmax V is the FIRST cut point; the reference
    # judge's prefix score grows with the correct steps written: its argmax is the LAST cut point here (L = 3)
    states = {}
    for scorer in ("value", "reference"):
        trainer = build_trainer(_cfg(tmp_path / scorer, 1, "rrl", state_sources=["canonical"], state_scorer=scorer))
        ctx = trainer.ctx
        ctx.verifier = AlwaysWrong()
        problems = [p for p in trainer.sampler.next_batch() if p.difficulty == 3]
        m = reasoning_train_step(ctx, problems, 1)
        (state,) = ctx.hooks.buffer.get(problems[0].prompt_id)
        states[scorer] = (trainer.generator.decode_response(list(state.tokens)), step_prefixes(problems[0]))
        assert (m.get("rrl/judge_calls", 0) > 0) == (scorer == "reference")
    text, prefixes = states["value"]
    assert text == prefixes[1]
    text, prefixes = states["reference"]
    assert text == prefixes[2]


def test_prefix_auc_ranks_correct_so_far_against_wrong_prefixes(tmp_path):
    trainer = build_trainer(_cfg(tmp_path / "run", 1, "ppo"))
    ctx, gen = trainer.ctx, trainer.generator
    problem = next(p for p in trainer.sampler.next_batch() if p.difficulty == 3)
    good = problem.reference_solution
    first = good.split(" = ")[1].split()[0]
    bad = good.replace(f" = {first} ", f" = {(int(first) + 1) % 61} ", 1)  # step a wrong: every prefix is wrong
    rollouts = []
    for text in (good, bad):
        ids = gen.encode_response(text)
        rollouts.append(Rollout([], [7, 8], list(ids), text, [0.0] * len(ids)))
    batch = build_batch([TrainSample(r.prompt_token_ids, r.response_token_ids, 0, 0.0, [], True) for r in rollouts])
    valid = torch.ones(1, 2, dtype=torch.bool)
    high = torch.zeros_like(batch["token_mask"])
    high[0] = 1.0  # the correct rollout's prefixes score high
    assert prefix_value_auc(ctx, [problem], [rollouts], valid, batch, high) == 1.0
    assert prefix_value_auc(ctx, [problem], [rollouts], valid, batch, -high) == 0.0
    ctx.step_accuracy = None
    assert prefix_value_auc(ctx, [problem], [rollouts], valid, batch, high) is None


def test_critic_pretraining_on_warm_start_rollouts_runs_once_on_a_fresh_run(tmp_path):
    run = tmp_path / "run"
    trainer = build_trainer(_cfg(run, 1, "ppo", "ppo.critic_pretrain_updates=3", "ppo.critic_pretrain_batch=4",
                                 "ppo.critic_pretrain_rollouts=2", "ppo.critic_pretrain_lr=1e-2"))
    trainer.ctx.verifier = Alternating()  # both returns present: the critic gets a gradient
    before = [p.detach().clone() for p in trainer.critic.parameters()]
    lr = [g["lr"] for g in trainer.critic.optimizer.param_groups]
    trainer._pretrain_critic()
    out = json.loads((run / "critic_pretrain.json").read_text())
    assert out["critic_pretrain/rollouts"] > 0 and out["critic_pretrain/value_loss_first"] is not None
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.critic.parameters()))  # the critic learned
    assert [g["lr"] for g in trainer.critic.optimizer.param_groups] == lr  # critic_lr restored for RL
    assert trainer.run() == 0
    assert "critic/auc" in read_metrics(run)[0]  # logged every step where the task knows the truth
