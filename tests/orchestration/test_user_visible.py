"""What a user reads from a run: no evaluation of nulls, a real reward of 0
logged as 0, judge counters in metrics.jsonl."""

from __future__ import annotations

import json

import pytest

from rise_nemo.steps.rubric_eval import EvaluationError


class _Verdicts:
    """Delegates to the real judge, then replaces every verdict (None = unknown, False = not met)."""

    def __init__(self, inner, value):
        self.inner, self.value = inner, value

    def judge(self, requests):
        return [[self.value] * len(row) for row in self.inner.judge(requests)]

    @property
    def stats(self):
        return self.inner.stats


def test_an_evaluation_of_nulls_is_never_written(tmp_path, make_trainer):
    trainer = make_trainer(tmp_path / "run", wrap=lambda p, g, j: (p, g, _Verdicts(j, None)))
    with pytest.raises(EvaluationError, match="no complete verdict for any of 24 responses"):
        trainer.run()
    assert not list((tmp_path / "run").glob("eval/*.json"))


def test_a_real_reward_of_zero_is_logged_as_zero_and_counters_reach_metrics(tmp_path, make_trainer):
    trainer = make_trainer(tmp_path / "run", "rubric_rl", overrides=["train.steps=1", "eval.every=0"],
                           wrap=lambda p, g, j: (p, g, _Verdicts(j, False)))
    assert trainer.run() == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "eval step 0: reward 0.000," in log and "nan" not in log
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["reward/natural_mean"] == 0.0
    assert metrics["judge/calls"] > 0 and "judge/cache_hits" in metrics
