"""Assemble a run from a validated recipe: backend, judge, prompts -> Trainer (used by the CLI and bench)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rise_nemo.backends import build_backend
from rise_nemo.judges import build_judge
from rise_nemo.orchestration.data import load_prompts
from rise_nemo.orchestration.trainer import Trainer


def build_trainer(cfg: Any, run_dir: str | Path | None = None, stop_after: int | None = None) -> Trainer:
    train_prompts, eval_prompts = load_prompts(cfg)
    policy, generator = build_backend(cfg)
    judge = build_judge(cfg.judge)
    return Trainer(cfg, policy, generator, judge, train_prompts, eval_prompts, run_dir=run_dir, stop_after=stop_after)
