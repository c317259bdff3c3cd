"""Embedded methods benchmark: Rubric-RL vs RISE-RL (and coupled / uniform) on the
persistent-criteria task, several seeds, a fixed step budget, guidance-free evaluation every few steps.

For every method and seed it prints the persistent-criterion coverage curve, its area under the curve
(trapezoid over eval steps, divided by the step span, so it is the curve's mean height), the final mean
reward and the negative-criterion rate. It then measures the step-time ratio RISE-RL / Rubric-RL before
and after the guidance switch in ONE process by interleaving the two methods' steps (same machine load
for both), and ends with

    RESULT auc_ratio=<RISE/Rubric, worst seed> reward_gain=<RISE-Rubric final reward, worst seed> seeds=<n>
           step_ratio_guided=<x> step_ratio_after=<x> negative_gap=<RISE-Rubric final negative rate, worst seed>
           [with the rise_onepass row: onepass_auc_ratio=<x> onepass_reward_gain=<x> onepass_negative_gap=<x>
            onepass_auc_diff=<one-pass - two-pass AUC, mean over seeds> onepass_auc_diff_sd=<its sd over seeds>
            step_ratio_guided_onepass=<revisited steps> step_ratio_guided_onepass_first=<first visits>]

Rows ``rise_paper`` and ``rise+<option>`` are the ablations of our extensions (docs/DESIGN.md §2; see
VARIANTS); ``rise`` is RISE-RL with the project's defaults, the method the RESULT line reports.
``rise_onepass`` is ``rise`` with one-pass guidance (rise.guidance_pass=one, core.guidance rule 6): its step
time is measured interleaved with Rubric-RL over one epoch of first visits (the two-pass fallback) and then
``--timing-steps`` revisited steps (one generate call each).

Usage: python bench/embedded_methods.py [--steps 24] [--eval-every 2] [--seeds 0 1 2] [--out DIR]
                                       [--task control|premise|named] [--base-rates 0.0075 0.015]
The warm start is shared by all runs (cached under data.warm_start_cache); seeds change the sampling
streams and the prompt order of RL training and evaluation.

``--task control`` (default) is today's task, where each persistent criterion is a fixed phrase, so one
hit teaches it for every prompt (RISE-RL's premise is weak). ``--task premise`` sets
``data.task.criteria=prompt``: each persistent criterion demands the prompt's own audience and topic fact.
``--task named`` is the premise task whose prompts also name their persistent behaviours' subjects
(``data.task.name_behaviours=true``: "... please cover safety and a summary ."), so a policy can know
which of the six a held-out prompt asks for; add ``++data.task.persistent_per_prompt=1`` for one
persistent criterion per prompt.
``--base-rates`` runs the whole comparison once per warm-start unprompted rate
(``data.warm_start.unprompted_rate``). Before training, each condition prints its premise measurements:
the warm start's measured unprompted and hinted rates and the transfer rate (the share of other
training prompts whose same-behaviour criterion one hit's text also meets). The RESULT line then adds
``task``, ``persistent_per_prompt``, ``transfer`` and, per base rate r, ``unprompted_<r>``, ``auc_ratio_<r>`` and ``reward_gain_<r>``
(worst seed); ``auc_ratio`` / ``reward_gain`` / ``negative_gap`` stay the worst over every rate and seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._cli import parse_with_overrides  # noqa: E402

RECIPES = {
    "rubric_rl": "rubric_rl_tiny_cpu.yaml",
    "rise": "rise_tiny_cpu.yaml",  # RISE-RL with the project's defaults (the RESULT line's method)
    "coupled": "coupled_tiny_cpu.yaml",
    "uniform": "uniform_tiny_cpu.yaml",
    "ruscarl": "ruscarl_tiny_cpu.yaml",
}
# Ablations: RISE-RL as published (rise.paper_faithful) and the paper plus ONE of our extensions
# (rise_nemo.core.guidance) each; every row spells all options so it does not depend on the defaults.
_PAPER = ["rise.paper_faithful=false", "rise.retention.no_regression=none", "rise.retention.mask_penalised_spans=false",
          "rise.retention.max_length_ratio=null", "rise.gate.enabled=false", "rise.gate.budget=null", "rise.hints=paper"]
VARIANTS = {
    "rise_paper": ("rise", ["rise.paper_faithful=true"]),
    "rise+noreg_hard": ("rise", [*_PAPER, "rise.retention.no_regression=hard"]),
    "rise+noreg_soft": ("rise", [*_PAPER, "rise.retention.no_regression=soft"]),
    "rise+mask": ("rise", [*_PAPER, "rise.retention.mask_penalised_spans=true"]),
    "rise+gate": ("rise", [*_PAPER, "rise.gate.enabled=true"]),
    "rise+length": ("rise", [*_PAPER, "rise.retention.max_length_ratio=1.5", "rise.hints=length_neutral"]),
    "rise+budget": ("rise", [*_PAPER, "rise.gate.budget=0.5"]),
    # Combinations: masks (the best single option) with the cheaper guided step, with the retention rule,
    # and with a stronger guide loss (lambda_guide 1.0 had the best AUC of the method's own settings).
    "rise+mask+budget0.25": ("rise", [*_PAPER, "rise.retention.mask_penalised_spans=true", "rise.gate.budget=0.25"]),
    "rise+mask+noreg_hard": ("rise", [*_PAPER, "rise.retention.mask_penalised_spans=true",
                                      "rise.retention.no_regression=hard"]),
    "rise+mask+lambda1": ("rise", [*_PAPER, "rise.retention.mask_penalised_spans=true", "rise.lambda_guide=1.0"]),
    "rise+mask+noreg_hard+lambda1": ("rise", [*_PAPER, "rise.retention.mask_penalised_spans=true",
                                              "rise.retention.no_regression=hard", "rise.lambda_guide=1.0"]),
    # The project's defaults with one-pass guidance (our option, not the paper's; docs/DESIGN.md §2).
    "rise_onepass": ("rise", ["rise.guidance_pass=one", "++local.generation_batch_size=128"]),
}


# --task: the data.task overrides of each condition (control = the recipe's task).
TASKS = {
    "control": [],
    "premise": ["++data.task.criteria=prompt"],
    "named": ["++data.task.criteria=prompt", "++data.task.name_behaviours=true"],
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=24, help="RL steps per run (the fixed budget)")
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--switch-step", type=int, default=12, help="guidance removal step (eq. 13, fixed)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=["rubric_rl", "rise", "coupled", "uniform", *VARIANTS],
                   choices=sorted([*RECIPES, *VARIANTS]))
    p.add_argument("--timing-steps", type=int, default=8,
                   help="interleaved steps per phase for the step-time ratio (0 = skip the timing)")
    p.add_argument("--task", choices=sorted(TASKS), default="control",
                   help="control: today's fixed-phrase criteria; premise: criteria that depend on the prompt; "
                        "named: premise criteria and prompts that name their behaviours' subjects")
    p.add_argument("--base-rates", type=float, nargs="+", default=None,
                   help="warm-start unprompted rates (data.warm_start.unprompted_rate), one comparison each "
                        "(default: the recipe's)")
    p.add_argument("--out", default="/tmp/rise_bench_embedded")
    p.add_argument("--threads", type=int, default=2, help="torch threads (1 when several benches share the cores)")
    p.add_argument("overrides", nargs="*", help="extra recipe overrides for every run (key=value)")
    return parse_with_overrides(p)


def config(method: str, seed: int, run_dir: Path, args, extra=()):
    from rise_nemo.config import load_config

    recipe, variant = VARIANTS.get(method, (method, []))
    return load_config(REPO / "recipes" / RECIPES[recipe], [*variant,
        f"run.seed={seed}", f"run.dir={run_dir}", f"train.steps={args.steps}", "train.checkpoint_every=0",
        f"eval.every={args.eval_every}", "train.progress=false", f"local.num_threads={args.threads}", f"rise.schedule.switch_step={args.switch_step}",
        *args.overrides, *extra,
    ])


def conditions(args) -> list[tuple[str, list[str]]]:
    """(label, overrides) per base rate of the chosen task; label "" = the recipe's own rate."""
    task = TASKS[args.task]
    if not args.base_rates:
        return [("", task)]
    for rate in args.base_rates:
        if not 0.0 <= rate <= 1.0:
            raise SystemExit(f"--base-rates: expected probabilities in [0, 1], got {rate}")
    return [(f"{rate:g}", [*task, f"++data.warm_start.unprompted_rate={rate}"]) for rate in args.base_rates]


