"""`rise-nemo pipeline FILE [key=value ...]`: run (or resume) a multi-stage pipeline, e.g. ExpRL's Stage I then
Stage II from Stage I's final checkpoint (rise_nemo.loop.pipeline; docs/DESIGN.md §8), then write a
report covering every stage to ``<pipeline dir>/report``.

Overrides apply to every stage (e.g. ``run.seed=1``). Each stage has its own run directory and resumes from
its own checkpoint; a completed stage is skipped, so after a signal the same command continues.
"""

from __future__ import annotations

import argparse

HELP = "Run (or resume) a multi-stage pipeline (ExpRL Stage I -> Stage II): FILE [dotted.key=value ...]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from rise_nemo.commands.train import _positive_int

    parser.add_argument("pipeline", help="pipeline YAML, or its name (e.g. exprl_pipeline_tiny_cpu, as for recipes)")
    parser.add_argument("--dir", default=None, help="pipeline directory (default: pipeline.dir); stages go below")
    parser.add_argument("--stop-after", type=_positive_int, default=None,
                        help="stop the current stage after this many of its steps, as a signal would")
    parser.add_argument("--no-report", action="store_true", help="skip the report at the end")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides for every stage")


def run(args: argparse.Namespace) -> int:
    from rise_nemo.commands.train import setup_logging
    from rise_nemo.loop.pipeline import load_pipeline, run_pipeline, stage_config, stage_done

    setup_logging()
    pipeline = load_pipeline(args.pipeline, args.dir)
    rc = run_pipeline(pipeline, args.overrides, stop_after=args.stop_after)
    dirs = [pipeline.stage_dir(s) for s in pipeline.stages]
    complete = all(stage_done(d, int(stage_config(pipeline, s, args.overrides).train.steps))
                   for s, d in zip(pipeline.stages, dirs))
    if complete and not args.no_report:
        from rise_nemo.reports.report import make_report

        print(f"report: {make_report([str(d) for d in dirs], str(pipeline.dir / 'report'))}")
    print(f"pipeline directory: {pipeline.dir.resolve()}" + ("" if complete else " (not finished: run the same command again)"))
    return rc
