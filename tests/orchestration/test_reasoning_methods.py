"""Reasoning methods by configuration (ppo, grpo) on the embedded task: the step runs end to end through
build_trainer, PPO trains its critic on GAE targets, and resume is exact (critic + its optimiser included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_task import chain_recipe

from rise_nemo.config import config_from_dict
from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.run import build_trainer
from rise_nemo.loop.trainer import read_metrics


def _cfg(run_dir: Path, method: str, steps: int = 3):
    return config_from_dict(chain_recipe(method, run_dir, steps=steps))


def _reproducible(metrics):
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


def _evals(run_dir: Path):
    return {p.name: json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("*.json"))}


@pytest.mark.parametrize("method", ["ppo", "grpo"])
def test_resumed_reasoning_run_reproduces_the_uninterrupted_run_exactly(tmp_path, method):
    full, parts = tmp_path / "full", tmp_path / "parts"
    trainer = build_trainer(_cfg(full, method))
    assert trainer.run() == 0
    first = build_trainer(_cfg(parts, method), stop_after=1)
    assert first.run() == 0 and first.stopped_by == "stop_after=1"
    assert ckpt.latest_checkpoint(parts).name == "step_000001"
    assert ((parts / "checkpoints" / "step_000001" / "critic" / "state.pt").is_file()) == (method == "ppo")
    resumed = build_trainer(_cfg(parts, method))  # fresh model, critic, optimisers, RNGs: all from the checkpoint
    assert resumed.run() == 0
    a, b = read_metrics(full), read_metrics(parts)
    assert [m["step"] for m in b] == [1, 2, 3]
    assert _reproducible(a) == _reproducible(b)
    assert _evals(full) == _evals(parts)
    for x, y in zip(trainer.policy.model.state_dict().values(), resumed.policy.model.state_dict().values()):
        assert torch.equal(x, y)
    if method == "ppo":
        sa, sb = trainer.critic.state_dict(), resumed.critic.state_dict()
        assert all(torch.equal(sa["body"][k], sb["body"][k]) for k in sa["body"])
        assert torch.equal(sa["head"]["weight"], sb["head"]["weight"])
        assert a[0]["critic/value_loss"] is not None and "critic/explained_variance" in a[0]
        assert a[0]["loss/kl"] is not None  # PPO's paper default KL 0.001 with the local reference policy
    else:
        assert "critic/value_loss" not in a[0]
    rise_only = sorted({k for m in a for k in m if k == "loss/guide" or k.startswith("guide/")})
    assert rise_only == [], rise_only  # no RISE-only keys in PPO / GRPO metrics
    ev = _evals(full)["step_000002.json"]
    assert ev["kind"] == "reasoning" and set(ev["levels"]) == {"1", "2", "3"}
    assert set(ev["levels"]["1"]["pass_at_k"]) == {"1", "2"}
    # samples.jsonl like the rubric step's: every rollout of the 2 x 4 groups, identical after a resume
    samples = _samples(full)
    assert samples == _samples(parts) and [s["step"] for s in samples] == [1] * 8 + [2] * 8 + [3] * 8
    by_metrics = {m["step"]: m["reward/mean"] for m in a}
    for step in (1, 2, 3):
        rows = [s for s in samples if s["step"] == step]
        assert set(rows[0]) == SAMPLE_KEYS
        rewards = [s["reward"] for s in rows if s["reward"] is not None]
        assert sum(rewards) / len(rewards) == pytest.approx(by_metrics[step])  # the step's own rewards
        assert all(s["given_tokens"] == 0 and s["sampled_tokens"] >= 1 for s in rows)
        if method == "grpo":  # group advantages: zero-sum within each problem's group
            for pid in {s["prompt_id"] for s in rows}:
                assert sum(s["advantage"] for s in rows if s["prompt_id"] == pid) == pytest.approx(0, abs=1e-5)


SAMPLE_KEYS = {"step", "prompt_id", "difficulty", "response", "given_tokens", "sampled_tokens", "reward",
               "advantage", "kind"}


def _samples(run_dir: Path):
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def test_samples_record_the_given_and_sampled_split_of_replayed_prefixes(tmp_path):
    """A start-state hook (RRL's seam) gives rollouts a response prefix (here every other rollout): samples.jsonl
    says how many tokens were given and how many sampled, and the response starts with the given text."""
    from rise_nemo.steps.reasoning import StepHooks, reasoning_train_step

    trainer = build_trainer(_cfg(tmp_path / "run", "grpo", steps=1))
    ctx, gen = trainer.ctx, trainer.generator
    problems = trainer.sampler.next_batch()
    given = [[gen.encode_response("step a")[:-1] if j % 2 == 0 else [] for j in range(4)] for _ in problems]

    class Given(StepHooks):
        def start_states(self, ctx, probs, step):
            return given

    ctx.hooks = Given()
    reasoning_train_step(ctx, problems, 1)
    assert len(ctx.last_samples) == 8
    for n, record in enumerate(ctx.last_samples):
        i, j = divmod(n, 4)
        assert record["prompt_id"] == problems[i].prompt_id and record["difficulty"] == problems[i].difficulty
        assert record["given_tokens"] == len(given[i][j])
        assert record["response"].startswith("step a") or j % 2 == 1
        assert record["sampled_tokens"] >= 1 and record["kind"] in (0, None)
    ctx.samples_per_step = 3
    reasoning_train_step(ctx, problems, 2)
    assert [r["step"] for r in ctx.last_samples] == [2, 2, 2]


def test_ppo_needs_a_critic_and_a_verifier():
    from rise_nemo.methods.registry import RunParts, get_method
    from rise_nemo.steps.reasoning import ReasoningContext

    with pytest.raises(ValueError, match="needs a critic"):
        ReasoningContext(cfg=None, policy=None, generator=None, verifier=None, method=get_method("ppo"))
    with pytest.raises(ValueError, match="needs a verifier"):
        get_method("ppo").training_step().build_context(get_method("ppo"), RunParts(None, None, None, None))


def test_eval_command_and_report_on_a_reasoning_run(tmp_path, capsys):
    import argparse

    import yaml

    from rise_nemo.commands.evaluate import run as eval_run
    from rise_nemo.reports.report import make_report

    run_dir = tmp_path / "run"
    assert build_trainer(_cfg(run_dir, "grpo", steps=2)).run() == 0
    args = argparse.Namespace(items=[str(run_dir), "eval.samples_per_prompt=4"], config=None, checkpoint=None,
                              out=str(tmp_path / "ev.json"))
    assert eval_run(args) == 0
    out = capsys.readouterr().out
    assert "pass@4" in out and "step acc" in out
    result = json.loads((tmp_path / "ev.json").read_text())
    assert result["step"] == 2 and set(result["levels"]["3"]["pass_at_k"]) == {"1", "2", "4"}
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["method"] == "grpo"
    report = make_report([run_dir])
    text = report.read_text()
    assert "pass@1" in text and (report.parent / "pass_at_k.png").is_file()
    assert (report.parent / "pass_vs_step.png").is_file()


@pytest.mark.parametrize("method", ["sft", "grpo", "ppo"])
def test_the_progress_bar_shows_only_what_the_method_logs(tmp_path, method):
    """The SFT bar showed r=-, ev=-, pg=- (GRPO's ev=- too): every column is a logged value."""
    trainer = build_trainer(_cfg(tmp_path / method, method, steps=1))
    assert trainer.run() == 0
    last = read_metrics(tmp_path / method)[-1]
    shown = {short: last.get(key) for key, short in trainer._progress_keys}
    # (PPO's explained variance is undefined, '-', on a step whose returns are all equal)
    assert shown and all(v is not None for k, v in shown.items() if k != "ev"), shown
    assert ("nll" in shown) == (method == "sft") and ("ev" in shown) == (method == "ppo"), shown
