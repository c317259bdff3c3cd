"""On-policy distillation baseline (recipes/opd_*.yaml) on NeMo-RL's distillation path.

    python -m rise_nemo.backends.nemo.distill --config recipes/opd_14b_teacher32b.yaml [key=value ...]

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

import argparse
import sys
from functools import partial
from pathlib import Path

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
from rise_nemo.backends.nemo.config import algorithm, build_master_config
from rise_nemo.errors import UserError
from rise_nemo.orchestration.rundir import RunDirLock, check_resume, write_config


def run(config_path: str, overrides: list[str]) -> int:
    from rise_nemo.config.loader import load_config

    cfg = load_config(config_path, overrides)
    recipe = plain_recipe(cfg)
    check_recipe(recipe)
    if algorithm(recipe) != "distillation":
        raise NemoConfigError(f"{config_path}: nemo.algorithm must be 'distillation' for this entry point")

    run_dir = Path(run_dir_of(recipe))
    with RunDirLock(run_dir):
        # Same run-directory rules as `rise-nemo train`: one job per directory, a resume (NeMo-RL's
        # distillation.setup resumes from the newest nemo_rl_checkpoints/step_N) only under the same config,
        # and config.yaml written so that `rise-nemo eval RUN_DIR` finds the recipe next to the checkpoints.
        check_resume(run_dir, cfg)
        latest = latest_nemo_rl_checkpoint(run_dir)
        write_config(run_dir, cfg, nemo_rl_step(latest) if latest is not None else 0)
        return _distill(cfg, recipe, run_dir)


def _distill(cfg, recipe, run_dir: Path) -> int:
    from nemo_rl.algorithms import distillation
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.distributed.virtual_cluster import init_ray
    from nemo_rl.environments.utils import create_env
    from nemo_rl.models.generation import configure_generation_config

    from rise_nemo.backends.nemo.environment import TASK_NAME, rubric_datum
    from rise_nemo.orchestration.data import load_prompts

    master = distillation.MasterConfig(**build_master_config(recipe, str(run_dir)))
    init_ray()
    tokenizer = get_tokenizer(master.policy["tokenizer"])
    master.policy["generation"] = configure_generation_config(master.policy["generation"], tokenizer)
    encode = partial(encode_chat, tokenizer, chat_template_kwargs=master.policy["tokenizer"].get("chat_template_kwargs") or {})
    train_prompts, eval_prompts = load_prompts(cfg)
    train = nemo_dataset(train_prompts, encode, int(master.distillation["num_prompts_per_step"]))
    val = [rubric_datum(p, encode, i) for i, p in enumerate(eval_prompts)] or None

    register_rubric_environment(TASK_NAME)
    judge_cfg = {**recipe["judge"], "reward_clip_min": recipe.get("reward", {}).get("clip_min")}
    env = create_env(TASK_NAME, judge_cfg)
    out = distillation.setup(master, tokenizer, train, val)
    student, teacher, generation = out[0], out[1], out[2]
    dataloader, val_dataloader, loss_fn, logger, checkpointer, state, master = out[4:11]
    distillation.distillation_train(
        student, teacher, generation, dataloader, val_dataloader, tokenizer, loss_fn,
        {TASK_NAME: env}, {TASK_NAME: env}, logger, checkpointer, state, master,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rise_nemo.backends.nemo.distill", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    try:
        return run(args.config, list(args.overrides))
    except (NemoConfigError, UserError) as exc:
        print(f"distill: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
