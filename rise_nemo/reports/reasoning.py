"""Report plots and Markdown for reasoning runs (evaluations of rise_nemo.steps.reasoning_eval).

One colour per *track*: a run, or the stages of a pipeline (ExpRL's Stage I then Stage II,
rise_nemo.loop.pipeline) on one timeline: a later stage's steps follow the earlier stages' and
each stage boundary is a grey dash-dot line on every plot over steps. Step axes have integer ticks; every
legend sits below the axes with one entry per track plus the line styles.

- ``pass_at_k.png``: pass@k vs k on up to four held-out levels, before training (the first evaluation,
  dashed), after each earlier stage of a pipeline (dash-dot) and after training (the last one, solid).
- ``pass_vs_step.png``: held-out pass@1 (solid) and pass@n (dotted) vs step, pooled over each run's
  TRAINING levels only (``data.task.train_levels``; every evaluated level when the run trains on all).
- ``reasoning_train.png``: the training reward in separate panels for the verifier's 0/1 reward and the
  reference judge's normalised score (different scales, never one axis), and the critic's explained
  variance when a run has a critic (undefined steps are gaps).
- ``rrl.png`` (RRL runs): replay-buffer size, replay fraction, solve rate of replayed vs from-scratch
  rollouts, and the step the state search started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rise_nemo.reports.runs import series, write_plots

MAX_LEVEL_PANELS = 4
BOUNDARY = {"color": "0.35", "linestyle": "-.", "linewidth": 1.0}  # a pipeline's stage boundary


def is_reasoning_run(run: Any) -> bool:
    return any(e.get("kind") == "reasoning" for e in run.evals)


def _reasoning_evals(run: Any) -> list[dict[str, Any]]:
    return [e for e in run.evals if e.get("kind") == "reasoning"]


@dataclass
class Track:
    """What one colour stands for: a run, or a pipeline's stages in order."""

    label: str
    stages: list[Any]  # report.RunData, in timeline order

    def boundaries(self) -> list[tuple[int, str]]:
        """(plotted step, stage name) where each stage after the first begins."""
        return [(s.step_offset, s.path.name) for s in self.stages if s.stage_index > 0]


def make_tracks(runs: Sequence[Any]) -> list[Track]:
    """Runs grouped by pipeline (order of first appearance), each pipeline's stages in stage order."""
    groups: dict[Path, list[Any]] = {}
    for run in runs:
        groups.setdefault(run.pipeline if run.pipeline is not None else run.path, []).append(run)
    out = []
    for key, stages in groups.items():
        stages.sort(key=lambda r: r.stage_index)
        label = f"{key.name} (s{stages[0].seed})" if len(stages) > 1 else stages[0].label
        out.append(Track(label, stages))
    return out


def training_levels(run: Any) -> list[int] | None:
    """The levels a run trains on (the embedded task's ``data.task.train_levels``); None = every level."""
    data = run.config.get("data") or {}
    levels = (data.get("task") or {}).get("train_levels") if data.get("source") == "chain_arithmetic" else None
    return sorted(int(x) for x in levels) if levels else None


def levels_name(levels: Sequence[int]) -> str:
    """[6, 7, 8, 9, 10] -> 'L6-10'; [2, 5] -> 'L2,5'."""
    ordered = sorted(levels)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"L{ordered[0]}-{ordered[-1]}" if len(ordered) > 1 else f"L{ordered[0]}"
    return "L" + ",".join(map(str, ordered))


def _run_levels(run: Any, ev: dict[str, Any]) -> list[int]:
    return training_levels(run) or sorted(int(x) for x in ev["levels"])


def _shown_levels(runs: Sequence[Any]) -> list[str]:
    levels = sorted({lv for r in runs for e in r.evals for lv in e.get("levels", {})}, key=int)
    if len(levels) <= MAX_LEVEL_PANELS:
        return levels
    idx = [round(i * (len(levels) - 1) / (MAX_LEVEL_PANELS - 1)) for i in range(MAX_LEVEL_PANELS)]
    return [levels[i] for i in idx]


