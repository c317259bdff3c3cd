"""`eval --suite` on a run directory evaluates the same model as `rise-nemo eval` (one loader,
rise_nemo.loop.run.load_eval_model): its checkpoint, else the recipe's initial policy, which on the
embedded tasks is the warm-started model a fresh run starts from (before the shared loader, `eval --suite`
sampled the untrained model there)."""

from __future__ import annotations

from pathlib import Path

import yaml

import rise_nemo.loop.run as run_module
from rise_nemo.config.loader import load_recipe_tree
from rise_nemo.config.recipes import resolve_recipe
from rise_nemo.evals.generate import load_generator

RECIPE_OVERRIDES = ["train.progress=false", "local.num_threads=1"]


def _run_dir_without_checkpoint(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    tree = load_recipe_tree(resolve_recipe("rubric_rl_tiny_cpu"))
    (run / "config.yaml").write_text(yaml.safe_dump(tree))
    return run


def test_a_run_directory_without_a_checkpoint_is_evaluated_warm_started(tmp_path, monkeypatch):
    warm_started = []
    monkeypatch.setattr(run_module, "warm_start_policy",
                        lambda cfg, policy, generator, progress=True: warm_started.append((policy, generator)))
    run = _run_dir_without_checkpoint(tmp_path)
    generator, info = load_generator(str(run), None, RECIPE_OVERRIDES)
    assert info["step"] == 0 and info["checkpoint"] is None
    assert len(warm_started) == 1 and warm_started[0][1] is generator


def test_rise_nemo_eval_and_eval_suite_load_through_the_same_function(tmp_path, monkeypatch):
    calls = []
    real = run_module.load_eval_model

    def recording(cfg, run_dir, checkpoint, env_sources=None, before_build=None):
        calls.append(Path(run_dir))
        return real(cfg, run_dir, checkpoint, env_sources, before_build)

    monkeypatch.setattr(run_module, "load_eval_model", recording)
    monkeypatch.setattr(run_module, "warm_start_policy", lambda *a, **k: None)
    run = _run_dir_without_checkpoint(tmp_path)
    load_generator(str(run), None, RECIPE_OVERRIDES)
    assert calls == [run]
