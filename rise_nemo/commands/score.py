"""`rise-nemo score --suite NAME --responses FILE [--data PATH]`: score responses produced elsewhere.

    rise-nemo score --list-suites
    rise-nemo score --suite math500 --responses samples.jsonl                 # the shipped fixture rows
    rise-nemo score --suite gpqa_diamond --data gpqa_diamond.csv --responses r.jsonl
    rise-nemo score --suite healthbench --responses r.jsonl --judge-url http://127.0.0.1:8000/v1 \\
        --judge-model openai/gpt-oss-120b

The responses file is JSONL, one row per sample: ``{"index": <0-based row of the data file>, "response":
"<text>"}``. Writes ``<out>/<suite>.json`` and ``<out>/<suite>.md`` (default ``<responses folder>/suites``) and
ends with ``SCORE suite=<name> n=<problems> score=<headline> ...``. Protocols: docs/evals.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

HELP = "Score responses on an evaluation suite (aime, math500, gsm8k, gpqa_diamond, healthbench, ...)"


def add_suite_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `score` and `eval --suite` share."""
    parser.add_argument("--suite", default=None, help="suite name (--list-suites)")
    parser.add_argument("--list-suites", action="store_true", help="list the suites and exit")
    parser.add_argument("--data", default=None, help="data file in the suite's public format (default: shipped rows)")
    parser.add_argument("--baseline", default=None,
                        help="pairwise suites: the other model's responses (JSONL, same format as --responses)")
    parser.add_argument("--seed", type=int, default=0, help="option shuffling and bootstrap seed (default 0)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    parser.add_argument("--partial", action="store_true", help="score only the problems that have responses")
    parser.add_argument("--judge-url", action="append", default=None,
                        help="judged suites: an OpenAI-compatible base URL (repeatable); default: the rule judge")
    parser.add_argument("--judge-model", default=None, help="the judge model name (with --judge-url)")
    parser.add_argument("--judge-api-key-env", default=None, help="environment variable holding the judge's key")
    parser.add_argument("--judge-option", action="append", default=[], metavar="KEY=VALUE",
                        help="another judge client setting (max_concurrency, timeout_s, max_attempts, extra_body, "
                             "...: the keys of the recipe's judge block), repeatable")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_suite_arguments(parser)
    parser.add_argument("--responses", default=None, help="responses JSONL: {\"index\": N, \"response\": TEXT} per line")
    parser.add_argument("--out", default=None, help="output folder (default: <responses folder>/suites)")


def print_suites() -> int:
    from rise_nemo.evals import list_suites

    for name, headline, source in list_suites():
        print(f"{name:<14} {headline:<22} {source}")
    return 0


def run(args: argparse.Namespace) -> int:
    from rise_nemo.errors import UserError, check_output_path
    from rise_nemo.evals import get_suite
    from rise_nemo.evals.base import read_responses

    if args.list_suites:
        return print_suites()
    if not args.suite:
        raise UserError("give --suite NAME (see --list-suites)")
    if not args.responses:
        raise UserError("give --responses FILE (JSONL, {\"index\": N, \"response\": TEXT} per line)")
    suite = get_suite(args.suite)
    suite.seed = args.seed
    out = Path(args.out) if args.out else Path(args.responses).parent / "suites"
    check_output_path(out, "--out", directory=True)
    items = suite.load(args.data)
    samples = read_responses(args.responses, len(items), partial=args.partial)
    ctx, info = prepare_scoring(suite, items, args, out)
    score_and_report(suite, items, samples, args, out, {**info, "responses": str(args.responses)}, ctx)
    return 0


def prepare_scoring(suite, items, args: argparse.Namespace, out: Path) -> tuple[Any, dict]:
    """Everything scoring needs, checked and built before any response is generated or read (shared by `score`
    and `eval --suite`): the suite's own needs (``Suite.check``: math-verify, the code sandbox, the rule
    judge's extra), the baseline of a pairwise suite and the judge of a judged one (an HTTP judge's extra and
    key; its cache under ``out``), each failure one line. Returns (ScoreContext, what goes into the result's
    info)."""
    import sys

    from rise_nemo.errors import UserError
    from rise_nemo.evals.base import ScoreContext

    suite.check(args.judge_url)
    ctx = ScoreContext(seed=args.seed, bootstrap=args.bootstrap,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    info: dict = {}
    if suite.needs_baseline:
        if args.baseline:
            ctx.baseline = suite.read_baseline(args.baseline, items, args.partial)
            info["baseline"] = str(args.baseline)
        else:
            ctx.baseline = suite.default_baseline(items)
            if ctx.baseline is None:
                raise UserError(f"suite {suite.name}: give --baseline FILE (the baseline model's responses)")
            info["baseline"] = "the data file's own reference responses"
    elif args.baseline:
        raise UserError(f"--baseline: suite {suite.name} is not pairwise")
    if suite.judged:
        from rise_nemo.evals.judge import build_eval_judge

        ctx.judge = build_eval_judge(args.judge_url, args.judge_model, args.judge_api_key_env, args.judge_option)
        out.mkdir(parents=True, exist_ok=True)
        ctx.judge.use_cache(out / f"{suite.name}.judge_cache.jsonl")  # an interrupted run resumes
    elif args.judge_url:
        raise UserError(f"--judge-url: suite {suite.name} is scored without a judge")
    return ctx, info


def close_scoring(ctx: Any) -> None:
    if ctx.judge is not None:
        ctx.judge.close()


def score_and_report(suite, items, samples, args: argparse.Namespace, out: Path, info: dict, ctx: Any) -> None:
    """Score with ``ctx`` (``prepare_scoring``), write ``out/<suite>.{json,md}``, print the table and the SCORE
    line (shared by `score` and `eval --suite`); the judge is closed afterwards."""
    from rise_nemo.evals.base import score_line, write_result

    try:
        result = suite.score(items, samples, ctx)
    finally:
        close_scoring(ctx)
    result.info.update({"data": str(args.data) if args.data else f"shipped: {suite.default_data}",
                        "seed": args.seed, **info})
    json_path, md_path = write_result(result, out)
    print(result.to_markdown())
    print(f"written: {json_path} {md_path}")
    print(score_line(result))
