"""The training loop on a tiny model: every method, the guided branch, the switch, judging and batching."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rise_nemo.core.prompts import GUIDANCE_TEMPLATES
from rise_nemo.interfaces import KIND_GUIDED, KIND_NATURAL
from rise_nemo.loop.trainer import read_metrics

REQUIRED_KEYS = ("step", "reward/natural_mean", "reward/privileged_mean", "guidance/delta_r", "guidance/lambda",
                 "guidance/retained", "loss/pg", "loss/guide", "policy/entropy", "time/step_s")
TEMPLATE_HEADS = tuple(t.split("{hint}")[0].strip() for t in GUIDANCE_TEMPLATES)


def _hinted(messages) -> bool:
    last = messages[-1]["content"]
    return any(head and head in last for head in TEMPLATE_HEADS)


class Recorder:
    """Delegates to the real component and records what it was called with."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __getattr__(self, name):
        return getattr(self.inner, name)


class GenRecorder(Recorder):
    def generate(self, prompts, n, params):
        self.calls.append([list(p) for p in prompts])
        return self.inner.generate(prompts, n, params)


class PolicyRecorder(Recorder):
    def train(self, data, loss_fn):
        self.calls.append({k: v.clone() for k, v in data.items()})
        return self.inner.train(data, loss_fn)


class JudgeRecorder(Recorder):
    def judge(self, requests):
        self.calls.append(list(requests))
        return self.inner.judge(requests)


def record(policy, generator, judge):
    return PolicyRecorder(policy), GenRecorder(generator), JudgeRecorder(judge)


