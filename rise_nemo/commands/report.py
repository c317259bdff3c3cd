"""`rise-nemo report RUN_DIR [RUN_DIR ...]`: PNG plots and a Markdown comparison of training runs.

Benchmark suite results (``<run dir>/eval/suites``, or folders written by `rise-nemo score` / `eval --suite`,
which may be given instead of run directories) are put side by side in ``suites.md`` and at the end of
``report.md`` (rise_nemo.evals.report)."""

from __future__ import annotations

import argparse
import sys

HELP = "Plot and summarise one or more run directories (rewards, Delta_r, entropy, retention, coverage)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directories; a pipeline directory (rise-nemo pipeline) stands for all its stages; "
                             "a folder of suite results (rise-nemo score --out) joins the suite table")
    parser.add_argument("--out", default=None,
                        help="output folder (default: RUN_DIR/report, or <parent>/report for several runs)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rise_nemo.errors import check_output_path
    from rise_nemo.evals.report import suite_results_dir, suites_markdown
    from rise_nemo.loop.pipeline import expand_pipeline_dirs
    from rise_nemo.reports.report import make_report

    if args.out is not None:
        check_output_path(args.out, "--out", directory=True)  # before any run is read or plotted
    dirs = expand_pipeline_dirs(args.run_dirs)
    runs = [d for d in dirs if (Path(d) / "metrics.jsonl").is_file() or suite_results_dir(d) is None]
    suites = suites_markdown(dirs)
    try:
        path = make_report(runs, args.out) if runs else None
    except (FileNotFoundError, ValueError) as exc:
        print(f"rise-nemo report: {exc}", file=sys.stderr)
        return 2
    if suites:
        out = path.parent if path is not None else Path(args.out or Path(dirs[0]).parent / "report")
        out.mkdir(parents=True, exist_ok=True)
        (out / "suites.md").write_text(suites)
        if path is not None:
            with path.open("a") as fh:
                fh.write("\n" + suites)
        print(f"suites: {out / 'suites.md'}")
    if path is not None:
        print(f"report: {path}")
    return 0
