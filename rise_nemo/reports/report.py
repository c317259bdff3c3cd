"""Run reports: PNG plots and a Markdown summary comparing one or more run directories.

Plots (one line per run): ``rewards.png`` natural (solid) vs privileged (dashed) mean reward;
``delta_r.png`` Delta_r (eq. 13) with the guidance switch marked; ``entropy.png`` policy entropy;
``retention.png`` retained guided trajectories per step (eq. 8) against all privileged rollouts;
``eval.png`` guidance-free eval reward, persistent coverage and negative rate (in %). Step axes are integer,
each run's guidance switch is a dotted line on every plot, one legend per figure. ``report.md`` holds the final-eval table and a per-criterion
coverage table across evaluations of every run (like the paper's Tables 12-13).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rise_nemo.reports.reasoning import is_reasoning_run, reasoning_markdown, write_reasoning_plots
from rise_nemo.reports.runs import RunData, load_run, series, write_plots

MAX_EVAL_COLUMNS = 4  # per run in the criterion table: first, last and evenly spaced ones between


def build_figures(runs: Sequence[RunData]) -> dict[str, Any]:
    """The report's matplotlib figures by file name (not yet saved). Every figure: integer step axis,
    labelled y axis, the guidance switch of each run as a dotted vertical line, exactly one legend;
    rates (coverage, negative rate) in percent, as in the tables."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figures: dict[str, Any] = {}
    for name, title, ylabel, draw in STEP_FIGURES:
        fig, ax = plt.subplots(figsize=(7, 4))
        for i, run in enumerate(runs):
            draw(ax, run, colors[i % len(colors)])
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        _finish(fig, [ax], runs, colors)
        figures[name] = fig
    figures["eval.png"] = _eval_figure(plt, runs, colors)
    return figures


