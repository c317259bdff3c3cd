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
    parser.add_argument("--config", required=True,
                        help="recipe YAML, or a recipe name such as rise_tiny_cpu (defaults: inheritance, see recipes/)")
    parser.add_argument("--run-dir", default=None, help="run directory (default: run.dir or runs/<run.name>)")
    parser.add_argument("--stop-after", type=_positive_int, default=None,
                        help="stop (checkpoint, exit 0) after this many steps in total, as a signal would (>= 1)")
    parser.add_argument("--allow-config-change", action="store_true",
                        help="resume although the config differs from the run's (recorded in config_history/)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="NeMo-RL-style overrides: a.b=1 (existing key), ++a.b=1 (add), ~a.b (delete)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted. A handler bound to the stderr of its
    first caller kept writing to that object after it was replaced and closed (an in-process caller that
    redirects stderr, pytest's capture): every later log line then failed with "I/O operation on closed file"."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging() -> None:
    root = logging.getLogger("rise_nemo")
    if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
               for h in root.handlers):
        handler = _CurrentStderrHandler()
        handler.setFormatter(logging.Formatter("[rise-nemo] %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    from rise_nemo.config import load_config
    from rise_nemo.config.recipes import resolve_recipe

    setup_logging()
    env_sources: dict[str, str] = {}
    cfg = load_config(resolve_recipe(args.config), args.overrides, env_sources=env_sources)
    if cfg.backend == "nemo":
        from rise_nemo.commands.plan import refuse_unplannable

        refuse_unplannable(cfg)  # a layout NeMo-RL cannot run is refused before anything starts
    if cfg.backend != "nemo":
        return _train(cfg, args, env_sources)
    # The cluster path fails fast: any exception (a Ray worker's included) ends the process in bounded time
    # with one line on stderr and Ray shut down (rise_nemo.backends.nemo.failfast).
    from rise_nemo.backends.nemo.failfast import fail_fast
    from rise_nemo.commands import user_errors
    from rise_nemo.loop.trainer import resolve_run_dir

    run_dir = args.run_dir if args.run_dir is not None else resolve_run_dir(cfg)
    with fail_fast("rise-nemo train", run_dir=lambda: run_dir, user_errors=user_errors()):
        return _train(cfg, args, env_sources)


def _train(cfg, args: argparse.Namespace, env_sources: dict[str, str]) -> int:
    from rise_nemo.loop.run import build_trainer

    trainer = build_trainer(cfg, run_dir=args.run_dir, stop_after=args.stop_after,
                            allow_config_change=args.allow_config_change, env_sources=env_sources)
    rc = trainer.run()
    print(f"run directory: {trainer.run_dir.resolve()}")  # absolute, as the start line in train.log
    return rc
