"""The critic's explained variance in a real PPO step: undefined (None, null in metrics.jsonl,
left out of the progress bar and the sinks) on a step where every rollout earned the same reward, a number
otherwise."""

from __future__ import annotations

from pathlib import Path

from test_critic_warmup import Alternating
from test_rrl import _cfg

from rise_nemo.loop.run import build_trainer
from rise_nemo.loop.trainer import progress_postfix
from rise_nemo.steps.reasoning import REASONING_PROGRESS_KEYS, reasoning_train_step


class AllWrong:
    def verify(self, problems, responses):
        return [False] * len(responses)


def test_explained_variance_is_undefined_on_a_step_with_one_outcome(tmp_path: Path):
    trainer = build_trainer(_cfg(tmp_path / "run", 3, "ppo"))
    ctx = trainer.ctx
    ctx.verifier = Alternating()
    first = reasoning_train_step(ctx, trainer.sampler.next_batch(), 1)  # the critic learns non-constant values
    assert isinstance(first["critic/explained_variance"], float)
    ctx.verifier = AllWrong()
    m = reasoning_train_step(ctx, trainer.sampler.next_batch(), 2)
    assert m["reward/mean"] == 0.0 and m["critic/value_mean"] != 0.0  # lambda-returns vary with the values
    assert m["critic/explained_variance"] is None  # was an arbitrary negative number
    assert "ev" not in progress_postfix(m, REASONING_PROGRESS_KEYS)
    ctx.verifier = Alternating()
    m = reasoning_train_step(ctx, trainer.sampler.next_batch(), 3)
    assert isinstance(m["critic/explained_variance"], float)
    assert progress_postfix(m, REASONING_PROGRESS_KEYS)["ev"] == f"{m['critic/explained_variance']:.3f}"
