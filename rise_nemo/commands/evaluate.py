"""`rise-nemo eval`: guidance-free evaluation of a checkpoint (or of the recipe's initial model).

    rise-nemo eval RUN_DIR                      # latest checkpoint, config from RUN_DIR/config.yaml
    rise-nemo eval RUN_DIR --checkpoint step_10 eval.samples_per_prompt=16   # options and overrides in any order
    rise-nemo eval --config recipes/x.yaml      # the initial (for the persistent task: warm-started) policy
    rise-nemo eval --suite math500 MODEL        # a benchmark suite (docs/evals.md; rise_nemo.evals.generate)

Writes ``<run dir>/eval/cli/step_XXXXXX.json`` (``step_XXXXXX.2.json``, ... when that exists; or ``--out``) and
prints the summary and coverage table. The trainer's own ``<run dir>/eval/step_XXXXXX.json`` (what ``report``
reads) is never overwritten, whatever the overrides; an ``--out`` that is a folder or a trainer's eval file is
refused before any work starts.
On reasoning problems (``data.source: chain_arithmetic``, or the files of a verifier-scored method: GSM8K,
MATH, APPS, HH-RLHF with its reward model's preference over the chosen reply) it reports unbiased pass@k for k = 1, 2, 4,
..., eval.samples_per_prompt per difficulty level, step accuracy, mean token entropy and response length
(rise_nemo.steps.reasoning_eval).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

HELP = ("Guidance-free evaluation on held-out prompts: mean reward, persistent coverage, negative rate; "
        "--suite NAME MODEL: a benchmark suite")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="recipe YAML (default: RUN_DIR/config.yaml)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint dir or name (default: latest)")
    parser.add_argument("--out", default=None, help="JSON output file (default: RUN_DIR/eval/cli/step_N.json; never a trainer's eval/step_N.json); with --suite: the output folder (default RUN_DIR/eval/suites)")
    # One positional list so that options may sit anywhere: the first item that is not an override
    # (no '=' and no leading '~') is the run directory.
    parser.add_argument("items", nargs="*", metavar="[RUN_DIR] KEY=VALUE",
                        help="run directory (uses its config.yaml), then overrides")
    from rise_nemo.commands.score import add_suite_arguments

    add_suite_arguments(parser)  # --suite NAME: a benchmark suite instead (MODEL = run dir or HF model dir)
    parser.add_argument("--samples", type=int, default=1, help="--suite: responses per problem (default 1)")
    parser.add_argument("--max-new-tokens", type=int, default=1024, help="--suite: default 1024")
    parser.add_argument("--temperature", type=float, default=0.0, help="--suite: 0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="--suite: default 1.0")
    parser.add_argument("--limit", type=int, default=None, help="--suite: only the first N problems")


def _split(items: list[str]) -> tuple[str | None, list[str]]:
    run_dir, overrides = None, []
    for item in items:
        if run_dir is None and not overrides and "=" not in item and not item.startswith("~"):
            run_dir = item
        else:
            overrides.append(item)
    return run_dir, overrides


def run(args: argparse.Namespace) -> int:
    from rise_nemo.commands.train import setup_logging
    from rise_nemo.config import load_config
    from rise_nemo.config.recipes import resolve_recipe
    from rise_nemo.errors import UserError

    setup_logging()
    args.run_dir, args.overrides = _split(args.items)
    if getattr(args, "suite", None) or getattr(args, "list_suites", False):  # callers may build a bare Namespace
        return _run_suite(args)
    if args.run_dir is None and args.config is None:
        print("rise-nemo eval: give a RUN_DIR or --config", file=sys.stderr)
        return 2
    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is not None and (run_dir / "pipeline.json").is_file():
        from rise_nemo.loop.pipeline import expand_pipeline_dirs

        run_dir = Path(expand_pipeline_dirs([run_dir])[-1])  # a pipeline's model is its last stage's
        print(f"rise-nemo eval: {args.run_dir} is a pipeline directory: evaluating its last stage, {run_dir}",
              file=sys.stderr)
    if run_dir is not None and not (run_dir / "config.yaml").is_file() and args.config is None:
        inside = sorted(str(p.parent) for p in run_dir.glob("*/config.yaml")) if run_dir.is_dir() else []
        hint = f"; the run directories in it: {', '.join(inside)}" if inside else ""
        raise UserError(f"{run_dir}: not a run directory (no config.yaml); give a run directory or --config{hint}")
    if args.out is not None:
        _check_out(Path(args.out))
    config = resolve_recipe(args.config) if args.config else run_dir / "config.yaml"
    env_sources: dict[str, str] = {}
    cfg = load_config(config, args.overrides, env_sources=env_sources)

    from rise_nemo.judges.checked import build_checked_judge
    from rise_nemo.loop.run import load_eval_model
    from rise_nemo.methods.registry import get_method
    from rise_nemo.steps.rubric_eval import evaluate
    from rise_nemo.steps.verifiers import check_verifier

    # Problems (the embedded reasoning task, GSM8K / MATH / APPS / HH-RLHF rows of a method on problems) are
    # scored by their verifier, rubric prompts by the judge.
    method = get_method(str(cfg.method))
    reasoning = method.data == "problems"
    if reasoning:
        check_verifier(cfg)  # its extra, the reward model's path: before anything is read or built

    def check_eval(eval_prompts: Any) -> Any:
        """Before the model is built and anything generated: held-out prompts, and the judge of rubric prompts
        (built, HTTP judges probed)."""
        if not eval_prompts:
            raise UserError("the recipe has no held-out prompts (data.eval_path)")
        return None if reasoning else build_checked_judge(cfg.judge)

    model = load_eval_model(cfg, run_dir, args.checkpoint, env_sources, before_build=check_eval, method=method)
    if run_dir is not None and model.checkpoint is None:
        print(f"rise-nemo eval: {run_dir} has no complete checkpoint; evaluating the initial policy", file=sys.stderr)
    generator, judge, eval_prompts, step = model.generator, model.checked, model.eval_prompts, model.step
    if reasoning:
        result, text = _reasoning_eval(cfg, generator, eval_prompts, step)
    else:
        result = evaluate(cfg, generator, judge, eval_prompts, step)
        text = format_eval(result)
    out = Path(args.out) if args.out else (_fresh_path(run_dir / "eval" / "cli", step) if run_dir else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, out)
    print(text)
    if out is not None:
        print(f"written: {out}")
    return 0


def _run_suite(args: argparse.Namespace) -> int:
    """`eval --suite NAME MODEL`: generate (rise_nemo.evals.generate), then score like `rise-nemo score`."""
    import sys

    from rise_nemo.commands.score import close_scoring, prepare_scoring, print_suites, score_and_report
    from rise_nemo.errors import UserError, check_output_path
    from rise_nemo.evals import get_suite
    from rise_nemo.evals.generate import generate_responses, load_generator
    from rise_nemo.interfaces import SamplingParams

    if args.list_suites:
        return print_suites()
    if args.run_dir is None:
        raise UserError("eval --suite NAME MODEL: give MODEL (a run directory or a Hugging Face model directory)")
    if args.config is not None:
        raise UserError("--config: with --suite, MODEL's own config.yaml (a run directory) is used")
    if args.samples < 1 or args.max_new_tokens < 1 or (args.limit is not None and args.limit < 1):
        raise UserError("--samples, --max-new-tokens and --limit must be >= 1")
    suite = get_suite(args.suite)
    suite.seed = args.seed
    model = Path(args.run_dir)
    default_out = model / "eval" / "suites" if (model / "config.yaml").is_file() else Path("eval_suites") / model.name
    out = Path(args.out) if args.out else default_out
    check_output_path(out, "--out", directory=True)
    items = suite.load(args.data)
    if args.limit is not None:
        items = items[:args.limit]
        args.partial = True
    # Everything scoring needs (the suite's extra, sandbox, baseline, judge) before the model is loaded and the
    # first response generated: on a real model, generating 1,319 GSM8K answers before an error costs an hour.
    ctx, info = prepare_scoring(suite, items, args, out)
    try:
        generator, described = load_generator(str(model), args.checkpoint, args.overrides)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                                seed=args.seed)
        out.mkdir(parents=True, exist_ok=True)
        responses = out / f"{suite.name}.responses.jsonl"
        samples = generate_responses(generator, items, args.samples, params, responses,
                                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    except BaseException:
        close_scoring(ctx)
        raise
    sampling = {"samples": args.samples, "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                "top_p": args.top_p, "seed": args.seed}
    score_and_report(suite, items, samples, args, out,
                     {**info, "responses": str(responses), "generation": {**described, **sampling}}, ctx)
    return 0


def _is_trainer_eval(path: Path) -> bool:
    """``path`` is (or would replace) a trainer's ``<run dir>/eval/step_N.json``."""
    return (path.parent.name == "eval" and path.name.startswith("step_") and path.suffix == ".json"
            and (path.parent.parent / "metrics.jsonl").is_file())


