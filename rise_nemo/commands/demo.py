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

`rise-nemo demo --task reasoning` (`make demo-reasoning`): the reasoning baselines on the embedded
chained-arithmetic task (docs/DESIGN.md §7.5).

1. Warm start from recipes/reasoning_base_local.yaml (cached like the rubric demo's; about 8 min on one
   core the first time, with progress bars).
2. Evaluate it on every level's held-out instances and print the per-level table (pass@k, step accuracy)
   and the line checking the warm start's designed properties
   (rise_nemo/loop/warm_start.py).
3. Train PPO and sparse GRPO (and every other method of REASONING_METHODS whose recipe exists, e.g. RRL)
   for --steps from that same warm start, each into its own run directory under --out.
4. Print the comparison: held-out pass@1 / pass@8 on the training levels and on the hardest level, warm
   start -> after training, per method, with the run directories; write the report (plots + Markdown,
   rise_nemo.reports.reasoning) to <out>/report and print its path.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

HELP = ("Embedded end-to-end demo: warm start, Rubric-RL vs RISE-RL, guidance-free comparison, report "
        "(--task reasoning: the reasoning task's warm start, PPO / sparse GRPO / RRL, pass@k before vs after)")

DEMO_METHODS = (("rubric_rl", "rubric_rl_tiny_cpu.yaml"), ("rise", "rise_tiny_cpu.yaml"))
DEFAULT_STEPS = {"rubric": 30, "reasoning": 20}

# The reasoning demo's warm start and methods. A method runs when its recipe exists in the recipes folder
# (PPO and GRPO ship with the package; RRL's recipe arrives with RRL), so adding a recipe adds a row.
REASONING_BASE = "reasoning_base_local.yaml"
REASONING_METHODS = (("ppo", "ppo_chain_tiny_cpu.yaml"), ("grpo", "grpo_chain_tiny_cpu.yaml"),
                     ("rrl", "rrl_chain_tiny_cpu.yaml"))
REQUIRED_REASONING_METHODS = ("ppo", "grpo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", default=None, help="recipes folder (default: the repository's recipes/)")
    parser.add_argument("--task", choices=sorted(DEFAULT_STEPS), default="rubric",
                        help="rubric (default): Rubric-RL vs RISE-RL; reasoning: PPO / sparse GRPO (/ RRL) on "
                             "the embedded chained-arithmetic task")
    parser.add_argument("--out", default=None,
                        help="parent folder of the demo's run directories (default runs/demo, "
                             "runs/demo_reasoning for --task reasoning)")
    parser.add_argument("--steps", type=int, default=None,
                        help="RL steps per method (default 30; 20 for --task reasoning)")
    parser.add_argument("--eval-every", type=int, default=5,
                        help="steps between guidance-free evaluations (rubric task; the reasoning runs keep "
                             "their recipe's eval.every and always evaluate the last step)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides applied to both recipes")


def _recipes_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from rise_nemo.config.recipes import recipes_dir

    return recipes_dir()  # the checkout's recipes/ (make demo) or the installed copy


def run(args: argparse.Namespace) -> int:
    from rise_nemo.commands.train import setup_logging

    setup_logging()
    if args.steps is None:
        args.steps = DEFAULT_STEPS[args.task]
    if args.steps < 1:
        print(f"rise-nemo demo: --steps must be >= 1, got {args.steps}")
        return 2
    recipes = _recipes_dir(args.recipes)
    if args.task == "reasoning":
        return run_reasoning(args, recipes, Path(args.out or "runs/demo_reasoning"))
    return run_rubric(args, recipes, Path(args.out or "runs/demo"))


