"""Run reports: PNG plots and a Markdown summary comparing one or more run directories.

Plots (one line per run): ``rewards.png`` natural (solid) vs privileged (dashed) mean reward;
``delta_r.png`` Delta_r (eq. 13) with the guidance switch marked; ``entropy.png`` policy entropy;
``retention.png`` retained guided trajectories per step (eq. 8) against all privileged rollouts;
``eval.png`` guidance-free eval reward, persistent coverage and negative rate (in %). Step axes are integer,
each run's guidance switch is a dotted line on every plot, one legend per figure. ``report.md`` holds the final-eval table and a per-criterion
coverage table across evaluations of every run (like the paper's Tables 12-13).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_EVAL_COLUMNS = 4  # per run in the criterion table: first, last and evenly spaced ones between


@dataclass
class RunData:
    path: Path
    label: str
    method: str
    seed: int | None
    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]] = field(default_factory=list)
    switch_step: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    # A pipeline's stage (rise_nemo.loop.pipeline): the pipeline directory, the stage's position and
    # the steps of the stages before it, so every stage is drawn on one timeline (this stage's step s at
    # step_offset + s).
    pipeline: Path | None = None
    stage_index: int = 0
    step_offset: int = 0

    def at(self, step: int) -> int:
        """The plotted step of this run's ``step`` (after the earlier stages of its pipeline)."""
        return self.step_offset + int(step)


def load_run(path: str | Path) -> RunData:
    path = Path(path)
    metrics_file = path / "metrics.jsonl"
    if not metrics_file.is_file():
        raise FileNotFoundError(f"{path}: not a run directory (no metrics.jsonl)")
    metrics = []
    for lineno, line in enumerate(metrics_file.read_text().splitlines(), 1):
        if line.strip():
            try:
                metrics.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{metrics_file}:{lineno}: invalid JSON ({exc.msg})") from exc
    cfg = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else {}
    method = str(cfg.get("method", "?"))
    seed = (cfg.get("run") or {}).get("seed")
    evals = [json.loads(p.read_text()) for p in sorted((path / "eval").glob("step_*.json"))] \
        if (path / "eval").is_dir() else []
    label = f"{path.name} (s{seed})" if method in path.name else f"{method} {path.name} (s{seed})"
    from rise_nemo.loop.pipeline import stage_position

    position = stage_position(path)
    return RunData(path, label, method, seed, metrics, evals, switch_step=_switch_step(metrics),
                   config=cfg if isinstance(cfg, dict) else {}, **(position or {}))


def curve_auc(curve: Sequence[tuple[int, float]]) -> float:
    """Area under a (step, value) curve by the trapezoid rule, divided by the step span: the curve's mean
    height, so budgets of different lengths compare (used for persistent-coverage curves)."""
    if not curve:
        return float("nan")
    area = sum((s1 - s0) * (v0 + v1) / 2 for (s0, v0), (s1, v1) in zip(curve, curve[1:]))
    span = curve[-1][0] - curve[0][0]
    return area / span if span else float(curve[0][1])


def _switch_step(metrics: Sequence[dict[str, Any]]) -> int | None:
    """First step without guidance after a guided one (None if guidance never ran or never stopped)."""
    was_active = False
    for m in metrics:
        active = bool(m.get("guidance/active"))
        if was_active and not active:
            return int(m["step"])
        was_active = was_active or active
    return None


def _series(run: RunData, key: str, gaps: bool = False) -> tuple[list[int], list[float]]:
    """(plotted steps, values) of a metric. An undefined value (null, e.g. the critic's explained variance on
    a step where every rollout earned the same reward) is left out, or with ``gaps`` kept as NaN so that the
    line breaks there; a step without the key is always left out."""
    xs, ys = [], []
    for m in run.metrics:
        v = m.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            xs.append(run.at(m["step"]))
            ys.append(float(v))
        elif gaps and key in m and v is None:
            xs.append(run.at(m["step"]))
            ys.append(float("nan"))
    return xs, ys


def build_figures(runs: Sequence[RunData]) -> dict[str, Any]:
    """The report's matplotlib figures by file name (not yet saved). Every figure: integer step axis,
    labelled y axis, the guidance switch of each run as a dotted vertical line, exactly one legend;
    rates (coverage, negative rate) in percent, as in the tables."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figures: dict[str, Any] = {}

    def finish(fig, axes, title: str | None = None) -> None:
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
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout(rect=(0, 0.12 if len(axes) > 1 and handles else 0, 1, 1))

    def figure(name: str, title: str, ylabel: str, draw) -> None:
        fig, ax = plt.subplots(figsize=(7, 4))
        for i, run in enumerate(runs):
            draw(ax, run, colors[i % len(colors)])
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        finish(fig, [ax])
        figures[name] = fig

    def rewards(ax, run, c):
        ax.plot(*_series(run, "reward/natural_mean"), color=c, label=f"{run.label} natural")
        xs, ys = _series(run, "reward/privileged_mean")
        if xs:
            ax.plot(xs, ys, color=c, linestyle="--", label=f"{run.label} privileged")

    def delta_r(ax, run, c):
        xs, ys = _series(run, "guidance/delta_r")
        if xs:
            ax.plot(xs, ys, color=c, marker=".", label=run.label)

    def retention(ax, run, c):
        xs, ys = _series(run, "guidance/privileged_rollouts")
        if xs and any(ys):
            ax.plot(xs, ys, color=c, linestyle="--", label=f"{run.label} privileged rollouts (total)")
        xs, ys = _series(run, "guidance/retained")
        if xs:
            ax.plot(xs, ys, color=c, marker=".", label=f"{run.label} retained (A_ref > 0)")

    def single(key):
        def draw(ax, run, c):
            xs, ys = _series(run, key)
            if xs:
                ax.plot(xs, ys, color=c, label=run.label)
        return draw

    figure("rewards.png", "Mean rubric reward: natural (solid) vs privileged (dashed)", "mean reward (eq. 3)", rewards)
    figure("delta_r.png", "Delta_r = mean r_priv - mean r_nat (eq. 13)", "Delta_r (reward)", delta_r)
    figure("entropy.png", "Policy entropy (sampled-token estimate)", "entropy (nats / token)", single("policy/entropy"))
    figure("retention.png", "Guided trajectories per step: retained (eq. 8) of all privileged rollouts",
           "responses per step", retention)

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
    finish(fig, list(axes))
    figures["eval.png"] = fig
    return figures


def write_plots(runs: Sequence[RunData], out_dir: Path, build=build_figures) -> list[Path]:
    """Save the figures of ``build(runs)`` (file name -> figure) into ``out_dir``; returns their paths."""
    import matplotlib.pyplot as plt

    out: list[Path] = []
    for name, fig in build(runs).items():
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        out.append(out_dir / name)
    return out


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
    from rise_nemo.reports.reasoning import (
        is_reasoning_run,
        reasoning_markdown,
        write_reasoning_plots,
    )

    if all(is_reasoning_run(r) for r in runs):  # verifier-scored reasoning runs: pass@k plots (docs/DESIGN.md §7)
        plots = write_reasoning_plots(runs, out)
        text = reasoning_markdown(runs, plots)
    else:
        plots = write_plots(runs, out)
        text = markdown(runs, plots)
    path = out / "report.md"
    path.write_text(text)
    return path