@pytest.mark.parametrize("method", ["rise", "rubric_rl", "coupled", "uniform", "ruscarl"])
def test_every_method_runs_and_writes_the_run_directory(tmp_path, make_trainer, method):
    trainer = make_trainer(tmp_path / method, method)
    assert trainer.run() == 0
    metrics = read_metrics(tmp_path / method)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        for key in REQUIRED_KEYS:
            assert key in m, key
        assert math.isfinite(m["reward/natural_mean"]) and math.isfinite(m["loss/pg"])
    assert (tmp_path / method / "config.yaml").read_text().count(f"method: {method}") == 1
    assert (tmp_path / method / "checkpoints" / "latest").read_text().strip() == "step_000004"
    evals = sorted(p.name for p in (tmp_path / method / "eval").glob("*.json"))
    assert evals == ["step_000000.json", "step_000002.json", "step_000004.json"]
    ev = json.loads((tmp_path / method / "eval" / "step_000004.json").read_text())
    assert ev["num_responses"] == 3 * 8 and 0.0 <= ev["persistent_coverage"] <= 1.0
    summary = json.loads((tmp_path / method / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["method"] == method


def test_guided_branch_trains_guided_rows_under_the_original_prompt(tmp_path, make_trainer):
    holder = {}

    def wrap(p, g, j):
        holder["p"], holder["g"], holder["j"] = record(p, g, j)
        return holder["p"], holder["g"], holder["j"]

    trainer = make_trainer(tmp_path, "rise", wrap=wrap)
    trainer.run()
    metrics = read_metrics(tmp_path)
    guided = [m for m in metrics if m["guidance/active"]]
    assert [m["step"] for m in guided] == [1, 2]  # switch_step 3: steps 1-2 guided
    assert sum(m["guidance/retained"] for m in guided) > 0
    for m in guided:
        assert m["batch/guided_rows"] == m["guidance/retained"]
        if m["guidance/retained"]:
            assert m["loss/guide"] != 0.0 and m["guidance/lambda"] == pytest.approx(0.2)
        assert m["guidance/privileged_rollouts"] > 0 and m["guidance/delta_r"] is not None

    # Guided rows are the privileged responses spliced onto the ORIGINAL prompt's tokens.
    policy, generator = holder["p"], holder["g"]
    originals = {tuple(generator.inner.encode_prompt(list(pr.messages))) for pr in trainer.sampler.prompts}
    batches_with_guided = [b for b in policy.calls if bool((b["kind"] == KIND_GUIDED).any())]
    assert batches_with_guided
    for batch in batches_with_guided:
        for row in torch.nonzero(batch["kind"] == KIND_GUIDED).flatten().tolist():
            start = int(torch.nonzero(batch["token_mask"][row]).min())
            assert tuple(batch["input_ids"][row, :start].tolist()) in originals
        assert float(batch["guided_seq_count"][0]) == float((batch["kind"] == KIND_GUIDED).sum())
        natural_tokens = batch["token_mask"][batch["kind"] == KIND_NATURAL].sum()
        assert float(batch["natural_token_count"][0]) == float(natural_tokens)


def test_no_privileged_generation_after_the_switch_and_judge_never_sees_hints(tmp_path, make_trainer):
    holder = {}

    def wrap(p, g, j):
        holder["p"], holder["g"], holder["j"] = record(p, g, j)
        return holder["p"], holder["g"], holder["j"]

    make_trainer(tmp_path, "rise", overrides=["train.steps=5", "eval.every=0", "eval.at_start=false"],
                 wrap=wrap).run()
    gen_calls = holder["g"].calls
    # steps 1-2: natural + privileged; steps 3-5: natural only; then the final eval.
    hinted = [any(_hinted(m) for m in call) for call in gen_calls]
    assert hinted == [False, True, False, True, False, False, False, False]
    for requests in holder["j"].calls:
        assert not any(_hinted(r.conversation) for r in requests)
    metrics = read_metrics(tmp_path)
    assert [m["guidance/privileged_rollouts"] > 0 for m in metrics] == [True, True, False, False, False]
    assert all(m["guidance/lambda"] == 0.0 and m["batch/guided_rows"] == 0 for m in metrics[2:])


def test_rubric_rl_generates_no_privileged_rollouts(tmp_path, make_trainer):
    holder = {}

    def wrap(p, g, j):
        holder["g"] = GenRecorder(g)
        return p, holder["g"], j

    make_trainer(tmp_path, "rubric_rl", overrides=["eval.every=0", "eval.at_start=false"], wrap=wrap).run()
    assert not any(_hinted(m) for call in holder["g"].calls for m in call)
    assert all(m["reward/privileged_mean"] is None for m in read_metrics(tmp_path))


def test_coupled_puts_privileged_rows_into_the_natural_group(tmp_path, make_trainer):
    holder = {}

    def wrap(p, g, j):
        holder["p"] = PolicyRecorder(p)
        return holder["p"], g, j

    make_trainer(tmp_path, "coupled", overrides=["train.steps=2", "eval.every=0", "eval.at_start=false"],
                 wrap=wrap).run()
    metrics = read_metrics(tmp_path)
    for m, batch in zip(metrics, holder["p"].calls):
        assert not bool((batch["kind"] == KIND_GUIDED).any())
        assert m["batch/natural_rows"] == 2 * 4 + m["guidance/privileged_rollouts"]
        assert m["loss/guide"] == 0.0


def test_ruscarl_samples_under_scaffolds_and_trains_under_the_original_prompt(tmp_path, make_trainer):
    holder = {}

    def wrap(p, g, j):
        holder["p"], holder["g"] = PolicyRecorder(p), GenRecorder(g)
        return holder["p"], holder["g"], j

    make_trainer(tmp_path, "ruscarl", overrides=["train.steps=1", "eval.every=0", "eval.at_start=false"],
                 wrap=wrap).run()
    first = holder["g"].calls[0]  # step 1: progress 0 -> sample 0 of each group sees every criterion
    assert len(first) == 2 * 4 and first[0][0]["role"] == "system" and "Mentions alpha" in first[0][0]["content"]
    assert first[3][0]["role"] == "user"  # last sample of the group: no scaffold (lambda_i = 0)
    generator = holder["g"].inner
    batch = holder["p"].calls[0]
    for row in range(batch["input_ids"].shape[0]):
        start = int(torch.nonzero(batch["token_mask"][row]).min())
        ids = batch["input_ids"][row, :start].tolist()
        assert ids in [generator.encode_prompt([{"role": "user", "content": f"describe the {t}"}])
                       for t in ("river", "forest", "desert", "harbor", "valley", "meadow")]


class FlakyJudge(Recorder):
    """The real rule judge, except every 5th response gets an unknown verdict (a judge failure)."""

    def judge(self, requests):
        out = self.inner.judge(requests)
        return [[None] * len(v) if i % 5 == 0 else v for i, v in enumerate(out)]


def test_unknown_verdicts_exclude_responses_and_are_counted(tmp_path, make_trainer):
    trainer = make_trainer(tmp_path, "rise", overrides=["train.steps=2", "eval.every=0", "eval.at_start=false"],
                           wrap=lambda p, g, j: (p, g, FlakyJudge(j)))
    trainer.run()
    metrics = read_metrics(tmp_path)
    for m in metrics:
        assert m["judge/unknown_excluded"] > 0
    assert metrics[0]["batch/natural_rows"] == 8 - 2  # 2 of the 8 natural responses unknown
    ev = json.loads((tmp_path / "eval" / "step_000002.json").read_text())
    assert ev["unknown_excluded"] == 5  # 24 eval responses, every 5th unknown


def test_optional_tensorboard_logging_never_breaks_a_run(tmp_path, make_trainer):
    import importlib.util

    trainer = make_trainer(tmp_path, "rubric_rl", overrides=["train.steps=1", "train.tensorboard=true",
                                                             "eval.every=0", "eval.at_start=false"])
    assert trainer.run() == 0
    log = (tmp_path / "train.log").read_text()
    if importlib.util.find_spec("tensorboard") is None:
        assert "train.tensorboard is enabled but tensorboard is not installed" in log
    else:
        assert any((tmp_path / "tensorboard").iterdir())
