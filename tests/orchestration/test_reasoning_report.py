"""Reasoning report plots on small synthetic run directories written in the trainer's format
(metrics.jsonl, config.yaml, eval/step_*.json; a pipeline directory with pipeline.json): one timeline for a
pipeline's stages with the boundary marked, judge scores and 0/1 verifier rewards never on one axis, no empty
critic panel, pass@k legends that say before/after and stay off the data, pass-vs-step over the training
levels only, an RRL panel, integer step ticks; and `rise-nemo report` on such a pipeline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from rise_nemo.reports.runs import load_run

pytest.importorskip("matplotlib")

LEVELS = (1, 2, 3, 4, 5, 6)
TRAIN_LEVELS = [5, 6]


def _eval(step: int, trained: float, untrained: float = 0.9) -> dict:
    """pass@k per level: ``trained`` on the training levels, ``untrained`` on the others (so a mean over every
    level is far from the training levels' pool)."""
    levels = {}
    for lv in LEVELS:
        p1 = trained if lv in TRAIN_LEVELS else untrained
        levels[str(lv)] = {"problems": 4, "pass_at_k": {"1": p1, "2": min(1.0, 1.5 * p1), "4": min(1.0, 2 * p1),
                                                         "8": min(1.0, 2.5 * p1)},
                           "step_accuracy": 0.6, "response_length": 20.0, "token_entropy": 0.5, "undecided": 0}
    return {"step": step, "kind": "reasoning", "samples_per_problem": 8, "num_problems": 4 * len(LEVELS),
            "pass_at_1": None, "levels": levels, "samples": []}


def _write_run(path: Path, method: str, steps: int, metric, evals: dict[int, float], seed: int = 0,
               train_levels=TRAIN_LEVELS) -> Path:
    path.mkdir(parents=True)
    cfg = {"method": method, "run": {"seed": seed, "name": path.name},
           "data": {"source": "chain_arithmetic", "task": {"max_steps": 6, "train_levels": train_levels}}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **metric(s)}) + "\n" for s in range(1, steps + 1)))
    (path / "eval").mkdir()
    for step, value in evals.items():
        (path / "eval" / f"step_{step:06d}.json").write_text(json.dumps(_eval(step, value)))
    (path / "summary.json").write_text(json.dumps({"method": method, "seed": seed, "steps": steps}))
    return path


def _pipeline(root: Path, seed: int = 0) -> Path:
    """ExpRL Stage I (judge scores around 0.6) for 4 steps, then sparse GRPO (0/1 rewards around 0.1) for 3."""
    _write_run(root / "stage1_exprl_outcome", "exprl_outcome", 4, lambda s: {"reward/mean": 0.55 + 0.02 * s},
               {0: 0.1, 2: 0.15, 4: 0.2}, seed)
    _write_run(root / "stage2_grpo", "grpo", 3, lambda s: {"reward/mean": 0.05 * s}, {0: 0.2, 3: 0.3}, seed)
    (root / "pipeline.json").write_text(json.dumps({"pipeline": root.name, "stages": [
        {"name": "stage1_exprl_outcome", "recipe": "a.yaml", "init": "warm_start"},
        {"name": "stage2_grpo", "recipe": "b.yaml", "init": "previous"}]}))
    return root


def _ppo(path: Path, undefined_at=(2, 4)) -> Path:
    return _write_run(path, "ppo", 5, lambda s: {"reward/mean": 0.1 * s, "critic/value_loss": 0.1,
                                                 "critic/explained_variance": None if s in undefined_at else 0.1 * s},
                      {0: 0.1, 5: 0.25})


def _rrl(path: Path) -> Path:
    def metric(s):
        return {"reward/mean": 0.2, "critic/explained_variance": 0.05 * s, "rrl/stabilised": s >= 3,
                "rrl/buffer_size": max(0, 3 * (s - 2)), "rrl/replay_fraction": 0.0 if s < 4 else 0.25,
                "rrl/solve_rate_replayed": None if s < 4 else 0.5, "rrl/solve_rate_scratch": 0.1}
    return _write_run(path, "rrl", 6, metric, {0: 0.1, 6: 0.2})