def premise_measurements(args, extra: list[str]) -> dict:
    """The warm start of a condition (built or loaded from the cache, as training will) and the task's
    transfer rate, before any training."""
    from rise_nemo.loop.data import persistent_task
    from rise_nemo.loop.warm_start import warm_started_backend
    from rise_nemo.tasks.persistent_warm_start import transfer_rate

    cfg = config("rubric_rl", 0, Path(args.out) / "premise_probe", args, extra)
    _, _, stats = warm_started_backend(cfg, progress=False)
    task = persistent_task(cfg)
    return {"unprompted_rate": stats.unprompted_rate, "hinted_rate": stats.hinted_rate,
            "transfer": transfer_rate(task), "persistent_per_prompt": int(task.spec["persistent_per_prompt"])}


def train_one(method: str, seed: int, args, extra=(), label: str = "") -> dict:
    from rise_nemo.loop.run import build_trainer
    from rise_nemo.reports.runs import curve_auc

    run_dir = Path(args.out) / (f"r{label}" if label else "") / f"{method}_s{seed}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)  # a fixed budget from scratch, never a resumed run
    t0 = time.perf_counter()
    build_trainer(config(method, seed, run_dir, args, extra)).run()
    evals = [json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("step_*.json"))]
    curve = [(e["step"], e["persistent_coverage"]) for e in evals]
    return {"method": method, "seed": seed, "rate": label, "curve": curve, "auc": curve_auc(curve),
            "final_reward": evals[-1]["reward_mean"], "negative_rate": evals[-1]["negative_rate"],
            "wall_s": time.perf_counter() - t0, "run_dir": str(run_dir)}


