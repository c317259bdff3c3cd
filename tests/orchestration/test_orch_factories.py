"""Backend and judge factories, and the loop with the real HTTP judge over loopback."""

from __future__ import annotations

import pytest

from rise_nemo.backends import build_backend
from rise_nemo.config import config_from_dict
from rise_nemo.interfaces import Generator, Judge, Policy
from rise_nemo.judges import build_judge
from rise_nemo.loop.trainer import read_metrics


def test_build_judge_dispatches_and_rejects_bad_blocks():
    from rise_nemo.judges.rule import RuleJudge

    assert isinstance(build_judge({"type": "rule"}), RuleJudge)
    with pytest.raises(ValueError, match=r"judge.type.*'gpt'"):
        build_judge({"type": "gpt"})
    with pytest.raises(ValueError, match=r"type rule takes no other keys, got \['model'\]"):
        build_judge({"type": "rule", "model": "x"})
    judge = build_judge({"type": "http", "base_urls": ["http://127.0.0.1:9/v1"], "model": "m"})
    assert isinstance(judge, Judge)
    with pytest.raises(ValueError, match="judge.model is required"):
        build_judge({"type": "http", "base_urls": ["http://127.0.0.1:9/v1"]})


def test_build_backend_local_gives_policy_and_generator(tiny_tokenizer, tmp_path):
    import tiny_task

    cfg = config_from_dict(tiny_task.recipe(tiny_tokenizer, tmp_path))
    policy, generator = build_backend(cfg)
    assert isinstance(policy, Policy) and isinstance(generator, Generator)
    bad = config_from_dict(tiny_task.recipe(tiny_tokenizer, tmp_path), ["++local.lrr=1"])
    with pytest.raises(ValueError, match=r"local\.lrr"):
        build_backend(bad)


def test_loop_with_the_http_judge_on_loopback(tmp_path, make_trainer):
    """The same loop, judged by the OpenAI-compatible client against the rule-grader server (real sockets)."""
    from rise_nemo.judges.rule_server import RuleGraderServer

    server = RuleGraderServer().start()
    try:
        judge_cfg = {"type": "http", "base_urls": [server.url], "model": "rule-grader", "max_attempts": 2,
                     "timeout_s": 20.0}
        trainer = make_trainer(tmp_path, "rise", ["train.steps=2", "eval.every=0", "eval.at_start=false",
                                                  "eval.samples_per_prompt=2"], judge=judge_cfg)
        assert trainer.run() == 0
    finally:
        server.stop()
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["judge/unknown_excluded"] == 0 and metrics[0]["guidance/privileged_rollouts"] > 0
    assert (tmp_path / "eval" / "step_000002.json").is_file()


def test_opd_recipes_validate_but_point_train_to_the_distillation_entry():
    from rise_nemo.methods.registry import get_method

    config_from_dict({"method": "opd"})  # a valid method in the schema (the OPD recipes use it)
    with pytest.raises(ValueError, match=r"rise-nemo distill"):
        get_method("opd").training_step()
    with pytest.raises(ValueError, match="unknown method 'opdd'"):
        get_method("opdd")