def _finish(fig: Any, axes: Sequence[Any], runs: Sequence[RunData], colors: Sequence[str]) -> None:
    """Integer step axes with a grid, each run's guidance switch on every axes, one legend per figure."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for i, run in enumerate(runs):  # the guidance switch, on every plot over steps
        if run.switch_step is not None:
            for j, ax in enumerate(axes):
                ax.axvline(run.at(run.switch_step), color=colors[i % len(colors)], linestyle=":",
                           label=f"{run.label} guidance removed @ {run.switch_step}" if j == 0 else None)
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:  # one legend per figure
        if len(axes) == 1:
            axes[0].legend(handles, labels, fontsize=7)
        else:
            fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(3, len(labels)))
    fig.tight_layout(rect=(0, 0.12 if len(axes) > 1 and handles else 0, 1, 1))


def _rewards(ax: Any, run: RunData, c: str) -> None:
    ax.plot(*series(run, "reward/natural_mean"), color=c, label=f"{run.label} natural")
    xs, ys = series(run, "reward/privileged_mean")
    if xs:
        ax.plot(xs, ys, color=c, linestyle="--", label=f"{run.label} privileged")


def _delta_r(ax: Any, run: RunData, c: str) -> None:
    xs, ys = series(run, "guidance/delta_r")
    if xs:
        ax.plot(xs, ys, color=c, marker=".", label=run.label)


def _retention(ax: Any, run: RunData, c: str) -> None:
    xs, ys = series(run, "guidance/privileged_rollouts")
    if xs and any(ys):
        ax.plot(xs, ys, color=c, linestyle="--", label=f"{run.label} privileged rollouts (total)")
    xs, ys = series(run, "guidance/retained")
    if xs:
        ax.plot(xs, ys, color=c, marker=".", label=f"{run.label} retained (A_ref > 0)")


def _entropy(ax: Any, run: RunData, c: str) -> None:
    xs, ys = series(run, "policy/entropy")
    if xs:
        ax.plot(xs, ys, color=c, label=run.label)


# The per-step figures: (file, title, y label, how one run is drawn).
STEP_FIGURES = (
    ("rewards.png", "Mean rubric reward: natural (solid) vs privileged (dashed)", "mean reward (eq. 3)", _rewards),
    ("delta_r.png", "Delta_r = mean r_priv - mean r_nat (eq. 13)", "Delta_r (reward)", _delta_r),
    ("entropy.png", "Policy entropy (sampled-token estimate)", "entropy (nats / token)", _entropy),
    ("retention.png", "Guided trajectories per step: retained (eq. 8) of all privileged rollouts", "responses per step",
     _retention),
)


def _eval_figure(plt: Any, runs: Sequence[RunData], colors: Sequence[str]) -> Any:
    """Guidance-free evaluation: reward, persistent coverage and negative rate (in %) per evaluation step."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2))
    panels = (("reward_mean", "eval reward", "mean reward (eq. 3)", 1.0),
              ("persistent_coverage", "persistent coverage", "coverage (%)", 100.0),
              ("negative_rate", "negative-criterion rate", "rate (%)", 100.0))
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        for ax, (key, _, _, scale) in zip(axes, panels):
            pts = [(run.at(e["step"]), e.get(key)) for e in run.evals if e.get(key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [scale * p[1] for p in pts], color=c, marker="o",
                        label=run.label if key == "reward_mean" else None)
    for ax, (_, title, ylabel, _) in zip(axes, panels):
        ax.set_title(f"guidance-free {title}", fontsize=9)
        ax.set_ylabel(ylabel)
    _finish(fig, list(axes), runs, colors)
    return fig


def _pick(evals: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    if len(evals) <= k:
        return evals
    idx = sorted({round(i * (len(evals) - 1) / (k - 1)) for i in range(k)})
    return [evals[i] for i in idx]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def markdown(runs: Sequence[RunData], plots: Sequence[Path]) -> str:
    lines = ["# rise_nemo run report", ""]
    lines += ["## Final guidance-free evaluation", "",
              "| run | method | seed | steps | switch | eval reward | persistent coverage | negative rate |",
              "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        last = run.evals[-1] if run.evals else {}
        steps = run.metrics[-1]["step"] if run.metrics else 0
        lines.append(f"| {run.path.name} | {run.method} | {run.seed} | {steps} | "
                     f"{run.switch_step if run.switch_step is not None else '-'} | {_num(last.get('reward_mean'))} | "
                     f"{_pct(last.get('persistent_coverage'))} | {_pct(last.get('negative_rate'))} |")
    lines += ["", "## Per-criterion coverage across evaluations", "",
              "Coverage = satisfied / total judgments (a negative criterion is satisfied when avoided); "
              "criteria with the same text are pooled across prompts. P = persistent, N = negative.", ""]
    columns = [(run, ev) for run in runs for ev in _pick(run.evals, MAX_EVAL_COLUMNS)]
    if columns:
        criteria: dict[str, str] = {}
        for _, ev in columns:
            for row in ev["criteria"]:
                flag = ("P" if row["persistent"] else "") + ("N" if row["negative"] else "")
                criteria.setdefault(row["criterion"], flag)
        header = "| criterion | | " + " | ".join(f"{r.method} s{r.seed} @{ev['step']}" for r, ev in columns) + " |"
        lines += [header, "|---|---|" + "---|" * len(columns)]
        for text, flag in criteria.items():
            cells = []
            for _, ev in columns:
                row = next((r for r in ev["criteria"] if r["criterion"] == text), None)
                cells.append("-" if row is None else f"{row['satisfied']}/{row['total']} ({_pct(row['coverage'])})")
            lines.append(f"| {text} | {flag} | " + " | ".join(cells) + " |")
    else:
        lines.append("(no evaluations found)")
    lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    return "\n".join(lines)


def make_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None) -> Path:
    """Write plots and report.md for ``run_dirs`` into ``out_dir`` (default: <run>/report for one run,
    <common parent>/report otherwise). Returns the path of report.md."""
    from rise_nemo.errors import require_extra

    require_extra("report", "matplotlib", what="the report's plots")
    runs = [load_run(p) for p in run_dirs]
    if not runs:
        raise ValueError("make_report: no run directory given")
    if out_dir is None:
        out_dir = runs[0].path / "report" if len(runs) == 1 else runs[0].path.parent / "report"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if all(is_reasoning_run(r) for r in runs):  # verifier-scored reasoning runs: pass@k plots (docs/DESIGN.md §7)
        plots = write_reasoning_plots(runs, out)
        text = reasoning_markdown(runs, plots)
    else:
        plots = write_plots(runs, out, build_figures)
        text = markdown(runs, plots)
    path = out / "report.md"
    path.write_text(text)
    return path