def run_rubric(args: argparse.Namespace, recipes: Path, out: Path) -> int:
    from rise_nemo.config import ConfigError, load_config

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
        from rise_nemo.loop.run import build_trainer

        print(f"\n=== {method}: {cfg.train.steps} steps, {cfg.sampling.prompts_per_step} prompts x "
              f"{cfg.sampling.group_size} samples per step ({recipes / recipe}) ===", flush=True)
        trainer = build_trainer(cfg)  # the warm start (or its cache) happens here, outside the timing
        t0 = time.perf_counter()
        trainer.run()  # training steps and the guidance-free evaluations
        if trainer.stopped_by:  # Ctrl-C / SIGTERM: the trainer checkpointed; do not start the next method
            print(f"\ndemo stopped by {trainer.stopped_by} during {method}; run it again to start over")
            return 0
        evals = [json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("step_*.json"))]
        rows.append((method, args.seed, evals, time.perf_counter() - t0))

    from rise_nemo.reports.report import make_report

    report = make_report([out / m for m, _ in DEMO_METHODS], out / "report")
    print(comparison_table(rows))
    print(f"\nreport: {report}")
    print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


def comparison_table(rows) -> str:
    """Final guidance-free numbers per method, then the persistent-coverage curve over the evaluations
    (RISE-RL's expected gain is EARLIER discovery, so the curve and its AUC matter, not only the end)."""
    from rise_nemo.reports.runs import curve_auc

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


def reasoning_methods(recipes: Path) -> list[tuple[str, Path]]:
    """(method, recipe path) of every REASONING_METHODS entry whose recipe exists; PPO and GRPO must."""
    found = [(m, recipes / r) for m, r in REASONING_METHODS if (recipes / r).is_file()]
    missing = [f"{recipes / r}" for m, r in REASONING_METHODS if m in REQUIRED_REASONING_METHODS
               and not (recipes / r).is_file()]
    if missing:
        raise FileNotFoundError(f"reasoning demo recipe(s) not found: {', '.join(missing)}")
    return found


def run_reasoning(args: argparse.Namespace, recipes: Path, out: Path) -> int:
    import torch

    from rise_nemo.config import ConfigError, load_config
    from rise_nemo.errors import UserError
    from rise_nemo.loop.data import load_prompts_checked, warm_start_cache_dir
    from rise_nemo.loop.run import build_trainer
    from rise_nemo.loop.warm_start import (
        evaluate_heldout,
        format_warm_start_properties,
        warm_start_properties,
        warm_started_backend,
    )
    from rise_nemo.steps.reasoning_eval import format_reasoning_eval

    torch.set_num_threads(1)  # the recipes' local.num_threads is 1 too: a tiny model on a shared CPU
    t_start = time.perf_counter()
    try:
        methods = reasoning_methods(recipes)
        common = [f"run.seed={args.seed}", f"train.steps={args.steps}", *args.overrides]
        base_cfg = load_config(recipes / REASONING_BASE, common)
        cfgs = [(m, load_config(r, [f"run.dir={out / m}", *common]), r) for m, r in methods]
    except (ConfigError, FileNotFoundError) as exc:
        print(f"rise-nemo demo: {exc}")
        return 2

    # 1. The warm start (cached): every method below starts from these weights.
    cache = warm_start_cache_dir(base_cfg)
    print(f"=== warm start ({recipes / REASONING_BASE}): a one-time cost, about 8 min on one core on a fresh "
          f"machine, then cached ({cache if cache is not None else 'data.warm_start_cache is null: not cached'}) "
          "===", flush=True)
    try:
        _, heldout = load_prompts_checked(base_cfg)
        policy, generator, stats = warm_started_backend(base_cfg, progress=bool(base_cfg.train.progress))
    except UserError as exc:
        print(f"rise-nemo demo: {exc}")
        return 2
    how = "loaded from the cache" if stats.get("cached") else f"trained in {stats['train_seconds']:.0f} s"
    print(f"warm start {how}: {stats['steps']} clean + {stats['noise_steps']} noisy SFT steps, final loss "
          f"{stats['final_loss']:.3f}", flush=True)

    # 2. Its per-level profile on the held-out instances (never seen in the warm start).
    n = int(base_cfg.eval.samples_per_prompt)
    print(f"\n=== warm start on the held-out instances ({n} samples per problem, temperature "
          f"{float(base_cfg.eval.temperature)}) ===", flush=True)
    base = evaluate_heldout(base_cfg, generator, heldout)
    del policy, generator
    print(format_reasoning_eval(base))
    print(format_warm_start_properties(warm_start_properties(base)), flush=True)

    # 3. Each method from the same warm start, through the normal trainer, in its own run directory.
    rows = []
    for method, cfg, recipe in cfgs:
        run_dir = Path(str(cfg.run.dir))
        if run_dir.exists():
            shutil.rmtree(run_dir)  # the demo always trains from the warm start, never resumes
        print(f"\n=== {method}: {cfg.train.steps} steps, {cfg.sampling.prompts_per_step} problems x "
              f"{cfg.sampling.group_size} samples per step on levels {list(cfg.data.task.train_levels)} ({recipe}) "
              "===", flush=True)
        try:
            trainer = build_trainer(cfg)  # the warm start (from the cache) happens here, outside the timing
        except UserError as exc:
            print(f"rise-nemo demo: {exc}")
            return 2
        t0 = time.perf_counter()
        trainer.run()
        if trainer.stopped_by:
            print(f"\ndemo stopped by {trainer.stopped_by} during {method}; run it again to start over")
            return 0
        evals = [json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("step_*.json"))]
        rows.append({"method": method, "run_dir": run_dir, "seconds": time.perf_counter() - t0,
                     "train_levels": [int(x) for x in cfg.data.task.train_levels],
                     "before": evals[0] if evals and evals[0]["step"] == 0 else base, "after": evals[-1]})

    # 4. The comparison, and the report (plots + Markdown) over every method's run.
    from rise_nemo.reports.report import make_report

    print(reasoning_comparison_table(rows))
    print(f"\nreport: {make_report([row['run_dir'] for row in rows], out / 'report')}")
    print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