def _snapshots(track: Track) -> list[tuple[dict[str, Any], str]]:
    """(evaluation, line style) drawn in pass@k vs k: before training (the track's first evaluation, "--"),
    after each earlier stage of a pipeline ("-.") and after training (its last evaluation, "-")."""
    stages = [(s, _reasoning_evals(s)) for s in track.stages]
    stages = [(s, evs) for s, evs in stages if evs]
    if not stages:
        return []
    first, last = stages[0][1][0], stages[-1][1][-1]
    out = [] if first is last else [(first, "--")]
    return out + [(evs[-1], "-.") for _, evs in stages[:-1]] + [(last, "-")]


def build_reasoning_figures(runs: Sequence[Any]) -> dict[str, Any]:
    """The reasoning report's matplotlib figures by file name (not yet saved); module docstring."""
    return ReasoningFigures(runs).build()


def key_line(label: str, **style: Any) -> Any:
    """A legend entry: a line style (dark grey unless a colour is given) and what it stands for."""
    from matplotlib.lines import Line2D

    return Line2D([], [], label=label, **{"color": "0.2", **style})


def legend_below(fig: Any, handles: list[Any]) -> None:
    """One legend per figure, outside (below) the axes, whatever the number of runs."""
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(3, len(handles)), fontsize=7, frameon=False)