def _figures(runs):
    from rise_nemo.reports.reasoning import build_reasoning_figures

    return build_reasoning_figures([load_run(p) for p in runs])


def _step_axes(fig):
    return [ax for ax in fig.axes if ax.get_xlabel().startswith("step")]


def _check_integer_ticks(figures):
    for name, fig in figures.items():
        for ax in _step_axes(fig):
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)


def _legend_outside_axes(fig) -> list[str]:
    """The figure's one legend; its box must not overlap any axes (no legend over the data)."""
    fig.canvas.draw()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    assert len(legends) == 1
    box = legends[0].get_window_extent()
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent()), "legend over the axes"
    return [t.get_text() for t in legends[0].get_texts()]


def _data_lines(ax):
    return [ln for ln in ax.get_lines() if len(ln.get_xdata()) >= 2 and len(set(ln.get_xdata())) > 1]


def test_pipeline_stages_share_one_timeline_and_rewards_keep_their_scales(tmp_path):
    import matplotlib.pyplot as plt

    root = _pipeline(tmp_path / "exprl_pipeline")
    figures = _figures([root / "stage1_exprl_outcome", root / "stage2_grpo"])
    # Stage II's steps 1..3 and evaluations 0..3 are plotted at 5..7 and 4..7, after Stage I's 4 steps.
    ax = figures["pass_vs_step.png"].axes[0]
    xs = sorted({float(x) for ln in _data_lines(ax) for x in ln.get_xdata()})
    assert xs == [0, 2, 4, 7]
    train = figures["reasoning_train.png"]
    titles = [a.get_title() for a in train.axes]
    assert len(titles) == 2 and "verifier" in titles[0] and "judge" in titles[1]
    verifier_ax, judge_ax = train.axes
    assert [list(ln.get_xdata()) for ln in _data_lines(judge_ax)] == [[1, 2, 3, 4]]  # Stage I only
    assert [list(ln.get_xdata()) for ln in _data_lines(verifier_ax)] == [[5, 6, 7]]  # Stage II only, after it
    assert "0/1" in titles[0] and "(s - 1) / 4" in judge_ax.get_ylabel()
    # No run has a critic: no explained-variance panel at all.
    assert not any("explained variance" in t for t in titles)
    # The stage boundary (Stage II starts after Stage I's 4 steps) on every plot over steps, in the legend.
    for name, fig in figures.items():
        for a in _step_axes(fig):
            assert [list(ln.get_xdata()) for ln in a.get_lines() if ln.get_linestyle() == "-."] == [[4, 4]], name
        if _step_axes(fig):
            assert any("stage boundary (stage2_grpo starts)" in t for t in _legend_outside_axes(fig)), name
    _check_integer_ticks(figures)
    # pass@k vs k: before, after Stage I, after Stage II; the legend says which is which.
    labels = _legend_outside_axes(figures["pass_at_k.png"])
    assert labels[0] == "exprl_pipeline (s0)"
    assert any(lab.startswith("before") for lab in labels) and any(lab.startswith("after training") for lab in labels)
    assert any("stage1_exprl_outcome" in lab for lab in labels)
    assert [ln.get_linestyle() for ln in figures["pass_at_k.png"].axes[0].get_lines()] == ["--", "-.", "-"]
    for fig in figures.values():
        plt.close(fig)
    # Beside an RRL run: the boundary only where the pipeline is drawn (not on the RRL or critic panels).
    figures = _figures([root / "stage1_exprl_outcome", root / "stage2_grpo", _rrl(tmp_path / "rrl")])
    for ax in figures["rrl.png"].axes + [a for a in figures["reasoning_train.png"].axes if "critic" in a.get_title()]:
        assert not [ln for ln in ax.get_lines() if ln.get_linestyle() == "-."] and ax.get_xlabel() == "step"
    assert not any("stage boundary" in t for t in _legend_outside_axes(figures["rrl.png"]))
    for fig in figures.values():
        plt.close(fig)


