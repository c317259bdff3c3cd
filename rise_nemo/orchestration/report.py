"""Run reports: PNG plots and a Markdown summary comparing one or more run directories.

Plots (one line per run): ``rewards.png`` natural (solid) vs privileged (dashed) mean reward;
``delta_r.png`` Delta_r (eq. 13) with the guidance switch marked; ``entropy.png`` policy entropy;
``retention.png`` retained guided trajectories per step (eq. 8); ``eval.png`` guidance-free eval reward,
persistent coverage and negative rate. ``report.md`` holds the final-eval table and a per-criterion
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
    return RunData(path, label, method, seed, metrics, evals,
                   switch_step=_switch_step(metrics))


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


def _series(run: RunData, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for m in run.metrics:
        v = m.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool):
            xs.append(int(m["step"]))
            ys.append(float(v))
    return xs, ys


def write_plots(runs: Sequence[RunData], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out: list[Path] = []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def figure(name: str, title: str, ylabel: str, draw) -> None:
        fig, ax = plt.subplots(figsize=(7, 4))
        for i, run in enumerate(runs):
            draw(ax, run, colors[i % len(colors)])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        out.append(out_dir / name)

    def rewards(ax, run, c):
        ax.plot(*_series(run, "reward/natural_mean"), color=c, label=f"{run.label} natural")
        xs, ys = _series(run, "reward/privileged_mean")
        if xs:
            ax.plot(xs, ys, color=c, linestyle="--", label=f"{run.label} privileged")

    def delta_r(ax, run, c):
        xs, ys = _series(run, "guidance/delta_r")
        if xs:
            ax.plot(xs, ys, color=c, marker=".", label=run.label)
        if run.switch_step is not None:
            ax.axvline(run.switch_step, color=c, linestyle=":", label=f"{run.label} switch @ {run.switch_step}")

    def single(key):
        def draw(ax, run, c):
            xs, ys = _series(run, key)
            if xs:
                ax.plot(xs, ys, color=c, label=run.label)
        return draw

    figure("rewards.png", "Mean rubric reward: natural (solid) vs privileged (dashed)", "reward", rewards)
    figure("delta_r.png", "Delta_r = mean r_priv - mean r_nat (eq. 13), switch dotted", "Delta_r", delta_r)
    figure("entropy.png", "Policy entropy (sampled-token estimate)", "nats / token", single("policy/entropy"))
    figure("retention.png", "Retained guided trajectories per step (A_ref > 0, eq. 8)", "count",
           single("guidance/retained"))

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        steps = [e["step"] for e in run.evals]
        for ax, key in zip(axes, ("reward_mean", "persistent_coverage", "negative_rate")):
            ys = [e.get(key) for e in run.evals]
            pts = [(s, y) for s, y in zip(steps, ys) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=c, marker="o", label=run.label)
    for ax, title in zip(axes, ("eval reward", "persistent coverage", "negative-criterion rate")):
        ax.set_title(f"guidance-free {title}", fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_dir / "eval.png", dpi=110)
    plt.close(fig)
    out.append(out_dir / "eval.png")
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
    runs = [load_run(p) for p in run_dirs]
    if not runs:
        raise ValueError("make_report: no run directory given")
    if out_dir is None:
        out_dir = runs[0].path / "report" if len(runs) == 1 else runs[0].path.parent / "report"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from rise_nemo.orchestration.reasoning_report import (
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