def _check_out(out: Path) -> None:
    from rise_nemo.errors import UserError, check_output_path

    check_output_path(out, "--out", directory=False)
    if _is_trainer_eval(out.resolve()):
        raise UserError(f"--out {out}: that is the trainer's evaluation, which `report` reads; give another "
                        f"file (the default is <run dir>/eval/cli/step_N.json)")


def _fresh_path(folder: Path, step: int) -> Path:
    """``folder/step_N.json``, or ``step_N.2.json``, ``step_N.3.json``, ... : never an existing file."""
    out, n = folder / f"step_{step:06d}.json", 1
    while out.exists():
        n += 1
        out = folder / f"step_{step:06d}.{n}.json"
    return out


def _reasoning_eval(cfg, generator, problems, step: int) -> tuple[dict, str]:
    """pass@k per level on a reasoning task: (result, printable table)."""
    from rise_nemo.steps.reasoning_eval import evaluate_reasoning, format_reasoning_eval
    from rise_nemo.steps.rollouts import eval_sampling_params
    from rise_nemo.steps.verifiers import build_verifier

    verifier, step_accuracy = build_verifier(cfg)
    result = evaluate_reasoning(generator, verifier, problems, int(cfg.eval.samples_per_prompt),
                                eval_sampling_params(cfg, step), step, step_accuracy=step_accuracy)
    return result, format_reasoning_eval(result)


def format_eval(result: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"step {result['step']}: mean reward {result['reward_mean']:.4f} over {result['num_responses']} responses "
        f"({result['num_prompts']} prompts, {result['unknown_excluded']} unknown excluded)",
        f"persistent coverage {pct(result['persistent_coverage'])}, negative rate {pct(result['negative_rate'])}",
        "",
        f"{'criterion':<60} {'flags':<5} {'satisfied/total':>16} {'coverage':>9}",
    ]
    for row in result["criteria"]:
        flags = ("P" if row["persistent"] else "") + ("N" if row["negative"] else "")
        lines.append(f"{row['criterion'][:60]:<60} {flags:<5} {row['satisfied']:>7}/{row['total']:<8} "
                     f"{pct(row['coverage']):>9}")
    return "\n".join(lines)
