"""Assemble a run from a validated recipe: backend, judge, prompts -> Trainer (used by the CLI and bench)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rise_nemo.backends import build_backend, build_critic
from rise_nemo.judges import build_judge
from rise_nemo.methods import get_method
from rise_nemo.orchestration import checkpoint as ckpt
from rise_nemo.orchestration.data import load_prompts, reasoning_tools, warm_start_policy
from rise_nemo.orchestration.trainer import Trainer, resolve_run_dir


def build_trainer(cfg: Any, run_dir: str | Path | None = None, stop_after: int | None = None) -> Trainer:
    """Prompts, backend and judge for ``cfg``. A fresh run on the persistent task is warm-started first;
    a run with a checkpoint skips that (the checkpoint holds the weights)."""
    run_dir = Path(run_dir) if run_dir is not None else resolve_run_dir(cfg)
    train_prompts, eval_prompts = load_prompts(cfg)
    policy, generator = build_backend(cfg)
    if ckpt.latest_checkpoint(run_dir) is None:
        warm_start_policy(cfg, policy, generator, progress=bool(cfg.train.progress))
    method = get_method(str(cfg.method))
    if method.family == "reasoning":
        verifier, step_accuracy = reasoning_tools(cfg)
        # The critic copies the policy's body AFTER the warm start (a resumed run overwrites it from the checkpoint).
        critic = build_critic(cfg, policy) if method.critic else None
        return Trainer(cfg, policy, generator, None, train_prompts, eval_prompts, run_dir=run_dir,
                       stop_after=stop_after, critic=critic, verifier=verifier, step_accuracy=step_accuracy)
    judge = build_judge(cfg.judge)
    return Trainer(cfg, policy, generator, judge, train_prompts, eval_prompts, run_dir=run_dir, stop_after=stop_after)
