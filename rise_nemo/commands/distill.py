"""`rise-nemo distill --config RECIPE`: the on-policy distillation baseline (recipes/opd_*.yaml) on NeMo-RL.

NeMo-RL runs the whole loop (``nemo_rl.algorithms.distillation``, see rise_nemo.backends.nemo.distill);
this command loads the recipe and its rubric prompts and hands them over. Needs NeMo-RL (its container).
"""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "on-policy distillation baseline (recipes/opd_*.yaml) on NeMo-RL's distillation path"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="an OPD recipe (nemo.algorithm: distillation)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides (key=value, ++key=value)")


def run(args: argparse.Namespace) -> int:
    from rise_nemo.backends.nemo import run_dir_of
    from rise_nemo.backends.nemo.config import NemoConfigError
    from rise_nemo.backends.nemo.distill import distillation_recipe, resume_step, run_distillation
    from rise_nemo.config.loader import load_config
    from rise_nemo.errors import UserError
    from rise_nemo.loop.data import load_prompts_checked
    from rise_nemo.loop.rundir import RunDirLock, check_resume, write_config

    env_sources: dict[str, str] = {}
    cfg = load_config(args.config, list(args.overrides), env_sources=env_sources)
    train_prompts, eval_prompts = load_prompts_checked(cfg, env_sources)
    try:
        run_dir = Path(run_dir_of(distillation_recipe(cfg)))
    except NemoConfigError as exc:
        raise UserError(f"{args.config}: {exc}") from None
    # As `rise-nemo train` on the cluster path: any failure (a Ray worker's, an unplaceable layout) ends the
    # process in bounded time with one line (rise_nemo.backends.nemo.failfast).
    from rise_nemo.backends.nemo.failfast import fail_fast
    from rise_nemo.commands import user_errors

    with fail_fast("rise-nemo distill", run_dir=lambda: run_dir, user_errors=user_errors()), RunDirLock(run_dir):
        # Same run-directory rules as `rise-nemo train`: one job per directory, a resume only under the
        # same config, and config.yaml written so that `rise-nemo eval RUN_DIR` finds the recipe next to
        # NeMo-RL's checkpoints (rise_nemo.backends.nemo.checkpoints).
        check_resume(run_dir, cfg)
        write_config(run_dir, cfg, resume_step(run_dir))
        try:
            return run_distillation(cfg, train_prompts, eval_prompts)
        except NemoConfigError as exc:
            raise UserError(f"{args.config}: {exc}") from None
