"""Assemble a run from a validated recipe: backend, judge, prompts -> Trainer (used by the CLI and bench)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rise_nemo.backends import build_backend
from rise_nemo.judges import build_judge
from rise_nemo.orchestration import checkpoint as ckpt
from rise_nemo.orchestration.data import load_prompts, warm_start_policy
from rise_nemo.orchestration.trainer import Trainer, resolve_run_dir


def build_trainer(cfg: Any, run_dir: str | Path | None = None, stop_after: int | None = None) -> Trainer:
    """Prompts, backend and judge for ``cfg``. A fresh run on the persistent task is warm-started first;
    a run with a checkpoint skips that (the checkpoint holds the weights)."""
    run_dir = Path(run_dir) if run_dir is not None else resolve_run_dir(cfg)
    train_prompts, eval_prompts = load_prompts(cfg)
    policy, generator = build_backend(cfg)
    if ckpt.latest_checkpoint(run_dir) is None:
        warm_start_policy(cfg, policy, generator, progress=bool(cfg.train.progress))
    judge = build_judge(cfg.judge)
    return Trainer(cfg, policy, generator, judge, train_prompts, eval_prompts, run_dir=run_dir, stop_after=stop_after)