def interleaved_step_times(args, methods: tuple[str, ...], steps: int, switch_step: int,
                           condition=()) -> dict[str, list[float]]:
    """Train ``methods`` side by side in one process, one step of each in turn (same machine load for all);
    returns each method's step times."""
    from rise_nemo.loop.run import build_trainer
    from rise_nemo.loop.trainer import seed_everything
    from rise_nemo.steps.rubric import train_step

    extra = [*condition, f"rise.schedule.switch_step={switch_step}", f"train.steps={steps}", "eval.at_start=false",
             "eval.every=0"]
    trainers = {m: build_trainer(config(m, 0, Path(args.out) / f"timing_{m}", args, extra)) for m in methods}
    seed_everything(0)
    times: dict[str, list[float]] = {m: [] for m in methods}
    for step in range(1, steps + 1):
        for method, tr in trainers.items():
            t0 = time.perf_counter()
            train_step(tr.ctx, tr.sampler.next_batch(), step)
            times[method].append(time.perf_counter() - t0)
    return times


def _median_ratio(times: dict[str, list[float]], method: str, lo: int, hi: int) -> float:
    return statistics.median(times[method][lo:hi]) / statistics.median(times["rubric_rl"][lo:hi])


def step_time_ratios(args, condition=()) -> tuple[float, float, dict]:
    """Interleave RISE-RL and Rubric-RL steps in one process: median step time of each, guided phase
    (steps before the switch) and after it (on the first condition's task and warm start)."""
    n = args.timing_steps
    times = interleaved_step_times(args, ("rubric_rl", "rise"), 2 * n, n + 1, condition)
    # The first step of each phase pays one-off costs (allocator warm-up): drop it from both phases.
    return _median_ratio(times, "rise", 1, n), _median_ratio(times, "rise", n + 1, 2 * n), times


