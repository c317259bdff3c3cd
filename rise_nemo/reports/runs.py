"""A run directory as the reports read it (``RunData``: metrics, evaluations, config, its place in a pipeline), a
metric's series over steps, and saving a report's figures."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


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


def series(run: RunData, key: str, gaps: bool = False) -> tuple[list[int], list[float]]:
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


def write_plots(runs: Sequence[RunData], out_dir: Path, build: Callable[[Sequence[RunData]], dict[str, Any]]
                ) -> list[Path]:
    """Save the figures of ``build(runs)`` (file name -> figure) into ``out_dir``; returns their paths."""
    import matplotlib.pyplot as plt

    out: list[Path] = []
    for name, fig in build(runs).items():
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        out.append(out_dir / name)
    return out
