"""Sandbox + RRL together on the local backend: a recipe with ``data.format: apps`` trains a
tiny model for two RRL steps on one-line programming problems, every rollout graded by the sandboxed
unit-test reward (the tiny model need not be good at it: its programs are mostly syntax errors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rise_nemo.config import config_from_dict
from rise_nemo.data.reasoning import load_reasoning_problems
from rise_nemo.judges.code_verifier import OUTCOMES, CodeVerifier
from rise_nemo.loop.run import build_trainer
from rise_nemo.loop.trainer import read_metrics

TASK = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "code_tiny.jsonl"


def _tokenizer(path: Path):
    from rise_nemo.backends.local.tokenizer import build_word_tokenizer

    problems = load_reasoning_problems(TASK, "apps").problems
    corpus = [m["content"] for p in problems for m in p.messages] + [p.reference_solution for p in problems]
    tok = build_word_tokenizer(corpus)
    tok.save_pretrained(str(path))
    return tok, problems


def test_rrl_on_the_sandboxed_code_reward(tmp_path, sandbox):
    tok, problems = _tokenizer(tmp_path / "tok")
    # The task is solvable in the model's token space: a reference solution, encoded and decoded by the
    # word-level tokenizer ("``` python print ( int ( input ()) + 1 ) ```"), still passes in the sandbox.
    decoded = [tok.decode(tok.encode(p.reference_solution, add_special_tokens=False)) for p in problems]
    check = CodeVerifier(per_test_seconds=4.0, workers=2, sandbox=sandbox)
    try:
        assert check.verify(problems, decoded) == [True] * len(problems), decoded
    finally:
        check.close()

    cfg = config_from_dict({
        "run": {"name": "rrl-code", "dir": str(tmp_path / "run"), "seed": 0},
        "backend": "local", "method": "rrl",
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 24},
        "data": {"source": "jsonl", "format": "apps", "train_path": str(TASK), "eval_path": str(TASK),
                 "max_eval_prompts": 2},
        "rrl": {"beta": 1.0, "steps_per_epoch": 1, "stabilise": {"max_steps": 0}},
        "train": {"steps": 2, "checkpoint_every": 2, "progress": False, "keep_checkpoints": 1},
        "eval": {"every": 2, "samples_per_prompt": 2},
        "local": {"tokenizer": str(tmp_path / "tok"), "seed": 0, "lr": 1e-3, "num_threads": 1,
                  "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
                           "intermediate_size": 64}},
    }, [])
    trainer = build_trainer(cfg)
    verifier = trainer.ctx.verifier
    assert isinstance(verifier, CodeVerifier)
    try:
        assert trainer.run() == 0
    finally:
        verifier.close()
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics if "rrl/buffer_size" in m] == [1, 2]
    graded = sum(verifier.outcomes.values())
    assert graded >= 2 * 2 * 4  # every training rollout (and the evaluation's) went through the sandbox
    assert set(verifier.outcomes) <= set(OUTCOMES)
    # evaluation: pass@k per APPS difficulty level (every problem here is introductory: level 0)
    evaluation = json.loads((tmp_path / "run" / "eval" / "step_000002.json").read_text())
    assert list(evaluation["levels"]) == ["0"] and set(evaluation["levels"]["0"]["pass_at_k"]) == {"1", "2"}
    # per step: the mean pass fraction and the fraction of each outcome kind (summing to 1)
    for m in [m for m in metrics if "rrl/buffer_size" in m]:
        kinds = {k: v for k, v in m.items() if k.startswith("code/outcome/")}
        assert set(kinds) == {f"code/outcome/{k}" for k in OUTCOMES} and sum(kinds.values()) == pytest.approx(1.0)
        assert 0.0 <= m["code/pass_fraction"] <= 1.0
    # the canonical solutions of wrong rollouts were scored by the critic (RRL's line 9), so states exist
    assert any(m.get("rrl/canonical_scored", 0) > 0 for m in metrics), json.dumps(metrics[-1])[:500]