def test_pass_vs_step_pools_only_the_training_levels(tmp_path):
    import matplotlib.pyplot as plt

    figures = _figures([_write_run(tmp_path / "grpo", "grpo", 2, lambda s: {"reward/mean": 0.1}, {0: 0.1, 2: 0.3})])
    ax = figures["pass_vs_step.png"].axes[0]
    pass1 = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) == 2]
    assert [list(ln.get_ydata()) for ln in pass1] == [[0.1, 0.3]]  # untrained levels (0.9) are not averaged in
    assert "the training levels L5-6" in ax.get_title() and "training levels" in ax.get_ylabel()
    titles = [a.get_title() for a in figures["pass_at_k.png"].axes]
    assert "(not trained on)" in titles[0] and "(training level)" in titles[-1]
    for fig in figures.values():
        plt.close(fig)
    # A run that trains on every level pools every level; the legend says which levels each run's lines pool.
    every = _write_run(tmp_path / "all", "grpo", 2, lambda s: {"reward/mean": 0.1}, {0: 0.1, 2: 0.3}, train_levels=None)
    figures = _figures([tmp_path / "grpo", every])
    labels = _legend_outside_axes(figures["pass_vs_step.png"])
    assert labels[:2] == ["grpo (s0): L5-6", "grpo all (s0): all levels L1-6"]
    pass1 = [ln for ln in figures["pass_vs_step.png"].axes[0].get_lines() if ln.get_linestyle() == "-"]
    assert list(pass1[1].get_ydata()) == pytest.approx([(4 * 0.9 + 2 * 0.1) / 6, (4 * 0.9 + 2 * 0.3) / 6])
    for fig in figures.values():
        plt.close(fig)


def test_critic_panel_skips_undefined_steps_and_rrl_panel(tmp_path):
    import matplotlib.pyplot as plt

    figures = _figures([_ppo(tmp_path / "ppo"), _rrl(tmp_path / "rrl")])
    train = figures["reasoning_train.png"]
    ev_ax = next(a for a in train.axes if "explained variance" in a.get_title())
    ppo_line = next(ln for ln in ev_ax.get_lines() if len(ln.get_xdata()) == 5)
    ys = list(ppo_line.get_ydata())
    assert math.isnan(ys[1]) and math.isnan(ys[3]) and ys[4] == pytest.approx(0.5)  # undefined -> gaps
    rrl = figures["rrl.png"]
    titles = [a.get_title() for a in rrl.axes]
    assert titles == ["replay buffer", "rollouts continuing a replayed state", "solve rate (verifier)"]
    solve = rrl.axes[2]
    assert {ln.get_linestyle() for ln in _data_lines(solve)} == {"-", "--"}  # replayed vs from scratch
    assert [list(ln.get_xdata()) for ln in rrl.axes[0].get_lines() if ln.get_linestyle() == ":"] == [[3, 3]]
    labels = _legend_outside_axes(rrl)
    assert "solve rate from replayed states" in labels and "solve rate from scratch" in labels
    _check_integer_ticks(figures)
    for fig in figures.values():
        plt.close(fig)
    # Without an RRL run there is no RRL figure.
    assert "rrl.png" not in _figures([tmp_path / "ppo"])


def test_many_runs_keep_the_legend_off_the_data(tmp_path):
    import matplotlib.pyplot as plt

    runs = [_write_run(tmp_path / f"grpo_{i}", "grpo", 3, lambda s: {"reward/mean": 0.1 * s},
                       {0: 0.1, 3: 0.1 + 0.05 * i}, seed=i) for i in range(7)]
    figures = _figures(runs)
    for name, fig in figures.items():
        labels = _legend_outside_axes(fig)
        assert len(labels) <= 7 + 3, (name, labels)  # one entry per run plus the line styles
    for fig in figures.values():
        plt.close(fig)


def test_report_command_on_a_pipeline_directory(tmp_path):
    from rise_nemo.cli import main

    root = _pipeline(tmp_path / "exprl_pipeline")
    _ppo(tmp_path / "ppo")
    assert main(["report", str(root), str(tmp_path / "ppo"), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "stage 2 of exprl_pipeline, plotted from step 4" in text and "training levels L5-6" in text
    for name in ("pass_at_k", "pass_vs_step", "reasoning_train"):
        assert f"({name}.png)" in text and (tmp_path / "report" / f"{name}.png").is_file()
    assert not (tmp_path / "report" / "rrl.png").exists()
