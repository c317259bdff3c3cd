"""Assemble a run from a validated recipe: backend, judge, prompts -> Trainer (used by the CLI and bench).

``build_trainer`` checks everything a user can get wrong BEFORE the warm start or any model build, each
failure a one-line ``UserError``: the run directory (not a file; not in use by another trainer — the
lock is taken here and held by the Trainer; a resume only under the same config), the method's entry
point, what its step needs (``TrainingStep.check``: the verifier's extra, the reward model, ...), the data
files, the backend's config block and extras, the judge's config, and every judge URL (probed, bounded).
Only then are the backend built and a fresh run warm-started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rise_nemo.errors import UserError
from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.data import check_tokenizer_covers, load_prompts_checked, warm_start_policy
from rise_nemo.loop.rundir import RunDirLock, check_resume, check_run_dir_path
from rise_nemo.loop.signals import interrupt_setup
from rise_nemo.loop.trainer import Trainer, resolve_run_dir  # imports the steps, which bind to the registry
from rise_nemo.methods.registry import Method, MethodRecipeError, get_method


def runnable_method(cfg: Any) -> Method:
    """The recipe's method, which must have a training step here (`opd` runs on NeMo-RL's distillation path) and
    data of the kind it trains on (``data.source``): a one-line UserError naming the key otherwise. What else the
    recipe pairs it with was checked when the config was loaded (``Method.check_recipe``)."""
    method = get_method(str(cfg.method))
    try:
        method.training_step()
        method.check_data_source(cfg)
    except MethodRecipeError as exc:
        raise UserError(f"config key {exc.key!r}: {exc}") from None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return method


def check_run(cfg: Any) -> Method:
    """The checks of a run that need no data and no model: its method (``runnable_method``), what the method's
    step needs (``TrainingStep.check``: the verifier's extra, the code sandbox, the reward model's path, a real
    model for real text) and the backend's block and extras. ``build_trainer`` runs them first; a pipeline runs
    them for every stage before its first stage trains. Returns the method."""
    method = runnable_method(cfg)
    method.training_step().check(method, cfg)
    check_backend(cfg)
    return method


def check_backend(cfg: Any) -> None:
    """The backend's own config block and the extras it imports, without building anything."""
    from rise_nemo.backends import require_backend_extras

    require_backend_extras(str(cfg.backend))
    if cfg.backend == "local":
        from rise_nemo.backends.local.config import parse_local_config

        try:
            parse_local_config(cfg.local)
        except ValueError as exc:
            raise UserError(f"config block 'local': {exc}") from None


def build_trainer(cfg: Any, run_dir: str | Path | None = None, stop_after: int | None = None,
                  allow_config_change: bool = False, env_sources: Mapping[str, str] | None = None,
                  init_from: str | Path | None = None) -> Trainer:
    """Checks (module docstring), then prompts, judge, backend and warm start -> a Trainer holding the
    run directory's lock. ``env_sources`` (dotted key -> environment variable, from ``load_config``)
    lets a missing data file name the variable that set its path. ``init_from``: a fresh run starts from
    this checkpoint's policy weights instead of the warm start (a pipeline's next stage, pipeline.py)."""
    run_dir = Path(run_dir) if run_dir is not None else resolve_run_dir(cfg)
    if stop_after is not None and stop_after < 1:
        raise UserError(f"--stop-after must be >= 1, got {stop_after}")
    check_run_dir_path(run_dir)
    existed = run_dir.exists()
    with interrupt_setup():  # a stop signal during set-up cleans up below instead of killing the process
        lock = RunDirLock(run_dir).acquire()
        try:
            changes = check_resume(run_dir, cfg, allow_config_change)
            # The method's step checks and builds what the method needs (rise_nemo.methods.registry.TrainingStep).
            method = check_run(cfg)  # extras, reward model, real model, backend block: before any data is read
            step = method.training_step()
            train_prompts, eval_prompts = load_prompts_checked(cfg, env_sources, method)
            step.check_data(method, cfg, train_prompts)  # e.g. RRL: rrl.granularity can cut the data
            judge = step.build_judge(method, cfg)  # the rubric or reference judge, probed before any model is built
            from rise_nemo.backends import build_backend

            # The checkpoint the Trainer resumes from (Trainer.resume: the latest); the nemo backend is built from it.
            latest = ckpt.latest_checkpoint(run_dir)
            policy, generator = build_backend(cfg, checkpoint=latest, train_prompts=train_prompts)
            check_tokenizer_covers(cfg, generator, train_prompts)
            if latest is None:
                if init_from is not None:
                    ckpt.init_policy_from(policy, Path(init_from))
                else:
                    warm_start_policy(cfg, policy, generator, progress=bool(cfg.train.progress))
            parts = step.build_parts(method, cfg, policy, latest)  # verifier, critic, reward model
        except BaseException:
            lock.release()
            if not existed and run_dir.is_dir() and [p.name for p in run_dir.iterdir()] == [".lock"]:
                (run_dir / ".lock").unlink()
                run_dir.rmdir()  # a refused or interrupted run leaves nothing behind
            raise
    return Trainer(cfg, policy, generator, judge, train_prompts, eval_prompts, run_dir=run_dir,
                   stop_after=stop_after, lock=lock, config_changes=changes, method=method, **parts)


@dataclass
class EvalModel:
    """The policy an evaluation samples from (``load_eval_model``)."""

    policy: Any
    generator: Any
    step: int  # the checkpoint's step; 0 = the recipe's initial policy
    checkpoint: Path | None  # the checkpoint loaded; None = the initial policy
    train_prompts: Any
    eval_prompts: Any
    checked: Any = None  # what ``before_build`` returned (e.g. the probed judge)


def load_eval_model(cfg: Any, run_dir: Path | None, checkpoint: str | None,
                    env_sources: Mapping[str, str] | None = None,
                    before_build: Callable[[Any], Any] | None = None, method: Method | None = None) -> EvalModel:
    """The model `rise-nemo eval` and `eval --suite` evaluate: ``run_dir``'s checkpoint (its latest, or the one
    ``checkpoint`` names), else the recipe's initial policy (the warm-started model on the embedded tasks, as a
    fresh training run starts). Everything a user can get wrong is checked before the backend is built:
    checkpoint, data, backend, then ``before_build(eval_prompts)`` (the caller's own checks: a judge probe).
    ``method``: the recipe's method as the caller resolved it (default: the one ``cfg.method`` names).
    The backend gets the recipe's training set, as in training: the nemo backend builds NeMo-RL's setup
    (dataloader included) from it, and a backend that loads weights only when its model is built (nemo) is
    built from the checkpoint."""
    layout = ckpt.checkpoint_layout(cfg)
    path = ckpt.resolve_checkpoint(run_dir, checkpoint, layout) if run_dir is not None else None
    train_prompts, eval_prompts = load_prompts_checked(cfg, env_sources, method)
    check_backend(cfg)
    checked = before_build(eval_prompts) if before_build is not None else None
    from rise_nemo.backends import build_backend

    policy, generator = build_backend(cfg, checkpoint=path, train_prompts=train_prompts)
    step = layout.load(path, policy) if path is not None else 0
    if step == 0:
        warm_start_policy(cfg, policy, generator, progress=bool(cfg.train.progress))
    return EvalModel(policy, generator, step, path, train_prompts, eval_prompts, checked)
