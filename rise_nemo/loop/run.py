"""Assemble a run from a validated recipe: backend, judge, prompts -> Trainer (used by the CLI and bench).

``build_trainer`` checks everything a user can get wrong BEFORE the warm start or any model build, each
failure a one-line ``UserError``: the run directory (not a file; not in use by another trainer — the
lock is taken here and held by the Trainer; a resume only under the same config), the method's entry
point, the data files, the backend's config block and extras, the judge's config, and every judge URL
(probed, bounded). Only then are the backend built and a fresh run warm-started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rise_nemo.errors import UserError, require_extra
from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.data import (
    build_reward_model,
    check_real_model,
    check_reward_model,
    check_tokenizer_covers,
    load_prompts_checked,
    needs_reward_model,
    reasoning_tools,
    require_verifier_extras,
    warm_start_policy,
)
from rise_nemo.loop.rundir import RunDirLock, check_resume, check_run_dir_path
from rise_nemo.loop.signals import interrupt_setup
from rise_nemo.loop.trainer import Trainer, resolve_run_dir  # imports the registered behaviour
from rise_nemo.methods import get_method


def check_method(cfg: Any) -> None:
    """The method is registered and has a training step here (rise_nemo.methods); `opd` runs elsewhere. A
    recipe's ``reward.scorer`` must be a registered scorer, for a step that scores rollouts with one."""
    from rise_nemo.methods import SCORERS

    try:
        step = get_method(str(cfg.method)).training_step()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    scorer = cfg.reward.scorer
    if scorer is None:
        return
    if scorer not in SCORERS:
        raise UserError(f"config key 'reward.scorer': unknown scorer {scorer!r}; registered: {sorted(SCORERS.names())}")
    if not getattr(step, "scores_rollouts", False):
        raise UserError(f"config key 'reward.scorer': method {cfg.method!r} does not score rollouts with a "
                        "registered scorer (the rubric methods use their rubric judge, sft samples nothing); "
                        "remove the key")


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


def build_checked_judge(cfg: Any, probe: bool = True, reference: bool = False) -> Any:
    """``build_judge`` with its config errors as one-line ``UserError``s; HTTP judges are probed.
    ``reference``: ExpRL's reference judge (rise_nemo.judges.reference) from the same ``judge:`` block."""
    from rise_nemo.judges import build_judge
    from rise_nemo.judges.reference import build_reference_judge

    judge_cfg = cfg.judge
    kind = judge_cfg.get("type") if isinstance(judge_cfg, Mapping) else None
    judge_errors: tuple[type[Exception], ...] = (ValueError,)
    if kind == "http":  # only the LLM judge needs the 'judge' extra (aiohttp): the rule judge runs without it
        require_extra("judge", "aiohttp", what="the LLM judge (judge.type: http)")
        if judge_cfg.get("ray_actor"):
            require_extra("judge", "ray", what="the judge's Ray actor (judge.ray_actor: true)")
        from rise_nemo.judges.client import JudgeError

        judge_errors += (JudgeError,)
    try:
        if kind == "http":  # validate the block and the key's variable, then probe, before any actor starts
            from rise_nemo.judges.http import HttpJudgeConfig

            HttpJudgeConfig.from_mapping(judge_cfg).api_key()
            if probe:
                from rise_nemo.judges.probe import probe_judge_urls

                probe_judge_urls(judge_cfg)
        return build_reference_judge(judge_cfg) if reference else build_judge(judge_cfg)
    except judge_errors as exc:
        if isinstance(exc, UserError):
            raise
        message = str(exc)
        raise UserError(message if "judge" in message else f"config block 'judge': {message}") from None


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
            check_method(cfg)
            method = get_method(str(cfg.method))
            require_verifier_extras(cfg)
            if method.verifier:
                check_reward_model(cfg)
            check_real_model(cfg)
            train_prompts, eval_prompts = load_prompts_checked(cfg, env_sources)
            method.hooks_type().check_data(cfg, train_prompts)  # e.g. RRL: rrl.granularity can cut the data
            check_backend(cfg)
            # The judge the method names (rise_nemo.methods): the rubric judge, ExpRL's reference judge, or none
            # (verifier-scored methods); checked (and HTTP judges probed) before any model is built.
            judge = build_checked_judge(cfg, reference=method.judge == "reference") if method.judge else None
            from rise_nemo.backends import build_backend, build_critic

            # The checkpoint the Trainer resumes from (Trainer.resume: the latest); the nemo backend is built from it.
            latest = ckpt.latest_checkpoint(run_dir)
            policy, generator = build_backend(cfg, checkpoint=latest, train_prompts=train_prompts)
            check_tokenizer_covers(cfg, generator, train_prompts)
            if latest is None:
                if init_from is not None:
                    ckpt.init_policy_from(policy, Path(init_from))
                else:
                    warm_start_policy(cfg, policy, generator, progress=bool(cfg.train.progress))
            reasoning: dict[str, Any] = {}
            # The reward model (scorer ``reward_model`` / HH-RLHF's verifier), built once for both.
            reward_model = build_reward_model(cfg) if method.verifier and needs_reward_model(cfg) else None
            if method.verifier:
                verifier, step_accuracy = reasoning_tools(cfg, reward_model=reward_model)
                # The critic copies the policy's body AFTER the warm start (a resume overwrites it from the checkpoint).
                critic = build_critic(cfg, policy, checkpoint=latest) if method.critic else None
                reasoning = {"critic": critic, "verifier": verifier, "step_accuracy": step_accuracy,
                             "reward_model": reward_model}
        except BaseException:
            lock.release()
            if not existed and run_dir.is_dir() and [p.name for p in run_dir.iterdir()] == [".lock"]:
                (run_dir / ".lock").unlink()
                run_dir.rmdir()  # a refused or interrupted run leaves nothing behind
            raise
    return Trainer(cfg, policy, generator, judge, train_prompts, eval_prompts, run_dir=run_dir,
                   stop_after=stop_after, lock=lock, config_changes=changes, **reasoning)


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
                    before_build: Callable[[Any], Any] | None = None) -> EvalModel:
    """The model `rise-nemo eval` and `eval --suite` evaluate: ``run_dir``'s checkpoint (its latest, or the one
    ``checkpoint`` names), else the recipe's initial policy (the warm-started model on the embedded tasks, as a
    fresh training run starts). Everything a user can get wrong is checked before the backend is built:
    checkpoint, data, backend, then ``before_build(eval_prompts)`` (the caller's own checks: a judge probe).
    The backend gets the recipe's training set, as in training: the nemo backend builds NeMo-RL's setup
    (dataloader included) from it, and a backend that loads weights only when its model is built (nemo) is
    built from the checkpoint."""
    layout = ckpt.checkpoint_layout(cfg)
    path = ckpt.resolve_checkpoint(run_dir, checkpoint, layout) if run_dir is not None else None
    train_prompts, eval_prompts = load_prompts_checked(cfg, env_sources)
    check_backend(cfg)
    checked = before_build(eval_prompts) if before_build is not None else None
    from rise_nemo.backends import build_backend

    policy, generator = build_backend(cfg, checkpoint=path, train_prompts=train_prompts)
    step = layout.load(path, policy) if path is not None else 0
    if step == 0:
        warm_start_policy(cfg, policy, generator, progress=bool(cfg.train.progress))
    return EvalModel(policy, generator, step, path, train_prompts, eval_prompts, checked)
