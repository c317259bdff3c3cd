"""Embedded methods benchmark: Rubric-RL vs RISE-RL (and coupled / uniform / the ablation rows) on the
persistent-criteria task, decided on paired intervals over independent seeds.

For every method, seed and condition it trains a fixed step budget with guidance-free evaluation every few
steps and records the persistent-criterion coverage curve, its area under the curve (trapezoid over eval steps,
divided by the step span: the curve's mean height), the final mean reward and negative-criterion rate, and the
NATURAL HITS per behaviour (natural training rollouts meeting a persistent criterion, from samples.jsonl with
``train.log_samples=64``: every natural rollout is logged): how often each method found a criterion on its own.
It then measures the step-time ratio RISE-RL / Rubric-RL before and after the guidance switch in ONE process by
interleaving the two methods' steps (same machine load for both).

Defaults (RISE-RL's decisive miniature): ``--task named`` (each persistent criterion demands the prompt's own
audience and topic fact, and prompts name the behaviours they ask for), 48 steps with the switch at 24 and an
evaluation every 4, base rates 0.015, 0.003 and 0 (``data.warm_start.unprompted_rate``: how often the warm start
meets a criterion unprompted), 10 seeds, plus the NULL CONTROL (``--null-control 0.015``): the same task at base
rate 0.015 with a warm start that ignores hints (``data.warm_start.hint_following=false``: hinted prompts get
unhinted responses), so RISE-RL's privileged rollouts meet the criteria no more often than natural ones and any
gain there is not the hints'. Every seed is an independent replication: it draws its own 64 training and 16
held-out prompts (``data.task.replicate``) from pools of 208 and 48 prompts (6 held out per topic) that one warm
start per condition never trains on; a warm start per seed (~100 CPU-seconds each, 40 of them) is not cheap
here. ``--same-prompts`` keeps the recipe's prompts for every seed (the old behaviour: seeds then differ only in
their sampling streams).

Before training every condition prints its premise: the unprompted and hinted rates measured on its warm start
(the null control's hinted rate is about its unprompted rate) and, per seed, the transfer rate (the share of
other training prompts whose same-behaviour criterion one hit's text also meets).

Comparisons (rise_nemo.core.comparison, paired by seed, 95%, expanded percentile bootstrap over seeds), RISE-RL
minus Rubric-RL per condition:
  auc_diff      coverage-AUC difference (target: lower bound above 0; verdict against 0.05 AUC points, about an
                eighth of Rubric-RL's AUC on this task, where the old auc_ratio >= 1.5 asked for ~0.18)
  reward_gain   final-reward difference (target: lower bound >= 0; verdict against 0.02, a seed's noise)
  negative_gap  final negative-criterion rate difference (point and interval)
The first base rate is the main condition (fields without a suffix); the others carry ``_<rate>``, the null
control ``null_``. ``target_met=1`` when the main condition's auc_diff lower bound is above 0 and reward_gain's
is >= 0.

Budget: ~60 CPU-minutes at the defaults (docs/results.md); ``--quick``: 2 seeds, 8 steps (switch at 4), one
base rate and the null control (a smoke run).

Ends with
    RESULT auc_diff=... auc_diff_lo=... auc_diff_hi=... auc_diff_verdict=... reward_gain=... ... negative_gap=...
           auc_diff_<rate>... null_auc_diff... natural_hits_rubric_rl=... natural_hits_rise=... seeds=10
           step_ratio_guided=... step_ratio_after=... target_met=... task=... cpu_s=...
           [with the rise_onepass row: onepass_auc_diff (one-pass - two-pass, paired) and its interval,
            step_ratio_guided_onepass=<revisited steps> step_ratio_guided_onepass_first=<first visits>]

Rows ``rise_paper`` and ``rise+<option>`` are the ablations of our extensions (docs/DESIGN.md §2; see
VARIANTS); ``rise`` is RISE-RL with the project's defaults, the method the RESULT line reports.
``rise_onepass`` is ``rise`` with one-pass guidance (rise.guidance_pass=one, core.guidance rule 6): its step
time is measured interleaved with Rubric-RL over one epoch of first visits (the two-pass fallback) and then
``--timing-steps`` revisited steps (one generate call each).

``--task control`` is today's task, where each persistent criterion is a fixed phrase, so one hit teaches it
for every prompt (RISE-RL's premise is weak); ``--task premise`` the prompt-dependent criteria without named
requests; add ``++data.task.persistent_per_prompt=1`` for one persistent criterion per prompt.

Usage: python bench/embedded_methods.py [--steps 48] [--switch-step 24] [--eval-every 4] [--seeds 0 .. 9]
       [--task named|premise|control] [--base-rates 0.015 0.003 0] [--null-control 0.015|none]
       [--methods rubric_rl rise ...] [--same-prompts] [--quick] [--out DIR] [--resume] [--workers N]
       [key=value ...]
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
from bench._miniature import cpu_seconds, run_workers  # noqa: E402

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


AUC_DIFF_TARGET = 0.05  # RISE-RL - Rubric-RL coverage AUC (module docstring)
REWARD_GAIN_TARGET = 0.02  # RISE-RL - Rubric-RL final reward (the requirement is a lower bound >= 0)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=48, help="RL steps per run (the fixed budget)")
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--switch-step", type=int, default=24, help="guidance removal step (eq. 13, fixed)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--methods", nargs="+", default=["rubric_rl", "rise"], choices=sorted([*RECIPES, *VARIANTS]),
                   help="rows to train (rubric_rl and rise for the RESULT line; the ablation rows on request)")
    p.add_argument("--timing-steps", type=int, default=8,
                   help="interleaved steps per phase for the step-time ratio (0 = skip the timing)")
    p.add_argument("--task", choices=sorted(TASKS), default="named",
                   help="control: today's fixed-phrase criteria; premise: criteria that depend on the prompt; "
                        "named: premise criteria and prompts that name their behaviours' subjects")
    p.add_argument("--base-rates", type=float, nargs="+", default=[0.015, 0.003, 0.0],
                   help="warm-start unprompted rates (data.warm_start.unprompted_rate), one comparison each; "
                        "the first is the main condition")
    p.add_argument("--null-control", default="0.015",
                   help="base rate of the null control (a warm start that ignores hints), or none")
    p.add_argument("--same-prompts", action="store_true",
                   help="every seed trains and evaluates on the recipe's prompts (seeds differ in sampling only)")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, 8 steps, one base rate + the null control")
    p.add_argument("--out", default="/tmp/rise_bench_embedded")
    p.add_argument("--resume", action="store_true",
                   help="reuse the measurements of runs under --out that finished with exactly this config")
    p.add_argument("--workers", type=int, default=1,
                   help="train the seeds in this many processes (the same runs and CPU time, less wall time)")
    p.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # a --workers child
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("overrides", nargs="*", help="extra recipe overrides for every run (key=value)")
    args = parse_with_overrides(p)
    if args.quick:
        args.seeds, args.steps, args.switch_step, args.eval_every = args.seeds[:2], 8, 4, 2
        args.base_rates, args.timing_steps = args.base_rates[:1], min(args.timing_steps, 2)
    for method in ("rubric_rl", "rise"):
        if method not in args.methods:
            raise SystemExit(f"--methods: {method} is needed (the RESULT line compares RISE-RL with Rubric-RL)")
    return args


def config(method: str, seed: int, run_dir: Path, args, extra=()):
    from rise_nemo.config import load_config

    recipe, variant = VARIANTS.get(method, (method, []))
    return load_config(REPO / "recipes" / RECIPES[recipe], [*variant,
        f"run.seed={seed}", f"run.dir={run_dir}", f"train.steps={args.steps}", "train.checkpoint_every=0",
        f"eval.every={args.eval_every}", "train.progress=false", f"local.num_threads={args.threads}",
        f"rise.schedule.switch_step={args.switch_step}", "train.log_samples=64", *seed_task(seed, args),
        *args.overrides, *extra,
    ])


HELDOUT_POOL_PER_TOPIC = 6  # a seed draws its 2 held-out prompts per topic from these 6 (48 in all)


def seed_task(seed: int, args) -> list[str]:
    """A seed's own training and held-out prompts, drawn from pools that share one warm start per condition
    (``data.task.replicate``, rise_nemo.data.persistent_task), unless --same-prompts."""
    if getattr(args, "same_prompts", True):
        return []
    return [f"++data.task.heldout_pool_per_topic={HELDOUT_POOL_PER_TOPIC}", f"++data.task.replicate={seed}"]


def conditions(args) -> list[tuple[str, list[str]]]:
    """(label, overrides) per base rate of the chosen task (label "" = the recipe's own rate), then the null
    control (label ``null<rate>``: the same task with a warm start that ignores hints)."""
    task = TASKS[args.task]
    if not args.base_rates:
        out = [("", task)]
    else:
        for rate in args.base_rates:
            if not 0.0 <= rate <= 1.0:
                raise SystemExit(f"--base-rates: expected probabilities in [0, 1], got {rate}")
        out = [(f"{rate:g}", [*task, f"++data.warm_start.unprompted_rate={rate}"]) for rate in args.base_rates]
    null = getattr(args, "null_control", None)
    if null not in (None, "none"):
        try:
            rate = float(null)
        except ValueError:
            raise SystemExit(f"--null-control: expected a base rate or none, got {null!r}") from None
        out.append((f"null{rate:g}", [*task, f"++data.warm_start.unprompted_rate={rate}",
                                      "++data.warm_start.hint_following=false"]))
    return out


def premise_measurements(args, extra: list[str], seed: int = 0) -> dict:
    """The warm start of a condition and seed (built or loaded from the cache, as training will) and the task's
    transfer rate, before any training."""
    from rise_nemo.loop.data import persistent_task
    from rise_nemo.loop.warm_start import warm_started_backend
    from rise_nemo.tasks.persistent_warm_start import transfer_rate

    cfg = config("rubric_rl", seed, Path(args.out) / "premise_probe", args, extra)
    _, _, stats = warm_started_backend(cfg, progress=False)
    task = persistent_task(cfg)
    return {"unprompted_rate": stats.unprompted_rate, "hinted_rate": stats.hinted_rate,
            "transfer": transfer_rate(task), "persistent_per_prompt": int(task.spec["persistent_per_prompt"])}


def train_one(method: str, seed: int, args, extra=(), label: str = "") -> dict:
    from omegaconf import OmegaConf

    from rise_nemo.loop.data import persistent_task
    from rise_nemo.loop.run import build_trainer
    from rise_nemo.reports.runs import curve_auc
    from rise_nemo.stopping import STOP_REQUESTED

    run_dir = Path(args.out) / (f"r{label}" if label else "") / f"{method}_s{seed}"
    cfg = config(method, seed, run_dir, args, extra)
    spec = json.dumps(OmegaConf.to_container(cfg, resolve=True), sort_keys=True)
    record = run_dir / "bench_run.json"
    if args.resume and record.exists():  # a finished run of exactly this config: its measurements
        saved = json.loads(record.read_text())
        if saved["config"] == spec:
            return {**saved["result"], "reused": True}
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)  # a fixed budget from scratch, never a resumed run
    t0, c0 = time.perf_counter(), cpu_seconds()
    build_trainer(cfg).run()
    if STOP_REQUESTED.is_set():  # the trainer stopped early on a signal (checkpointed): stop the bench, record nothing
        raise SystemExit(f"stopped by a signal during {run_dir}; rerun with --resume to continue")
    evals = [json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("step_*.json"))]
    if not evals or evals[-1]["step"] != args.steps:
        raise SystemExit(f"{run_dir}: the run ended before step {args.steps}; see its train.log")
    curve = [(e["step"], e["persistent_coverage"]) for e in evals]
    hits = natural_hits(persistent_task(cfg), run_dir / "samples.jsonl", args.switch_step)
    result = {"method": method, "seed": seed, "rate": label, "curve": curve, "auc": curve_auc(curve),
              "final_reward": evals[-1]["reward_mean"], "negative_rate": evals[-1]["negative_rate"],
              "natural_hits": hits, "wall_s": time.perf_counter() - t0, "cpu_s": cpu_seconds() - c0,
              "run_dir": str(run_dir), "measured_at": time.time()}
    record.write_text(json.dumps({"config": spec, "result": result}))
    return result


def natural_hits(task, samples_path: Path, switch_step: int) -> dict:
    """Natural (unhinted) training rollouts meeting a persistent criterion of their prompt, per behaviour, over the
    guided steps (before ``switch_step``) and over all steps; and the natural rollouts logged."""
    by_prompt = {p.prompt_id: p for p in task.train}
    guided: dict[str, int] = {}
    total: dict[str, int] = {}
    rollouts = 0
    for line in samples_path.read_text().splitlines():
        r = json.loads(line)
        if r["hinted"]:
            continue
        rollouts += 1
        prompt = by_prompt[r["prompt_id"]]
        for name, k in zip(task.persistent_names(prompt), task.persistent_criterion_ids[prompt.prompt_id]):
            if r["verdicts"][k]:
                total[name] = total.get(name, 0) + 1
                if r["step"] < switch_step:
                    guided[name] = guided.get(name, 0) + 1
    return {"guided_phase": guided, "all_steps": total, "natural_rollouts": rollouts}


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

    from rise_nemo.core.comparison import paired_difference

    torch.set_num_threads(args.threads)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0, c0, started = time.perf_counter(), cpu_seconds(), time.time()
    conds = conditions(args)
    premise: dict[str, dict] = {}
    results = []
    for label, extra in ([] if args.measure_only else conds):  # the premise of every condition, before training
        per_seed = {seed: premise_measurements(args, extra, seed) for seed in args.seeds}
        premise[label] = m = {key: statistics.mean(v[key] for v in per_seed.values())
                              for key in ("unprompted_rate", "hinted_rate", "transfer")}
        m["persistent_per_prompt"] = next(iter(per_seed.values()))["persistent_per_prompt"]
        m["per_seed"] = per_seed
        spread = " ".join(f"s{seed}:{100 * v['transfer']:.1f}" for seed, v in per_seed.items())
        print(f"\n== task {args.task}, condition {label or 'recipe default'}: premise before training (the "
              f"condition's warm start, each seed's prompts): persistent criteria met unprompted {100 * m['unprompted_rate']:.2f}%, "
              f"hinted {100 * m['hinted_rate']:.1f}%, transfer of one hit to other prompts {100 * m['transfer']:.1f}%"
              f"\n   transfer % per seed's training prompts: {spread}", flush=True)
    if args.workers > 1 and not args.measure_only:
        run_workers(__file__, sys.argv[1:], args.seeds, args.workers, ["--resume"])
        args.resume = True  # read the workers' runs back
    for label, extra in conds:
        for seed in args.seeds:
            for method in args.methods:
                r = train_one(method, seed, args, extra, label)
                results.append(r)
                curve = " ".join(f"{s}:{c:.3f}" for s, c in r["curve"])
                print(f"{method:<10} {label or '-':>8} seed {seed}: AUC {r['auc']:.4f}  final reward "
                      f"{r['final_reward']:.4f}  negative rate {r['negative_rate']:.4f}  natural hits (guided phase) "
                      f"{sum(r['natural_hits']['guided_phase'].values())}  ({r['cpu_s']:.0f} s CPU)\n"
                      f"    coverage {curve}", flush=True)
    if args.measure_only:
        return 0
    (Path(args.out) / "results.json").write_text(json.dumps({"task": args.task, "premise": premise,
                                                             "runs": results}, indent=1))

    by = {(r["method"], r["seed"], r["rate"]): r for r in results}
    compared: dict[str, dict] = {}
    for label, _ in conds:
        auc, gain, neg = vs_rubric(by, "rise", args.seeds, label)
        compared[label] = {"auc_diff": paired_difference(auc[0], auc[1], target=AUC_DIFF_TARGET),
                           "reward_gain": paired_difference(gain[0], gain[1], target=REWARD_GAIN_TARGET),
                           "negative_gap": paired_difference(neg[0], neg[1], target=0.02)}
    for label, _ in conds:
        print(f"\ncondition {label or 'recipe default'} (means over {len(args.seeds)} seeds; step:coverage)")
        for method in args.methods:
            rows = [r for r in results if r["method"] == method and r["rate"] == label]
            mean_curve = [(s, statistics.mean(r["curve"][i][1] for r in rows)) for i, (s, _) in enumerate(rows[0]["curve"])]
            hits: dict[str, int] = {}
            for r in rows:
                for name, n in r["natural_hits"]["guided_phase"].items():
                    hits[name] = hits.get(name, 0) + n
            print(f"  {method:<16} AUC {statistics.mean(r['auc'] for r in rows):.4f}  final reward "
                  f"{statistics.mean(r['final_reward'] for r in rows):.4f}  negative rate "
                  f"{statistics.mean(r['negative_rate'] for r in rows):.4f}\n    "
                  + " ".join(f"{s}:{c:.3f}" for s, c in mean_curve)
                  + "\n    natural hits per behaviour, steps 1-" + str(args.switch_step - 1) + " (all seeds): "
                  + (" ".join(f"{k} {v}" for k, v in sorted(hits.items())) or "none"))
        for name, iv in compared[label].items():
            print(f"  RISE-RL - Rubric-RL {name}: {iv.text(4)}")

    guided = after = float("nan")
    if args.timing_steps > 0:
        guided, after, times = step_time_ratios(args, conds[0][1])
        print(f"\nstep time (median, interleaved in one process): guided phase RISE/Rubric {guided:.3f}, "
              f"after the switch {after:.3f}")
        (Path(args.out) / "timing.json").write_text(json.dumps(times))
    onepass = onepass_fields(args, by, conds) if "rise_onepass" in args.methods else []
    # runs measured by an earlier invocation count their recorded CPU; this invocation's workers are its children
    reused = [r for r in results if r.get("reused") and r.get("measured_at", 0.0) < started]
    cpu_s = cpu_seconds() - c0 + sum(r["cpu_s"] for r in reused)
    print(f"CPU {cpu_s:.0f} s ({len(reused)} runs reused from an earlier invocation), wall "
          f"{time.perf_counter() - t0:.0f} s")

    main_label = conds[0][0]
    main = compared[main_label]
    fields = [*main["auc_diff"].fields("auc_diff"), *main["reward_gain"].fields("reward_gain"),
              *main["negative_gap"].fields("negative_gap")[:3]]
    for label, _ in conds[1:]:
        suffix = label if not label.startswith("null") else ""
        prefix = "null_" if label.startswith("null") else ""
        name = f"{prefix}auc_diff" + (f"_{suffix}" if suffix else "")
        gain = f"{prefix}reward_gain" + (f"_{suffix}" if suffix else "")
        fields += [*compared[label]["auc_diff"].fields(name), f"{gain}={compared[label]['reward_gain'].point:.4f}",
                   f"{gain}_lo={compared[label]['reward_gain'].lo:.4f}"]
    for method in ("rubric_rl", "rise"):
        hits = sum(sum(r["natural_hits"]["guided_phase"].values()) for r in results
                   if r["method"] == method and r["rate"] == main_label)
        fields.append(f"natural_hits_{method}={hits}")
    target_met = int(main["auc_diff"].lo > 0 and main["reward_gain"].lo >= 0)
    fields += [f"target_met={target_met}", f"seeds={len(args.seeds)}", f"steps={args.steps}",
               f"step_ratio_guided={guided:.3f}", f"step_ratio_after={after:.3f}", *onepass,
               f"task={args.task}", f"persistent_per_prompt={conds_per_prompt(premise)}",
               f"transfer={statistics.mean(m['transfer'] for m in premise.values()):.4f}"]
    for label, _ in conds:
        key = label or "rate"
        fields += [f"unprompted_{key}={premise[label]['unprompted_rate']:.4f}",
                   f"hinted_{key}={premise[label]['hinted_rate']:.4f}"]
    fields.append(f"cpu_s={cpu_s:.0f}")
    print("RESULT " + " ".join(fields))
    return 0


def conds_per_prompt(premise: dict[str, dict]) -> int:
    """The conditions' persistent criteria per prompt (the same in every condition: only rates differ)."""
    (n,) = {m["persistent_per_prompt"] for m in premise.values()}
    return n


def vs_rubric(by: dict, method: str, seeds, label: str = "", baseline: str = "rubric_rl"):
    """Per seed with both runs (condition ``label``), paired lists (method, baseline) of the coverage AUC, the
    final reward and the final negative-criterion rate."""
    auc, gain, neg = ([], []), ([], []), ([], [])
    for seed in seeds:
        row, base = by.get((method, seed, label)), by.get((baseline, seed, label))
        if row is None or base is None:
            continue
        for pair, key in ((auc, "auc"), (gain, "final_reward"), (neg, "negative_rate")):
            pair[0].append(row[key])
            pair[1].append(base[key])
    return auc, gain, neg


def onepass_fields(args, by: dict, conds) -> list[str]:
    """The rise_onepass row's RESULT fields: its AUC against Rubric-RL and against the two-pass default (paired by
    seed, main condition), and its guided-phase step-time ratios (onepass_step_ratios, on the first condition)."""
    from rise_nemo.core.comparison import paired_difference

    label = conds[0][0]
    vs_rub = paired_difference(*vs_rubric(by, "rise_onepass", args.seeds, label)[0], target=AUC_DIFF_TARGET)
    vs_two = paired_difference(*vs_rubric(by, "rise_onepass", args.seeds, label, baseline="rise")[0],
                               target=AUC_DIFF_TARGET)
    revisit = first = float("nan")
    if args.timing_steps > 0:
        revisit, first, times = onepass_step_ratios(args, conds[0][1])
        print(f"step time (median per-step ratio, interleaved): one-pass/Rubric {revisit:.3f} on revisited steps "
              f"(one generate call), {first:.3f} on the first epoch's {times['epoch']} steps (two-pass fallback)")
        (Path(args.out) / "timing_onepass.json").write_text(json.dumps(times))
    print(f"one-pass - Rubric-RL AUC {vs_rub.text(4)}; one-pass - two-pass AUC {vs_two.text(4)}")
    return [*vs_rub.fields("onepass_auc_diff_rubric")[:3], *vs_two.fields("onepass_auc_diff")[:3],
            f"step_ratio_guided_onepass={revisit:.3f}", f"step_ratio_guided_onepass_first={first:.3f}"]


if __name__ == "__main__":
    sys.exit(main())
