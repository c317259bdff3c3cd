"""The `rise-nemo` commands end to end on the tiny task: train, eval, report, errors, and a mini demo."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "orchestration"))

import tiny_task  # noqa: E402

from rise_nemo.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return tiny_task.build_tokenizer(tmp_path_factory.mktemp("cli_tok"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer_dir):
    """Two finished tiny runs (RISE-RL and Rubric-RL) made with `rise-nemo train`."""
    root = tmp_path_factory.mktemp("cli_runs")
    runs = {}
    for method in ("rise", "rubric_rl"):
        recipe = tiny_task.write_recipe(root / f"recipe_{method}", tokenizer_dir, root / method, method)
        assert main(["train", "--config", str(recipe), "train.steps=3", "eval.every=2"]) == 0
        runs[method] = root / method
    return runs


def test_usage_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("train", "eval", "report", "demo"):
        assert name in out
    assert main(["nope"]) == 2


def test_train_writes_the_contract_run_directory(trained):
    run = trained["rise"]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert (run / "config.yaml").is_file() and (run / "train.log").is_file()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step_000000.json", "step_000002.json",
                                                                "step_000003.json"]


def test_train_rejects_bad_overrides_and_recipes(tmp_path, tokenizer_dir, capsys):
    recipe = tiny_task.write_recipe(tmp_path, tokenizer_dir, tmp_path / "run")
    assert main(["train", "--config", str(recipe), "sampling.groupsize=4"]) == 2
    assert "unknown key 'sampling.groupsize'" in capsys.readouterr().err
    assert main(["train", "--config", str(recipe), "sampling.group_size"]) == 2
    assert "expected key=value" in capsys.readouterr().err
    assert main(["train", "--config", str(recipe), "grpo.group_size=4"]) == 2  # a key of an earlier release
    err = capsys.readouterr().err.strip()
    assert err.endswith("command-line override 'grpo.group_size=4': key 'grpo.group_size' was renamed to "
                        "'sampling.group_size'") and "\n" not in err, err
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"defaults: {recipe.name}\ntrain:\n  stepz: 3\n")
    assert main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "train.stepz" in err and str(bad) in err
    assert not (tmp_path / "run").exists()  # nothing was started


def test_eval_scores_the_latest_checkpoint(trained, capsys):
    run = trained["rise"]
    out_file = run / "eval_again.json"
    assert main(["eval", str(run), "eval.samples_per_prompt=8", "--out", str(out_file)]) == 0
    printed = capsys.readouterr().out
    assert "persistent coverage" in printed and "Mentions alpha" in printed
    again = json.loads(out_file.read_text())
    assert again["step"] == 3
    # Same checkpoint, same eval seed stream: the training run's own final evaluation is reproduced.
    final = json.loads((run / "eval" / "step_000003.json").read_text())
    assert again["criteria"] == final["criteria"] and again["reward_mean"] == final["reward_mean"]


def test_report_compares_runs_with_plots_and_a_criterion_table(trained, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(trained["rubric_rl"]), str(trained["rise"]), "--out", str(out)]) == 0
    assert str(out / "report.md") in capsys.readouterr().out
    for name in ("rewards.png", "delta_r.png", "entropy.png", "retention.png", "eval.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    md = (out / "report.md").read_text()
    assert "| Mentions alpha | P |" in md and "| Says gamma | N |" in md
    assert "rubric_rl s3 @0" in md and "rise s3 @3" in md
    assert main(["report", str(tmp_path / "missing")]) == 2


@pytest.mark.slow
def test_demo_end_to_end_in_miniature(tmp_path, capsys):
    """The real demo path (persistent task, warm start, both methods, report) with tiny budgets."""
    rc = main(["demo", "--steps", "2", "--out", str(tmp_path / "demo"), "train.progress=false",
               f"data.warm_start_cache={tmp_path / 'cache'}", "++data.warm_start.steps=3",
               "++data.warm_start.eval_samples=1", "++data.task.train_per_topic=1", "++data.task.heldout_per_topic=1",
               "sampling.prompts_per_step=2", "sampling.group_size=2", "sampling.max_new_tokens=8", "eval.samples_per_prompt=2"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "persistent cov." in out and "rubric_rl" in out and "rise" in out
    assert (tmp_path / "demo" / "report" / "report.md").is_file()
    assert "warm start: persistent criteria met unprompted" in out