class ReasoningFigures:
    """The figures of one reasoning report: one colour per track, the tracks drawn on each axes remembered for
    the legends and the pipelines' stage boundaries."""

    def __init__(self, runs: Sequence[Any]):
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt

        self.plt, self.runs = plt, list(runs)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        self.tracks = make_tracks(runs)
        self.color = {id(t): colors[i % len(colors)] for i, t in enumerate(self.tracks)}
        self.on_axes: dict[Any, list[Track]] = {}  # the tracks drawn on each axes

    def build(self) -> dict[str, Any]:
        figures = {"pass_at_k.png": self.pass_at_k(), "pass_vs_step.png": self.pass_vs_step(),
                   "reasoning_train.png": self.training(), "rrl.png": self.rrl()}
        return {name: fig for name, fig in figures.items() if fig is not None}

    def draw(self, ax: Any, track: Track, xs: Any, ys: Any, *fmt: Any, **kw: Any) -> None:
        ax.plot(xs, ys, *fmt, color=self.color[id(track)], **kw)
        if all(t is not track for t in self.on_axes.setdefault(ax, [])):
            self.on_axes[ax].append(track)

    def step_axes(self, axes: Any) -> list[Any]:
        """Integer step ticks; the stage boundaries of the pipelines drawn on each axes. Returns the
        boundaries' legend entry (none when no pipeline is drawn)."""
        from matplotlib.ticker import MaxNLocator

        names: set[str] = set()
        for ax in axes:
            bounds = {x: name for t in self.on_axes.get(ax, []) for x, name in t.boundaries()}
            ax.set_xlabel("step (pipeline stages in order)" if bounds else "step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            for x in sorted(bounds):
                ax.axvline(x, **BOUNDARY)
            names.update(bounds.values())
        return [key_line(f"stage boundary ({', '.join(sorted(names))} starts)", **BOUNDARY)] if names else []

    def track_handles(self, axes: Any, suffix: Any = lambda t: "") -> list[Any]:
        """One legend entry per track drawn on ``axes``, in track order."""
        drawn = {id(t) for ax in axes for t in self.on_axes.get(ax, [])}
        return [key_line(t.label + suffix(t), color=self.color[id(t)], linewidth=2) for t in self.tracks
                if id(t) in drawn]

    def pass_at_k(self) -> Any:
        """pass@k vs k per shown level: before / after each earlier stage / after (None: no level)."""
        from matplotlib.ticker import NullLocator, ScalarFormatter

        levels = _shown_levels(self.runs)
        if not levels:
            return None
        fig, axes = self.plt.subplots(1, len(levels), figsize=(3.2 * len(levels) + 0.4, 4.2), squeeze=False,
                                      layout="constrained")
        used: set[str] = set()
        for ax, level in zip(axes[0], levels):
            ks: set[int] = set()
            for track in self.tracks:
                for ev, style in _snapshots(track):
                    pk = (ev.get("levels", {}).get(level) or {}).get("pass_at_k", {})
                    pts = sorted((int(k), v) for k, v in pk.items() if v is not None)
                    if pts:
                        self.draw(ax, track, [p[0] for p in pts], [p[1] for p in pts], style, marker=".")
                        ks.update(p[0] for p in pts)
                        used.add(style)
            trained = [lv is None or int(level) in lv for lv in (training_levels(r) for r in self.runs)]
            note = " (training level)" if all(trained) else " (not trained on)" if not any(trained) else ""
            ax.set_title(f"level {level}{note}", fontsize=9)
            ax.set_xscale("log", base=2)
            if ks:
                ax.set_xticks(sorted(ks))
                ax.xaxis.set_major_formatter(ScalarFormatter())
                ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel("k")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("held-out pass@k")
        earlier = ", ".join(sorted({s.path.name for t in self.tracks for s in t.stages[:-1]}))
        meaning = {"--": "before training (first evaluation)", "-.": f"after {earlier} (an earlier pipeline stage)",
                   "-": "after training (last evaluation)"}
        legend_below(fig, self.track_handles(axes[0])
                     + [key_line(meaning[st], linestyle=st) for st in meaning if st in used])
        fig.suptitle("held-out pass@k vs k: before (dashed) and after (solid) training", fontsize=10)
        return fig

    def pass_vs_step(self) -> Any:
        """pass@1 / pass@n vs step on each run's training levels."""
        from rise_nemo.steps.reasoning_eval import pooled_pass_at_k

        fig, ax = self.plt.subplots(figsize=(7.5, 4.6), layout="constrained")
        ns, level_text = set(), {}
        for track in self.tracks:
            names = []
            for stage in track.stages:
                evs = _reasoning_evals(stage)
                if not evs:
                    continue
                lv = _run_levels(stage, evs[-1])
                names.append((stage.path.name, levels_name(lv) if training_levels(stage) else f"all levels {levels_name(lv)}"))
                n = int(evs[-1]["samples_per_problem"])
                ns.add(n)
                for k, style in ((1, "-"), (n, ":")):
                    pts = [(stage.at(e["step"]), pooled_pass_at_k(e, lv, k)) for e in evs]
                    pts = [p for p in pts if p[1] is not None]
                    if pts:
                        self.draw(ax, track, [p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3)
            level_text[id(track)] = (names[0][1] if len({t for _, t in names}) == 1 else
                                     ", ".join(f"{s} {t}" for s, t in names)) if names else ""
        shared = set(level_text.values())
        where = f"the training levels {next(iter(shared))}" if len(shared) == 1 else "each run's training levels"
        ax.set_title(f"held-out pass@1 (solid) and pass@n (dotted) on {where}", fontsize=10)
        ax.set_ylabel("pass@k, pooled over the training levels")
        bounds = self.step_axes([ax])
        n_text = f"n = {next(iter(ns))}" if len(ns) == 1 else "n = samples per problem"
        legend_below(fig, self.track_handles([ax], lambda t: "" if len(shared) == 1 else f": {level_text[id(t)]}")
                     + [key_line("pass@1", marker="o", ms=3), key_line(f"pass@n ({n_text})", linestyle=":", marker="o",
                                                                       ms=3)]
                     + bounds)
        return fig

    def training(self) -> Any:
        """Verifier reward and judge score in their own panels; the critic's explained variance (None: nothing)."""
        from rise_nemo.methods.registry import METHODS, ReasoningMethod

        def reward_kind(run: Any) -> str:
            """The run's scorer grades with ExpRL's reference judge (its config's reward.scorer or its method's own)."""
            method = METHODS.get(run.method)
            scorer = method.scorer_for(run.config) if isinstance(method, ReasoningMethod) else None
            return "judge" if scorer is not None and scorer.judge == "reference" else "verifier"

        panels = []  # (key, run filter, title, y label, y limits, gaps)
        for kind, title, ylabel in (
                ("verifier", "training reward: verifier (0/1)", "mean reward (fraction correct)"),
                ("judge", "training reward: reference judge", "mean judge score, (s - 1) / 4 of 1..5")):
            if any(reward_kind(r) == kind and series(r, "reward/mean")[0] for r in self.runs):
                panels.append(("reward/mean", lambda r, k=kind: reward_kind(r) == k, title, ylabel, (-0.03, 1.03), False))
        if any(series(r, "critic/explained_variance")[0] for r in self.runs):
            panels.append(("critic/explained_variance", lambda r: True, "critic explained variance",
                           "1 - Var[R - V] / Var[R] (gaps: undefined)", None, True))
        if not panels:
            return None
        fig, axes = self.plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 0.6, 4.2), squeeze=False,
                                      layout="constrained")
        for ax, (key, keep, title, ylabel, ylim, gaps) in zip(axes[0], panels):
            for track in self.tracks:
                for stage in track.stages:
                    xs, ys = series(stage, key, gaps=gaps) if keep(stage) else ([], [])
                    if xs:
                        self.draw(ax, track, xs, ys, marker="." if len(xs) <= 40 else None)
            ax.set_title(title, fontsize=9)
            ax.set_ylabel(ylabel)
            if ylim:
                ax.set_ylim(*ylim)
        bounds = self.step_axes(axes[0])
        legend_below(fig, self.track_handles(axes[0]) + bounds)
        return fig

    def rrl(self) -> Any:
        """RRL: the replay buffer, how many rollouts replay, and what they solve vs rollouts from scratch."""
        if not any(series(r, "rrl/buffer_size")[0] for r in self.runs):
            return None
        fig, axes = self.plt.subplots(1, 3, figsize=(13, 4.2), layout="constrained")
        started = False
        for track in self.tracks:
            c = self.color[id(track)]
            for stage in track.stages:
                for ax, key, style in ((axes[0], "rrl/buffer_size", "-"), (axes[1], "rrl/replay_fraction", "-"),
                                       (axes[2], "rrl/solve_rate_replayed", "-"), (axes[2], "rrl/solve_rate_scratch", "--")):
                    xs, ys = series(stage, key)
                    if xs:
                        self.draw(ax, track, xs, ys, style, marker=".")
                first = next((stage.at(m["step"]) for m in stage.metrics if m.get("rrl/stabilised")), None)
                if first is not None and series(stage, "rrl/buffer_size")[0]:
                    started = True
                    for ax in axes:
                        ax.axvline(first, color=c, linestyle=":", linewidth=1.2)
        for ax, title, ylabel in zip(axes, ("replay buffer", "rollouts continuing a replayed state",
                                            "solve rate (verifier)"),
                                     ("states in the buffer", "fraction of the step's rollouts", "fraction correct")):
            ax.set_title(title, fontsize=9)
            ax.set_ylabel(ylabel)
        axes[1].set_ylim(-0.03, 1.03)
        axes[2].set_ylim(-0.03, 1.03)
        bounds = self.step_axes(axes)
        legend_below(fig, self.track_handles(axes) + [key_line("solve rate from replayed states"),
                                                       key_line("solve rate from scratch", linestyle="--")]
                     + ([key_line("critic stabilised: state search starts", linestyle=":")] if started else [])
                     + bounds)
        return fig


