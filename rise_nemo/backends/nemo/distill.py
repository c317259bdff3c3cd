"""On-policy distillation baseline (recipes/opd_*.yaml) on NeMo-RL's distillation path.

    rise-nemo distill --config recipes/opd_14b_teacher32b.yaml [key=value ...]   (rise_nemo.commands.distill)

The student samples with vLLM, the teacher scores the student's tokens (top-k logits), and the student
minimises NeMo-RL's DistillationLossFn; this is NeMo-RL's own ``distillation_train`` — rise_nemo supplies
the rubric prompts (the recipe's data: block) and the rubric judge as NeMo-RL's environment, so NeMo-RL's
validation reports the rubric reward of the student. NeMo-RL's checkpoint manager saves the student
(weights + optimizer) under ``<run dir>/nemo_rl_checkpoints/step_N/`` every ``train.checkpoint_every`` steps
and at the end, keeping the newest ``train.keep_checkpoints`` (``config.checkpointing_values``); a rerun
resumes from the newest. The recipe is written to ``<run dir>/config.yaml``, so

    rise-nemo eval runs/opd_14b_teacher32b [--checkpoint step_50]

scores the student of a checkpoint (newest by default) on the held-out rubric prompts, as for the RL runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rise_nemo.backends.nemo import (
    NemoConfigError,
    check_recipe,
    encode_chat,
    nemo_dataset,
    plain_recipe,
    register_rubric_environment,
    run_dir_of,
)
from rise_nemo.backends.nemo.checkpoints import latest_nemo_rl_checkpoint, nemo_rl_step
from rise_nemo.backends.nemo.config import NEMO_DISTILLATION, algorithm, build_master_config


def distillation_recipe(cfg: Any) -> dict[str, Any]:
    """The plain recipe of a validated OPD config (``NemoConfigError`` unless ``nemo.algorithm: distillation``)."""
    recipe = plain_recipe(cfg)
    check_recipe(recipe)
    if algorithm(recipe) != NEMO_DISTILLATION:
        raise NemoConfigError("nemo.algorithm must be 'distillation' for `rise-nemo distill`")
    return recipe


def resume_step(run_dir: str | Path) -> int:
    """The step a rerun of the distillation in ``run_dir`` resumes after (NeMo-RL's distillation.setup
    resumes from the newest nemo_rl_checkpoints/step_N); 0 for a fresh run."""
    latest = latest_nemo_rl_checkpoint(run_dir)
    return nemo_rl_step(latest) if latest is not None else 0


def setup_distillation(cfg: Any, train_prompts: Sequence[Any], eval_prompts: Sequence[Any]) -> dict[str, Any]:
    """NeMo-RL's distillation setup for a validated OPD recipe: the student, the teacher, vLLM and the rest of
    what ``distillation_train`` takes, by name (``student``, ``teacher``, ``generation``, ``nemo_gym``, ``dataloader``,
    ``val_dataloader``, ``loss_fn``, ``logger``, ``checkpointer``, ``state``, ``master``, ``tokenizer``,
    ``env``). NeMo-RL builds one colocated cluster for student, vLLM and teacher (distillation.py:320-336)."""
    recipe = distillation_recipe(cfg)

    from nemo_rl.algorithms import distillation
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.distributed.virtual_cluster import init_ray
    from nemo_rl.environments.utils import create_env
    from nemo_rl.models.generation import configure_generation_config

    from rise_nemo.backends.nemo import watch_placement
    from rise_nemo.backends.nemo.environment import TASK_NAME, rubric_datum
    from rise_nemo.backends.nemo.placement import layout_line, placement_errors

    master = distillation.MasterConfig(**build_master_config(recipe, run_dir_of(recipe)))
    init_ray()
    watch_placement(recipe)
    tokenizer = get_tokenizer(master.policy["tokenizer"])
    master.policy["generation"] = configure_generation_config(master.policy["generation"], tokenizer)
    encode = partial(encode_chat, tokenizer, chat_template_kwargs=master.policy["tokenizer"].get("chat_template_kwargs") or {})
    train = nemo_dataset(list(train_prompts), encode, int(master.distillation["num_prompts_per_step"]))
    val = [rubric_datum(p, encode, i) for i, p in enumerate(eval_prompts)] or None

    register_rubric_environment(TASK_NAME)
    judge_cfg = {**recipe["judge"], "reward_clip_min": recipe.get("reward", {}).get("clip_min")}
    env = create_env(TASK_NAME, judge_cfg)
    with placement_errors(layout_line(recipe)):
        out = distillation.setup(master, tokenizer, train, val)
    names = ("student", "teacher", "generation", "nemo_gym", "dataloader", "val_dataloader", "loss_fn", "logger",
             "checkpointer", "state", "master")
    return {**dict(zip(names, out)), "tokenizer": tokenizer, "env": {TASK_NAME: env}}


def run_distillation(cfg: Any, train_prompts: Sequence[Any], eval_prompts: Sequence[Any]) -> int:
    """NeMo-RL's distillation setup + ``distillation_train`` for a validated OPD recipe, on the given rubric
    prompts (the caller, ``rise-nemo distill``, loads them from the recipe's data: block and holds the
    run-directory lock)."""
    from nemo_rl.algorithms import distillation

    s = setup_distillation(cfg, train_prompts, eval_prompts)
    distillation.distillation_train(
        s["student"], s["teacher"], s["generation"], s["dataloader"], s["val_dataloader"], s["tokenizer"],
        s["loss_fn"], s["env"], s["env"], s["logger"], s["checkpointer"], s["state"], s["master"],
    )
    return 0


__all__ = ["distillation_recipe", "resume_step", "run_distillation", "setup_distillation"]
