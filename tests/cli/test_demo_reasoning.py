"""`rise-nemo demo --task reasoning` end to end in miniature (the warm start's measured properties are
printed in the demo; it writes a report with plots), the method list that picks up a recipe when it
exists, and the --task error."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

from rise_nemo.cli import main
from rise_nemo.commands.demo import REASONING_METHODS, reasoning_methods
from rise_nemo.config.recipes import recipes_dir

# A tiny warm start (a few SFT steps of an h32 model) on a 3-level task, 1 RL step per method.
TINY = ["train.progress=false", "++data.warm_start.steps=3", "++data.warm_start.noise_steps=2",
        "data.task.max_steps=3", "data.task.train_levels=[2,3]", "data.task.heldout_per_level=2",
        "++data.task.train_per_level=2", "sampling.prompts_per_step=2", "sampling.group_size=2", "sampling.max_new_tokens=24",
        "local.tiny.hidden_size=32", "local.tiny.intermediate_size=64", "local.tiny.head_dim=8"]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_reasoning_demo_end_to_end_in_miniature(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RISE_NEMO_CACHE", str(tmp_path / "cache"))
    out_dir = tmp_path / "demo"
    assert main(["demo", "--task", "reasoning", "--steps", "1", "--out", str(out_dir), *TINY]) == 0
    out = capsys.readouterr().out
    assert "one-time cost" in out and str(tmp_path / "cache" / "warm_start") in out
    assert "warm start trained in" in out
    assert any((tmp_path / "cache" / "warm_start").iterdir())  # the temporary cache, not ~/.cache

    # The warm start's per-level table: pass@1..pass@8 and step accuracy for every held-out level.
    header = re.search(r"^level problems\s+pass@1\s+pass@2\s+pass@4\s+pass@8\s+step acc\s+length\s+entropy$",
                       out, re.M)
    assert header is not None, out
    for level in (1, 2, 3):
        assert re.search(rf"^\s+{level}\s+2(\s+(\d+\.\d%|-)){{5}}\s+\d+\.\d\s", out, re.M), out
    # The property line: each of the four properties with its value, target and verdict.
    line = re.search(r"^warm-start properties: (.*)$", out, re.M)
    assert line is not None, out
    parts = line[1].split("; ")
    assert len(parts) == 4
    for part, target in zip(parts, (r"L1 pass@1 .* >= 50%", r"L3 pass@1 .* <= 3%", r"L3 pass@8 .* <= 20%",
                                    r"step accuracy \(every level\) .* >= 50%")):
        assert re.match(target + r" (met|NOT MET|not measured)", part), part
    assert line[1].endswith(("-> all met", "-> NOT all met"))

    # The comparison: one row per method whose recipe exists, four "before -> after" cells, the run directory.
    methods = [m for m, _ in reasoning_methods(recipes_dir())]
    assert methods[:2] == ["ppo", "grpo"]
    assert re.search(r"^method\s+steps\s+L2-3 pass@1\s+L2-3 pass@8\s+L3 pass@1\s+L3 pass@8\s+train s\s+run directory$",
                     out, re.M), out
    for method in methods:
        row = re.search(rf"^{method}\s+1((\s+(\d+\.\d%|-) ->\s+(\d+\.\d%|-)){{4}})\s+\d+\s+(\S+)$", out, re.M)
        assert row is not None, out
        run_dir = out_dir / method
        assert row[5] == str(run_dir)
        assert (run_dir / "eval" / "step_000001.json").is_file()
        assert (run_dir / "checkpoints" / "step_000001").is_dir()
    # The report over every method's run, like the rubric demo's.
    report = out_dir / "report" / "report.md"
    assert f"report: {report}" in out and report.is_file()
    for plot in ("pass_at_k.png", "pass_vs_step.png", "reasoning_train.png"):
        assert (report.parent / plot).is_file() and f"({plot})" in report.read_text()
    if "rrl" in methods:
        assert (report.parent / "rrl.png").is_file()

    # A second demo loads the warm start from the cache and retrains from it (fresh run directories).
    assert main(["demo", "--task", "reasoning", "--steps", "1", "--out", str(out_dir), *TINY]) == 0
    again = capsys.readouterr().out
    assert "warm start loaded from the cache" in again
    assert "resumed" not in again


def test_reasoning_methods_pick_up_recipes_that_exist(tmp_path):
    for _, recipe in REASONING_METHODS:
        shutil.copy(recipes_dir() / "grpo_chain_tiny_cpu.yaml", tmp_path / recipe)
    assert [m for m, _ in reasoning_methods(tmp_path)] == [m for m, _ in REASONING_METHODS]
    (tmp_path / "rrl_chain_tiny_cpu.yaml").unlink()  # optional: RRL runs when its recipe exists
    assert [m for m, _ in reasoning_methods(tmp_path)] == ["ppo", "grpo"]
    (tmp_path / "grpo_chain_tiny_cpu.yaml").unlink()
    with pytest.raises(FileNotFoundError, match="grpo_chain_tiny_cpu.yaml"):
        reasoning_methods(tmp_path)


def test_demo_rejects_an_unknown_task(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--task", "math"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --task: invalid choice: 'math'" in err and "reasoning" in err and "rubric" in err


def test_comparison_table_pools_each_methods_own_training_levels():
    from pathlib import Path

    from rise_nemo.commands.demo import reasoning_comparison_table

    def result(step, p1):  # pass@1 = p1 * level, pass@8 = 0.5 on levels 1..4, 2 problems each
        return {"step": step, "samples_per_problem": 8,
                "levels": {str(lv): {"problems": 2, "pass_at_k": {"1": p1 * lv, "8": 0.5}} for lv in range(1, 5)}}

    rows = [{"method": "ppo", "run_dir": Path("runs/d/ppo"), "seconds": 3.0, "train_levels": [3, 4],
             "before": result(0, 0.01), "after": result(2, 0.1)},
            {"method": "rrl", "run_dir": Path("runs/d/rrl"), "seconds": 4.0, "train_levels": [2, 4],
             "before": result(0, 0.01), "after": result(2, 0.1)}]
    table = reasoning_comparison_table(rows)
    assert "training levels ppo L3-4, rrl L2,4, hardest level L4" in table
    assert re.search(r"^ppo\s+2\s+3\.5% ->\s+35\.0%\s+50\.0% ->\s+50\.0%\s+4\.0% ->\s+40\.0%\s+50\.0% ->\s+50\.0%"
                     r"\s+3\s+runs/d/ppo$", table, re.M), table
    assert re.search(r"^rrl\s+2\s+3\.0% ->\s+30\.0%", table, re.M), table