def write_reasoning_plots(runs: Sequence[Any], out_dir: Path) -> list[Path]:
    return write_plots(runs, out_dir, build=build_reasoning_figures)


def reasoning_markdown(runs: Sequence[Any], plots: Sequence[Path]) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    lines = ["# rise_nemo reasoning report", "", "## Held-out pass@k per level (first -> last evaluation)", ""]
    for run in runs:
        evs = _reasoning_evals(run)
        if not evs:
            continue
        first, last = evs[0], evs[-1]
        ks = list(next(iter(last["levels"].values()))["pass_at_k"])
        where = (f"; stage {run.stage_index + 1} of {run.pipeline.name}, plotted from step {run.step_offset}"
                 if run.pipeline is not None else "")
        train = training_levels(run)
        lines += [f"### {run.label} (method {run.method}, steps {first['step']} -> {last['step']}, training levels "
                  f"{levels_name(train) if train else 'all'}{where})", "",
                  "| level | " + " | ".join(f"pass@{k}" for k in ks) + " | step acc |",
                  "|---|" + "---|" * (len(ks) + 1)]
        for level, lv in last["levels"].items():
            before = first["levels"].get(level, {}).get("pass_at_k", {})
            cells = [f"{pct(before.get(k))} -> {pct(lv['pass_at_k'][k])}" for k in ks]
            lines.append(f"| {level} | " + " | ".join(cells) + f" | {pct(lv.get('step_accuracy'))} |")
        lines.append("")
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    return "\n".join(lines)