def onepass_step_ratios(args, condition=()) -> tuple[float, float, dict]:
    """One-pass guidance vs Rubric-RL, interleaved, all steps guided: the first epoch visits every training
    prompt for the first time (the two-pass fallback), then ``--timing-steps`` revisited steps make one
    generate call each. Returns (median of the per-step ratios over the revisited steps, over the first
    epoch except its first step, times). Per-step ratios, not a ratio of medians: the run is twice as long
    as step_time_ratios' phases, and a change of machine load inside it must cancel step by step."""
    from rise_nemo.loop.data import load_prompts

    cfg = config("rise_onepass", 0, Path(args.out) / "timing_rise_onepass", args, condition)
    epoch = -(-len(load_prompts(cfg)[0]) // int(cfg.sampling.prompts_per_step))  # steps per epoch
    n = args.timing_steps
    times = interleaved_step_times(args, ("rubric_rl", "rise_onepass"), epoch + n, epoch + n + 1, condition)
    ratios = [a / b for a, b in zip(times["rise_onepass"], times["rubric_rl"])]
    return statistics.median(ratios[epoch:]), statistics.median(ratios[1:epoch]), {**times, "epoch": epoch}


def main() -> int:
    args = parse_args()
    import torch

    torch.set_num_threads(args.threads)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    conds = conditions(args)
    premise: dict[str, dict] = {}
    results = []
    for label, extra in conds:
        m = premise_measurements(args, extra)
        premise[label] = m
        print(f"\n== task {args.task}, base rate {label or 'recipe default'}: premise measurements before training: "
              f"persistent criteria met unprompted {100 * m['unprompted_rate']:.2f}%, hinted "
              f"{100 * m['hinted_rate']:.1f}%, transfer of one hit to other prompts {100 * m['transfer']:.1f}%",
              flush=True)
        for seed in args.seeds:
            for method in args.methods:
                r = train_one(method, seed, args, extra, label)
                results.append(r)
                curve = " ".join(f"{s}:{c:.3f}" for s, c in r["curve"])
                print(f"{method:<10} seed {seed}: AUC {r['auc']:.4f}  final reward {r['final_reward']:.4f}  "
                      f"negative rate {r['negative_rate']:.4f}  ({r['wall_s']:.0f} s)\n    coverage {curve}",
                      flush=True)
    (Path(args.out) / "results.json").write_text(json.dumps({"task": args.task, "premise": premise,
                                                             "runs": results}, indent=1))

    by = {(r["method"], r["seed"], r["rate"]): r for r in results}
    print("\nper seed: each method vs Rubric-RL (AUC ratio / final reward gain / negative rate, method vs Rubric)")
    for label, _ in conds:
        for method in args.methods:
            if method == "rubric_rl":
                continue
            for seed in args.seeds:
                row, rub = by.get((method, seed, label)), by.get(("rubric_rl", seed, label))
                if row is None or rub is None:
                    continue
                ratio = row["auc"] / rub["auc"] if rub["auc"] > 0 else float("inf")
                print(f"  {label or '-':>7} {method:<16} seed {seed}: AUC ratio {ratio:.3f}  reward gain "
                      f"{row['final_reward'] - rub['final_reward']:+.4f}  negative rate {row['negative_rate']:.4f} "
                      f"vs {rub['negative_rate']:.4f}")
    per_rate = {label: vs_rubric(by, "rise", args.seeds, label) for label, _ in conds}
    for label, _ in conds:
        print(f"\ncoverage curves, base rate {label or 'recipe default'} (mean over seeds; step:coverage)")
        for method in args.methods:
            rows = [r for r in results if r["method"] == method and r["rate"] == label]
            mean_curve = [(s, statistics.mean(r["curve"][i][1] for r in rows)) for i, (s, _) in enumerate(rows[0]["curve"])]
            print(f"  {method:<16} AUC {statistics.mean(r['auc'] for r in rows):.4f}  final reward "
                  f"{statistics.mean(r['final_reward'] for r in rows):.4f}  negative rate "
                  f"{statistics.mean(r['negative_rate'] for r in rows):.4f}\n    "
                  + " ".join(f"{s}:{c:.3f}" for s, c in mean_curve))

    guided = after = float("nan")
    if args.timing_steps > 0:
        guided, after, times = step_time_ratios(args, conds[0][1])
        print(f"\nstep time (median, interleaved in one process): guided phase RISE/Rubric {guided:.3f}, "
              f"after the switch {after:.3f}")
        (Path(args.out) / "timing.json").write_text(json.dumps(times))
    onepass = onepass_fields(args, by, conds) if "rise_onepass" in args.methods else ""
    ratios = [x for r, _, _ in per_rate.values() for x in r]
    gains = [x for _, g, _ in per_rate.values() for x in g]
    neg_gaps = [x for _, _, n in per_rate.values() for x in n]
    worst_ratio = min(ratios) if ratios else float("nan")
    worst_gain = min(gains) if gains else float("nan")
    worst_neg = max(neg_gaps) if neg_gaps else float("nan")
    extra_fields = [f"task={args.task}", f"persistent_per_prompt={conds_per_prompt(premise)}", f"transfer={statistics.mean(m['transfer'] for m in premise.values()):.4f}"]
    for label, (r, g, _) in per_rate.items():
        if label:
            extra_fields += [f"unprompted_{label}={premise[label]['unprompted_rate']:.4f}",
                             f"auc_ratio_{label}={min(r) if r else float('nan'):.3f}",
                             f"reward_gain_{label}={min(g) if g else float('nan'):+.4f}"]
        else:
            extra_fields += [f"unprompted_rate={premise[label]['unprompted_rate']:.4f}"]
    # negative_gap: RISE-RL's final negative-criterion rate minus Rubric-RL's, worst seed (target <= 0)
    print(f"RESULT auc_ratio={worst_ratio:.3f} reward_gain={worst_gain:+.4f} seeds={len(args.seeds)} "
          f"step_ratio_guided={guided:.3f} step_ratio_after={after:.3f} negative_gap={worst_neg:+.4f}{onepass} "
          + " ".join(extra_fields))
    return 0


def conds_per_prompt(premise: dict[str, dict]) -> int:
    """The conditions' persistent criteria per prompt (the same in every condition: only rates differ)."""
    (n,) = {m["persistent_per_prompt"] for m in premise.values()}
    return n


def vs_rubric(by: dict, method: str, seeds, label: str = "") -> tuple[list[float], list[float], list[float]]:
    """Per seed with both runs (at base rate ``label``): AUC ratio, final reward gain and negative-rate gap of
    ``method`` vs Rubric-RL."""
    ratios, gains, neg_gaps = [], [], []
    for seed in seeds:
        row, rub = by.get((method, seed, label)), by.get(("rubric_rl", seed, label))
        if row is None or rub is None:
            continue
        ratios.append(row["auc"] / rub["auc"] if rub["auc"] > 0 else float("inf"))
        gains.append(row["final_reward"] - rub["final_reward"])
        neg_gaps.append(row["negative_rate"] - rub["negative_rate"])
    return ratios, gains, neg_gaps


def onepass_fields(args, by: dict, conds) -> str:
    """The rise_onepass row's RESULT fields: vs Rubric-RL (worst seed and base rate, like the RISE-RL fields),
    vs the two-pass default (AUC difference paired by seed and rate: mean and sd, to compare with the seed
    noise), and its guided-phase step-time ratios (onepass_step_ratios, on the first condition)."""
    auc, gain, neg, diff = [], [], [], []
    for label, _ in conds:
        a, g, n = vs_rubric(by, "rise_onepass", args.seeds, label)
        auc, gain, neg = auc + a, gain + g, neg + n
        for seed in args.seeds:
            one, two = by.get(("rise_onepass", seed, label)), by.get(("rise", seed, label))
            if one is not None and two is not None:
                diff.append(one["auc"] - two["auc"])
                print(f"  one-pass vs two-pass {label or '-':>7} seed {seed}: AUC {one['auc']:.4f} vs {two['auc']:.4f}"
                      f"  final reward {one['final_reward']:.4f} vs {two['final_reward']:.4f}  negative rate "
                      f"{one['negative_rate']:.4f} vs {two['negative_rate']:.4f}")
    revisit = first = float("nan")
    if args.timing_steps > 0:
        revisit, first, times = onepass_step_ratios(args, conds[0][1])
        print(f"step time (median per-step ratio, interleaved): one-pass/Rubric {revisit:.3f} on revisited steps "
              f"(one generate call), {first:.3f} on the first epoch's {times['epoch']} steps (two-pass fallback)")
        (Path(args.out) / "timing_onepass.json").write_text(json.dumps(times))
    nan = float("nan")
    return (f" onepass_auc_ratio={min(auc, default=nan):.3f} onepass_reward_gain={min(gain, default=nan):+.4f}"
            f" onepass_negative_gap={max(neg, default=nan):+.4f}"
            f" onepass_auc_diff={statistics.mean(diff) if diff else nan:+.4f}"
            f" onepass_auc_diff_sd={statistics.stdev(diff) if len(diff) > 1 else nan:.4f}"
            f" step_ratio_guided_onepass={revisit:.3f} step_ratio_guided_onepass_first={first:.3f}")

if __name__ == "__main__":
    sys.exit(main())
