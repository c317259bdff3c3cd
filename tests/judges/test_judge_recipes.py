"""The judge config blocks in recipes/judge/ load through the recipe loader and build working judges."""

from __future__ import annotations

from pathlib import Path

import pytest
from judge_testlib import expected, small_requests

from rise_nemo.config.loader import load_config, to_yaml
from rise_nemo.judges import build_judge
from rise_nemo.judges.http import HttpJudge

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.mark.parametrize("block", ["judge_batched.yaml", "judge_per_criterion.yaml"])
def test_judge_block_composes_with_a_recipe(tmp_path, server, block, monkeypatch):
    recipe = tmp_path / "with_llm_judge.yaml"
    recipe.write_text(f"defaults: [{RECIPES / 'rise_tiny_cpu.yaml'}, {RECIPES / 'judge' / block}]\n")
    monkeypatch.setenv("RISE_TEST_JUDGE_KEY", "sk-never-written-9d2")
    cfg = load_config(recipe, [f"judge.base_urls=[{server.url}]", "judge.ray_actor=false",
                               "judge.api_key_env=RISE_TEST_JUDGE_KEY", "judge.backoff_base_s=0.01"])
    assert cfg.judge.mode == block.removeprefix("judge_").removesuffix(".yaml")
    judge = build_judge(cfg.judge)  # the project's factory dispatches type: http to build_http_judge
    try:
        assert isinstance(judge, HttpJudge)
        assert judge.judge(small_requests()) == expected(small_requests())
    finally:
        judge.close()
    written = to_yaml(cfg)  # what the run directory's config.yaml would hold
    assert "RISE_TEST_JUDGE_KEY" in written and "sk-never-written-9d2" not in written
