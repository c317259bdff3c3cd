"""Report plots: integer step axes, labelled y axes, rates in %, the guidance switch on
every plot over steps, retention as counts with their totals, one legend per figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from rise_nemo.reports.report import build_figures
from rise_nemo.reports.runs import RunData

pytest.importorskip("matplotlib")


def _run(name: str, method: str, switch: int | None) -> RunData:
    metrics = []
    for step in range(1, 8):
        guided = switch is not None and step < switch
        metrics.append({"step": step, "reward/natural_mean": 0.1 * step, "policy/entropy": 1.0 / step,
                        "reward/privileged_mean": 0.5 if guided else None, "guidance/active": guided,
                        "guidance/delta_r": 0.2 if guided else None, "guidance/retained": 3 if guided else 0,
                        "guidance/privileged_rollouts": 8 if guided else 0})
    evals = [{"step": s, "reward_mean": 0.2 + 0.05 * s, "persistent_coverage": 0.1 * s / 2,
              "negative_rate": 0.02} for s in (0, 2, 4, 6)]
    return RunData(Path(name), name, method, 0, metrics, evals,
                   switch_step=4 if switch is not None else None)


def test_figures_read_like_the_tables():
    import matplotlib.pyplot as plt

    figures = build_figures([_run("rise", "rise", switch=4), _run("rubric_rl", "rubric_rl", switch=None)])
    assert set(figures) == {"rewards.png", "delta_r.png", "entropy.png", "retention.png", "eval.png"}
    for name, fig in figures.items():
        fig.canvas.draw()
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
        assert len(legends) == 1, name
        for ax in fig.axes:
            assert ax.get_ylabel(), name
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)
            switch_lines = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [4, 4]]
            assert len(switch_lines) == 1, name  # the RISE run's switch, on every plot over steps
        plt.close(fig)
    coverage_ax = figures["eval.png"].axes[1]
    assert "%" in coverage_ax.get_ylabel()
    assert max(max(ln.get_ydata()) for ln in coverage_ax.get_lines() if len(ln.get_xdata()) > 2) == pytest.approx(30.0)
    labels = [ln.get_label() for ln in figures["retention.png"].axes[0].get_lines()]
    assert any("total" in lab for lab in labels) and any("retained" in lab for lab in labels)
