"""Our guidance extensions (docs/DESIGN.md §2) through the real loop: masks reach the batch, drops/gating are
logged, resume is exact."""

from __future__ import annotations

from dataclasses import replace

import pytest
import tiny_task
import torch
from test_orch_loop import KIND_GUIDED, record
from test_orch_resume import _evals, _reproducible

from rise_nemo.config import config_from_dict
from rise_nemo.loop.trainer import read_metrics
from rise_nemo.steps.rubric import guidance_options

ALL_ON = ["rise.retention.no_regression=hard", "rise.retention.mask_penalised_spans=true",
          "rise.retention.span_unit=match", "rise.retention.max_length_ratio=1.5", "rise.gate.enabled=true",
          "rise.gate.threshold=0.5", "rise.hints=length_neutral"]


def test_paper_faithful_turns_every_extension_off(tmp_path, tiny_tokenizer):
    cfg = config_from_dict(tiny_task.recipe(tiny_tokenizer, tmp_path), ALL_ON)
    assert guidance_options(cfg).gate and guidance_options(cfg).no_regression == "hard"
    paper = config_from_dict(tiny_task.recipe(tiny_tokenizer, tmp_path), [*ALL_ON, "rise.paper_faithful=true"])
    off = guidance_options(paper)
    assert off == guidance_options(cfg).paper()
    assert off.no_regression == "none" and not off.mask_penalised_spans and not off.gate and off.max_length_ratio is None
    # The project's default: the paper plus penalised-span masks, the one option the bench showed to help.
    default = guidance_options(config_from_dict(tiny_task.recipe(tiny_tokenizer, tmp_path), []))
    assert default == replace(default.paper(), mask_penalised_spans=True)


def test_masked_spans_reach_the_guide_rows_and_every_rule_is_logged(tmp_path, make_trainer):
    holder = {}

    def wrap(p, g, j):
        holder["p"], holder["g"], holder["j"] = record(p, g, j)
        return holder["p"], holder["g"], holder["j"]

    over = [*ALL_ON, "rise.retention.no_regression=soft", "sampling.group_size=8", "rise.schedule.switch_step=4",
            "train.steps=3", "eval.every=0", "eval.at_start=false"]
    make_trainer(tmp_path, "rise", over, wrap=wrap).run()
    guided = [m for m in read_metrics(tmp_path) if m["guidance/active"]]
    assert len(guided) == 3
    for m in guided:
        for key in ("guidance/gated_out_prompts", "guidance/dropped_length", "guidance/masked_tokens",
                    "guidance/length_ratio", "guidance/dropped_no_regression"):
            assert key in m, key
    assert sum(m["guidance/masked_responses"] for m in guided) > 0
    # Masked tokens are zeros of token_mask INSIDE a guided response, and they spell the negative word.
    tokenizer = holder["g"].inner.engine.tokenizer
    holes = 0
    for batch in holder["p"].calls:
        for row in torch.nonzero(batch["kind"] == KIND_GUIDED).flatten().tolist():
            length = int(batch["input_lengths"][row])
            mask = batch["token_mask"][row, :length]
            first = int(torch.nonzero(mask).min()) if bool(mask.any()) else length
            gap = [t for t in range(first, length) if mask[t] == 0]
            if gap:
                holes += 1
                assert "gamma" in tokenizer.decode(batch["input_ids"][row, gap].tolist())
    assert holes > 0


@pytest.mark.parametrize("options", [ALL_ON, [*ALL_ON, "rise.gate.ema=0.0", "rise.retention.no_regression=soft"]])
def test_resume_with_every_option_on_is_exact(tmp_path, make_trainer, options):
    over = ["train.steps=6", "rise.schedule.switch_step=5", "eval.every=3", *options]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert make_trainer(full, "rise", over).run() == 0
    assert make_trainer(parts, "rise", over, stop_after=2).run() == 0  # inside the guided phase
    assert make_trainer(parts, "rise", over).run() == 0
    a, b = read_metrics(full), read_metrics(parts)
    assert _reproducible(a) == _reproducible(b)
    assert _evals(full) == _evals(parts)
    assert any(m.get("guidance/gated_out_prompts") is not None for m in a)



def test_privileged_budget_bounds_the_privileged_rollouts_of_every_step(tmp_path, make_trainer):
    """rise.gate.budget=0.25: at most 25% of a step's natural rollouts are privileged (whole groups of G',
    at least one prompt), and the prompts left out are logged; without it every failing prompt is guided."""
    over = ["sampling.group_size=4", "rise.privileged_group_size=4", "rise.schedule.switch_step=5", "train.steps=2",
            "eval.every=0", "eval.at_start=false"]
    make_trainer(tmp_path / "paper", "rise", over).run()
    make_trainer(tmp_path / "budget", "rise", [*over, "rise.gate.budget=0.25"]).run()
    paper = [m for m in read_metrics(tmp_path / "paper") if m["guidance/active"]]
    bounded = [m for m in read_metrics(tmp_path / "budget") if m["guidance/active"]]
    assert len(paper) == len(bounded) == 2
    # 2 prompts x 4 natural rollouts = 8; 25% = 2 privileged rollouts < one group of G' = 4 -> one prompt
    assert all(m["guidance/guided_prompts"] == 1 for m in bounded)
    assert sum(m["guidance/guided_prompts"] for m in bounded) < sum(m["guidance/guided_prompts"] for m in paper)
    assert sum(m["guidance/budget_dropped_prompts"] for m in bounded) > 0
