"""`rise-nemo train --config recipes/<name>.yaml [key=value ...]`: train (or resume) one run.

The run directory is ``run.dir`` (default ``runs/<run.name>``) or ``--run-dir``. If it holds a complete
checkpoint the run resumes from it; SIGINT / SIGTERM / SIGUSR1 finish the current step, checkpoint and
exit 0, so a Slurm requeue simply runs the same command again.
"""

from __future__ import annotations

import argparse
import logging
import sys

HELP = "Train (or resume) a run from a recipe: --config recipes/<name>.yaml [dotted.key=value ...]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="recipe YAML (defaults: inheritance, see recipes/)")
    parser.add_argument("--run-dir", default=None, help="run directory (default: run.dir or runs/<run.name>)")
    parser.add_argument("--stop-after", type=int, default=None,
                        help="stop (checkpoint, exit 0) after this many steps in total, as a signal would")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="NeMo-RL-style overrides: a.b=1 (existing key), ++a.b=1 (add), ~a.b (delete)")


def setup_logging() -> None:
    root = logging.getLogger("rise_nemo")
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
               for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[rise-nemo] %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    from rise_nemo.config import ConfigError, load_config

    setup_logging()
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"rise-nemo train: {exc}", file=sys.stderr)
        return 2
    from rise_nemo.orchestration.run import build_trainer

    trainer = build_trainer(cfg, run_dir=args.run_dir, stop_after=args.stop_after)
    rc = trainer.run()
    print(f"run directory: {trainer.run_dir}")
    return rc
