"""`rise-nemo report RUN_DIR [RUN_DIR ...]`: PNG plots and a Markdown comparison of training runs."""

from __future__ import annotations

import argparse
import sys

HELP = "Plot and summarise one or more run directories (rewards, Delta_r, entropy, retention, coverage)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directories; a pipeline directory (rise-nemo pipeline) stands for all its stages")
    parser.add_argument("--out", default=None,
                        help="output folder (default: RUN_DIR/report, or <parent>/report for several runs)")


def run(args: argparse.Namespace) -> int:
    from rise_nemo.errors import check_output_path
    from rise_nemo.orchestration.pipeline import expand_pipeline_dirs
    from rise_nemo.orchestration.report import make_report

    if args.out is not None:
        check_output_path(args.out, "--out", directory=True)  # before any run is read or plotted
    try:
        path = make_report(expand_pipeline_dirs(args.run_dirs), args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"rise-nemo report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
