"""`rise-nemo demo` (`make demo`): the whole method, embedded, on CPU in a few minutes.

1. Warm start: a tiny Qwen3 model learns the persistent-criteria task and to follow appended hints
   (cached under rise_nemo.cache.cache_dir("warm_start"): $RISE_NEMO_CACHE, default ~/.cache/rise_nemo,
   so only the first demo pays for it, from any directory); its unprompted and hinted rates
   for the persistent criteria are measured and printed.
2. Train Rubric-RL and RISE-RL from that same warm start (recipes/rubric_rl_tiny_cpu.yaml and
   recipes/rise_tiny_cpu.yaml, fresh run directories under --out).
3. Evaluate both without guidance on held-out prompts (8 samples per prompt) and print the comparison
   table (mean reward, persistent-criterion coverage, negative-criterion rate, seed).
4. Write the report (plots + Markdown) comparing the two runs and print its path.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

HELP = "Embedded end-to-end demo: warm start, Rubric-RL vs RISE-RL, guidance-free comparison, report"

DEMO_METHODS = (("rubric_rl", "rubric_rl_tiny_cpu.yaml"), ("rise", "rise_tiny_cpu.yaml"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", default=None, help="recipes folder (default: the repository's recipes/)")
    parser.add_argument("--out", default="runs/demo", help="parent folder of the demo's run directories")
    parser.add_argument("--steps", type=int, default=30, help="RL steps per method")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between guidance-free evaluations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides applied to both recipes")


def _recipes_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from rise_nemo.config.recipes import recipes_dir

    return recipes_dir()  # the checkout's recipes/ (make demo) or the installed copy


def run(args: argparse.Namespace) -> int:
    from rise_nemo.commands.train import setup_logging
    from rise_nemo.config import ConfigError, load_config

    setup_logging()
    recipes = _recipes_dir(args.recipes)
    out = Path(args.out)
    t_start = time.perf_counter()
    rows = []
    for method, recipe in DEMO_METHODS:
        run_dir = out / method
        try:
            cfg = load_config(recipes / recipe, [f"run.dir={run_dir}", f"run.seed={args.seed}",
                                                 f"train.steps={args.steps}", f"eval.every={args.eval_every}",
                                                 *args.overrides])
        except ConfigError as exc:
            print(f"rise-nemo demo: {exc}")
            return 2
        if run_dir.exists():
            shutil.rmtree(run_dir)  # the demo always trains from the warm start, never resumes
        from rise_nemo.orchestration.run import build_trainer

        print(f"\n=== {method}: {cfg.train.steps} steps, {cfg.grpo.prompts_per_step} prompts x "
              f"{cfg.grpo.group_size} samples per step ({recipes / recipe}) ===", flush=True)
        trainer = build_trainer(cfg)  # the warm start (or its cache) happens here, outside the timing
        t0 = time.perf_counter()
        trainer.run()  # training steps and the guidance-free evaluations
        if trainer.stopped_by:  # Ctrl-C / SIGTERM: the trainer checkpointed; do not start the next method
            print(f"\ndemo stopped by {trainer.stopped_by} during {method}; run it again to start over")
            return 0
        evals = [json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("step_*.json"))]
        rows.append((method, args.seed, evals, time.perf_counter() - t0))

    from rise_nemo.orchestration.report import make_report

    report = make_report([out / m for m, _ in DEMO_METHODS], out / "report")
    print(comparison_table(rows))
    print(f"\nreport: {report}")
    print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


def comparison_table(rows) -> str:
    """Final guidance-free numbers per method, then the persistent-coverage curve over the evaluations
    (RISE-RL's expected gain is EARLIER discovery, so the curve and its AUC matter, not only the end)."""
    from rise_nemo.orchestration.report import curve_auc

    def pct(x):
        return "-" if x is None else f"{100 * x:5.1f}%"

    lines = ["", "Guidance-free evaluation on held-out prompts (8 samples per prompt):", "",
             f"{'method':<10} {'seed':>4} {'step':>5} {'mean reward':>12} {'persistent cov.':>16} "
             f"{'negative rate':>14} {'cov. AUC':>9} {'run s':>8}"]
    initial = rows[0][2][0]
    lines.append(f"{'initial':<10} {rows[0][1]:>4} {initial['step']:>5} {initial['reward_mean']:>12.4f} "
                 f"{pct(initial['persistent_coverage']):>16} {pct(initial['negative_rate']):>14} {'':>9} {'':>8}")
    curves = []
    for method, seed, evals, secs in rows:
        last = evals[-1]
        curve = [(e["step"], e["persistent_coverage"] or 0.0) for e in evals]
        lines.append(f"{method:<10} {seed:>4} {last['step']:>5} {last['reward_mean']:>12.4f} "
                     f"{pct(last['persistent_coverage']):>16} {pct(last['negative_rate']):>14} "
                     f"{curve_auc(curve):>9.3f} {secs:>8.0f}")
        curves.append(f"{method:<10} " + "  ".join(f"{s}:{pct(c).strip()}" for s, c in curve))
    lines += ["", "persistent-criterion coverage by step (guidance-free):", *curves]
    return "\n".join(lines)
