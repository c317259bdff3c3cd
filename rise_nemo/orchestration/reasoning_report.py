"""Report plots and Markdown for reasoning runs (evaluations of rise_nemo.orchestration.reasoning_eval).

Plots: ``pass_at_k.png`` pass@k vs k at the last evaluation (one panel per difficulty level shown, one line
per run, the first evaluation dashed); ``pass_vs_step.png`` pass@1 and pass@n vs training step per run
(all held-out problems pooled by level mean); ``reasoning_train.png`` training reward and the critic's
explained variance.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_LEVEL_PANELS = 4


def is_reasoning_run(run: Any) -> bool:
    return any(e.get("kind") == "reasoning" for e in run.evals)


def _level_mean(ev: dict[str, Any], k: str) -> float | None:
    vals = [lv["pass_at_k"].get(k) for lv in ev["levels"].values()]
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def _shown_levels(runs: Sequence[Any]) -> list[str]:
    levels = sorted({lv for r in runs for e in r.evals for lv in e.get("levels", {})}, key=int)
    if len(levels) <= MAX_LEVEL_PANELS:
        return levels
    idx = [round(i * (len(levels) - 1) / (MAX_LEVEL_PANELS - 1)) for i in range(MAX_LEVEL_PANELS)]
    return [levels[i] for i in idx]


def write_reasoning_plots(runs: Sequence[Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rise_nemo.orchestration.report import _series

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    out: list[Path] = []
    levels = _shown_levels(runs)
    fig, axes = plt.subplots(1, max(1, len(levels)), figsize=(3.2 * max(1, len(levels)), 3.4), squeeze=False)
    for ax, level in zip(axes[0], levels):
        for i, run in enumerate(runs):
            evs = [e for e in run.evals if level in e.get("levels", {})]
            for ev, style in ((evs[0], "--"), (evs[-1], "-")) if evs else ():
                pk = ev["levels"][level]["pass_at_k"]
                pts = [(int(k), v) for k, v in pk.items() if v is not None]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colors[i % len(colors)], marker=".",
                        label=f"{run.label} @{ev['step']}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"level {level}", fontsize=9)
        ax.set_xlabel("k")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("pass@k")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=6)
    fig.suptitle("pass@k vs k (first evaluation dashed, last solid)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "pass_at_k.png", dpi=110)
    plt.close(fig)
    out.append(out_dir / "pass_at_k.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        evs = [e for e in run.evals if e.get("kind") == "reasoning"]
        if not evs:
            continue
        n = str(evs[-1]["samples_per_problem"])
        for k, style in (("1", "-"), (n, ":")):
            pts = [(e["step"], _level_mean(e, k)) for e in evs]
            pts = [p for p in pts if p[1] is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=c, marker="o", label=f"{run.label} pass@{k}")
    ax.set_title("held-out pass@1 (solid) and pass@n (dotted) vs step, mean over levels")
    ax.set_xlabel("step")
    ax.set_ylabel("pass@k")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "pass_vs_step.png", dpi=110)
    plt.close(fig)
    out.append(out_dir / "pass_vs_step.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        for ax, key in zip(axes, ("reward/mean", "critic/explained_variance")):
            xs, ys = _series(run, key)
            if xs:
                ax.plot(xs, ys, color=c, label=run.label)
    for ax, title in zip(axes, ("training reward (verifier)", "critic explained variance")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out_dir / "reasoning_train.png", dpi=110)
    plt.close(fig)
    out.append(out_dir / "reasoning_train.png")
    return out


def reasoning_markdown(runs: Sequence[Any], plots: Sequence[Path]) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    lines = ["# rise_nemo reasoning report", "", "## Held-out pass@k per level (first -> last evaluation)", ""]
    for run in runs:
        evs = [e for e in run.evals if e.get("kind") == "reasoning"]
        if not evs:
            continue
        first, last = evs[0], evs[-1]
        ks = list(next(iter(last["levels"].values()))["pass_at_k"])
        lines += [f"### {run.label} (method {run.method}, steps {first['step']} -> {last['step']})", "",
                  "| level | " + " | ".join(f"pass@{k}" for k in ks) + " | step acc |",
                  "|---|" + "---|" * (len(ks) + 1)]
        for level, lv in last["levels"].items():
            before = first["levels"].get(level, {}).get("pass_at_k", {})
            cells = [f"{pct(before.get(k))} -> {pct(lv['pass_at_k'][k])}" for k in ks]
            lines.append(f"| {level} | " + " | ".join(cells) + f" | {pct(lv.get('step_accuracy'))} |")
        lines.append("")
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    return "\n".join(lines)
