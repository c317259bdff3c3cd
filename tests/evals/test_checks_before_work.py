"""Every check before any work: a command checks its extras, scorer, verifier and judge before its first
generation or training step. Each missing extra is simulated as a fresh install without it would have it
(``sys.modules[name] = None``: the import fails), and the test proves that nothing was generated, built or
trained: the model loader / backend builder / trainer would fail the test if called."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from suite_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
GSM8K_ROWS = REPO / "tests" / "data" / "fixtures" / "gsm8k_test_first8.jsonl"


def _never(what: str):
    def called(*args, **kwargs):
        raise AssertionError(f"{what} was called before the missing extra was reported")
    return called


def _one_line_naming(err: str, extra: str) -> None:
    lines = [line for line in err.strip().splitlines() if not line.startswith("[rise-nemo]")]  # progress logs
    assert len(lines) == 1 and f"the '{extra}' extra" in lines[0] and "Traceback" not in err, err
    assert f"pip install 'rise_nemo[{extra}]'" in lines[0], err


@pytest.mark.parametrize("suite, module, extra", [("gsm8k", "math_verify", "math"), ("math500", "math_verify", "math"),
                                                  ("healthbench", "aiohttp", "judge")])
def test_eval_suite_without_its_extra_fails_before_the_first_generation(suite, module, extra, tmp_path, capsys,
                                                                         monkeypatch):
    import rise_nemo.evals.generate as generate

    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setattr(generate, "load_generator", _never("the model loader"))
    monkeypatch.setattr(generate, "generate_responses", _never("generation"))
    model = tmp_path / "model"  # never read: the check comes first
    model.mkdir()
    rc, _, err = run_cli(["eval", "--suite", suite, model, "--out", tmp_path / "out"], capsys)
    assert rc == 2
    _one_line_naming(err, extra)
    assert not (tmp_path / "out" / f"{suite}.responses.jsonl").exists()


def test_an_http_judge_without_the_judge_extra_fails_before_the_first_generation(tmp_path, capsys, monkeypatch):
    import rise_nemo.evals.generate as generate

    monkeypatch.setitem(sys.modules, "aiohttp", None)
    monkeypatch.setattr(generate, "load_generator", _never("the model loader"))
    rc, _, err = run_cli(["eval", "--suite", "writingbench", tmp_path, "--judge-url", "http://127.0.0.1:9/v1",
                          "--judge-model", "m", "--out", tmp_path / "out"], capsys)
    assert rc == 2
    _one_line_naming(err, "judge")


def _gsm8k_recipe(tmp_path: Path, method: str = "grpo") -> Path:
    tree = {"defaults": str(REPO / "recipes" / "gsm8k_base_local.yaml"), "method": method,
            "run": {"dir": str(tmp_path / "run")},
            "data": {"train_path": str(GSM8K_ROWS), "eval_path": str(GSM8K_ROWS)},
            "local": {"model_path": str(tmp_path / "model")}}  # never loaded: the checks come first
    (tmp_path / "model").mkdir(exist_ok=True)
    path = tmp_path / "gsm8k.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_eval_of_math_rows_without_math_verify_fails_before_the_model_is_built(tmp_path, capsys, monkeypatch):
    import rise_nemo.backends as backends

    monkeypatch.setitem(sys.modules, "math_verify", None)
    monkeypatch.setattr(backends, "build_backend", _never("the backend builder"))
    rc, _, err = run_cli(["eval", "--config", _gsm8k_recipe(tmp_path)], capsys)
    assert rc == 2
    _one_line_naming(err, "math")


def test_train_on_math_rows_without_math_verify_fails_before_anything_is_read(tmp_path, capsys, monkeypatch):
    import rise_nemo.loop.data as data

    monkeypatch.setitem(sys.modules, "math_verify", None)
    monkeypatch.setattr(data, "load_prompts", _never("the data loader"))
    rc, _, err = run_cli(["train", "--config", _gsm8k_recipe(tmp_path)], capsys)
    assert rc == 2
    _one_line_naming(err, "math")
    assert not (tmp_path / "run").exists()


def test_a_pipeline_checks_every_stage_before_its_first_stage_trains(tmp_path, capsys, monkeypatch):
    """Stage 2 (GSM8K rows) needs math-verify: refused before stage 1 (the embedded task) starts."""
    import rise_nemo.loop.run as run

    monkeypatch.setitem(sys.modules, "math_verify", None)
    monkeypatch.setattr(run, "build_trainer", _never("stage 1's trainer"))
    pipeline = tmp_path / "pipe.yaml"
    pipeline.write_text(yaml.safe_dump({
        "pipeline": {"name": "p", "dir": str(tmp_path / "pipe")},
        "stages": [{"name": "s1", "recipe": str(REPO / "recipes" / "grpo_chain_tiny_cpu.yaml")},
                   {"name": "s2", "recipe": str(_gsm8k_recipe(tmp_path))}]}))
    rc, _, err = run_cli(["pipeline", pipeline], capsys)
    assert rc == 2
    _one_line_naming(err, "math")
    assert not (tmp_path / "pipe").exists()