def reasoning_comparison_table(rows: list[dict]) -> str:
    """Held-out pass@1 / pass@8 pooled over the training levels and on the hardest level: warm start ->
    after training, per method, with the training time and run directory."""
    from rise_nemo.reports.reasoning import levels_name
    from rise_nemo.steps.reasoning_eval import pooled_pass_at_k

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    def cell(row, levels, k):
        return f"{pct(pooled_pass_at_k(row['before'], levels, k)):>6} -> {pct(pooled_pass_at_k(row['after'], levels, k)):>6}"

    first = rows[0]
    hardest = max(int(k) for k in first["after"]["levels"])
    spans = {row["method"]: levels_name(row["train_levels"]) for row in rows}
    if len(set(spans.values())) == 1:  # one header label when every method trains on the same levels
        span, levels_text = next(iter(spans.values())), f"training levels {next(iter(spans.values()))}"
    else:
        span, levels_text = "train", "training levels " + ", ".join(f"{m} {s}" for m, s in spans.items())
    n = first["after"]["samples_per_problem"]
    lines = ["", f"Held-out pass@k, warm start -> after training ({n} samples per problem; {levels_text}, "
                 f"hardest level L{hardest}):", "",
             f"{'method':<8} {'steps':>5} {span + ' pass@1':>16} {span + ' pass@8':>16} "
             f"{f'L{hardest} pass@1':>16} {f'L{hardest} pass@8':>16} {'train s':>8}  run directory"]
    for row in rows:
        lines.append(f"{row['method']:<8} {row['after']['step']:>5} {cell(row, row['train_levels'], 1):>16} "
                     f"{cell(row, row['train_levels'], 8):>16} {cell(row, [hardest], 1):>16} "
                     f"{cell(row, [hardest], 8):>16} {row['seconds']:>8.0f}  {row['run_dir']}")
    return "\n".join(lines)
