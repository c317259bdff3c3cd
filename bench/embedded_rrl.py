"""RRL benchmark on the embedded chained-arithmetic task (docs/DESIGN.md §7.5, §9), decided on pooled intervals.

The task (--task): ``exact`` (default) = recipes/rrl_chain_late_exact_tiny_cpu.yaml, the chain task with a
LATE-ONLY SKILL (steps late_from.. use operands 6..12 and have their own warm-start error mode) whose error
modes cannot cancel: the warm start's wrong results are the right one + 18 (early steps) or + 9 (late steps),
and no combination of 10 or fewer of them is 0 mod 61 (enumerated, tasks.reasoning.error_shift_distance), so a
right answer needs... no error, and answer-only and exact pass@1 agree up to the model's own slips. Its one warm
start draws the late skill's first step from 4, 6 or 8 (``data.warm_start.late_from_mix``), so the RL task can
put it at step 8, 6 or 4 (--late-from) with the same weights: the REACH RATE (a from-scratch rollout arrives at
the late skill with a correct prefix, about p^(late_from - 1)) varies over three levels, a dose-response.
``premise`` / ``control`` are the earlier recipes (rrl_chain_late_tiny_cpu.yaml, whose offsets 18 and 7 cancel,
and rrl_chain_tiny_cpu.yaml), one reach level each.

Variants with the SAME step budget (--steps), per seed and reach level, from the task's cached warm start:
  ppo      PPO (critic + GAE), the baseline
  rrl      RRL: PPO + replay of states from policy AND canonical solutions (beta 0.4, 5 states per problem)
  rrl_ref  RRL whose candidate states are scored by the reference judge's prefix score instead of V
  rrl_cs / rrl_pgs  states only from canonical / policy-generated solutions (the paper's ablations)
Every critic is first pre-trained on the warm start's rollouts (--critic-pretrain updates, once per seed and
level, the same pre-trained critic for every variant).

Independent seeds: every seed trains on its own fresh problems (the recipe's training levels, its problems per
level) and is evaluated on its own --heldout fresh level-10 problems (bench/_miniature.seed_problems); the warm
start is shared (a per-seed warm start is not cheap). Within a seed every variant is evaluated with the same
sampling seed on the same problems.

Printed BEFORE training, per reach level, on the warm start (the task's own 16 held-out level-10 problems x
--premise-samples, T = eval temperature): the error modes' smallest distance from cancelling; the reach rate;
pass@1 (answer and exact) from scratch and from the clean reference cut before the first late step; the
per-position step accuracy given a correct prefix (step 1 included: the earlier premise warm start had a
step-1 defect, docs/results.md).

Comparisons (rise_nemo.core.comparison: pooled over seeds and problems, two-stage paired bootstrap, 95%), at
the first --late-from (the lowest reach rate):
  hard_exact_ratio    RRL / PPO exact pass@1 (every step right) on the held-out level-10 problems (target >= 1.5
                      with the lower bound above 1)
  hard_answer_ratio   the same, answer only
  late_prefix_ratio   RRL / PPO exact pass@1 continuing the clean prefix before the late skill
  ref_exact_ratio     rrl_ref / PPO (when rrl_ref runs)
  hard_exact_ratio_lf<L>, reach_lf<L>  the dose-response: each level's ratio (with _lo, _hi) and reach rate
  easy_pass1_delta    RRL - PPO pass@1 on the task's 16 held-out level-1 problems (point, _lo, _hi; the old
                      target >= -0.02)
  step_ratio          RRL / PPO CPU time per training step (target <= 1.25)

Budget: ~60 CPU-minutes at the defaults with the warm start cached (docs/results.md); the warm start, built
once, ~8 more. ``--quick``: 2 seeds, 4 steps, one reach level, 16 problems x 8 samples (a smoke run).

Ends with
    RESULT hard_exact_ratio=... hard_exact_ratio_lo=... _hi=... _verdict=... hard_answer_ratio... late_prefix_ratio...
           hard_exact_ratio_lf8... reach_lf8=... ... easy_pass1_delta=... step_ratio=... seeds=10 steps=40 cpu_s=...

Usage: python bench/embedded_rrl.py [--steps 40] [--seeds 0 .. 9] [--samples 16] [--heldout 64] [--late-from 8 6 4]
       [--task exact|premise|control] [--variants ppo rrl] [--critic-pretrain 100] [--quick] [--out F]
       [--resume-dir D] [--workers N] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._cli import parse_with_overrides  # noqa: E402
from bench._miniature import (  # noqa: E402
    counts,
    cpu_seconds,
    rate,
    resumable,
    run_workers,
    sample_texts,
    score_samples,
    score_texts,
    seed_problems,
)

TASKS = {"exact": "rrl_chain_late_exact_tiny_cpu.yaml", "premise": "rrl_chain_late_tiny_cpu.yaml",
         "control": "rrl_chain_tiny_cpu.yaml"}
VARIANTS = {
    "ppo": ["method=ppo"],
    "rrl": ["method=rrl", "rrl.state_sources=[policy, canonical]"],
    "rrl_ref": ["method=rrl", "rrl.state_sources=[policy, canonical]", "rrl.state_scorer=reference"],
    "rrl_cs": ["method=rrl", "rrl.state_sources=[canonical]"],
    "rrl_pgs": ["method=rrl", "rrl.state_sources=[policy]"],
}
TARGET = 1.5  # RRL / PPO exact hard pass@1
HELDOUT_LEVEL = 10


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--samples", type=int, default=16, help="samples per held-out problem")
    p.add_argument("--heldout", type=int, default=64, help="fresh held-out level-10 problems per seed")
    p.add_argument("--premise-samples", type=int, default=64, help="samples per problem for the premise printout")
    p.add_argument("--late-from", type=int, nargs="+", default=None,
                   help="first step of the late skill, one comparison each (task exact: 8 6 4; else the recipe's)")
    p.add_argument("--variants", nargs="+", default=["ppo", "rrl"], choices=list(VARIANTS))
    p.add_argument("--task", choices=sorted(TASKS), default="exact")
    p.add_argument("--critic-pretrain", type=int, default=100,
                   help="critic pre-training updates on warm-start rollouts for every variant (0 = off)")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, 4 steps, one level, 16 problems x 8")
    p.add_argument("--out", default=None, help="write every measurement as JSON here")
    p.add_argument("--resume-dir", default=None,
                   help="save each seed's measurements here and reuse those of an earlier run with the same settings")
    p.add_argument("--workers", type=int, default=1,
                   help="measure the seeds in this many processes (the same runs and CPU time, less wall time)")
    p.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # a --workers child
    p.add_argument("overrides", nargs="*", help="recipe overrides for every variant, e.g. rrl.beta=0.3")
    args = parse_with_overrides(p)
    if args.late_from is None:
        args.late_from = [8, 6, 4] if args.task == "exact" else [None]
    if args.quick:
        args.seeds, args.steps, args.late_from = args.seeds[:2], 4, args.late_from[:1]
        args.samples, args.heldout, args.premise_samples, args.critic_pretrain = 8, 16, 8, min(args.critic_pretrain, 10)
    if "ppo" not in args.variants or "rrl" not in args.variants:
        raise SystemExit("--variants: ppo and rrl are needed (the RESULT line compares them)")
    return args


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from rise_nemo.core.comparison import paired_difference, pooled_rate, pooled_ratio

    args = parse_args()
    t0, c0, started = time.perf_counter(), cpu_seconds(), time.time()
    if args.workers > 1 and not args.measure_only and not args.resume_dir:
        import tempfile

        args.resume_dir = tempfile.mkdtemp(prefix="embedded_rrl_")
    premises = {} if args.measure_only else {lf: level_premise(args, lf) for lf in args.late_from}  # before training
    if args.workers > 1 and not args.measure_only:
        run_workers(__file__, sys.argv[1:], args.seeds, args.workers, ["--resume-dir", args.resume_dir])
    levels = {lf: run_level(args, lf, premises.get(lf), started) for lf in args.late_from}
    if args.measure_only:
        return 0
    cpu_s = cpu_seconds() - c0 + sum(lev["reused_cpu_s"] for lev in levels.values())  # a resumed run's earlier seeds

    def ratio(lf, key: str, which: str = "scratch", variant: str = "rrl"):
        ev = levels[lf]["evals"]
        return pooled_ratio(counts(ev[variant][which], key), counts(ev["ppo"][which], key),
                            counts(ev["ppo"][which], "n"), target=TARGET)

    main_lf = args.late_from[0]
    comparisons = {"hard_exact_ratio": ratio(main_lf, "exact"), "hard_answer_ratio": ratio(main_lf, "answer"),
                   "late_prefix_ratio": ratio(main_lf, "exact", "late_prefix")}
    if "rrl_ref" in args.variants:
        comparisons["ref_exact_ratio"] = ratio(main_lf, "exact", variant="rrl_ref")
    print(f"\nheld-out level {HELDOUT_LEVEL}: {len(args.seeds)} seeds x {args.heldout} fresh problems x {args.samples} "
          f"samples per variant (95% intervals over seeds and problems)")
    print(f"{'late from':>9} {'reach':>7} {'variant':>10} {'exact p@1':>27} {'answer p@1':>11} {'late-prefix exact':>27}")
    for lf, lev in levels.items():
        ev = lev["evals"]
        for variant in ["warm_start", *args.variants]:
            e = pooled_rate(counts(ev[variant]["scratch"], "exact"), counts(ev[variant]["scratch"], "n"))
            lp = pooled_rate(counts(ev[variant]["late_prefix"], "exact"), counts(ev[variant]["late_prefix"], "n"))
            print(f"{lf!s:>9} {lev['premise']['reach_rate']:>7.4f} {variant:>10} {e[0]:>9.4f} [{e[1]:.4f}, {e[2]:.4f}] "
                  f"{rate(ev[variant]['scratch'], 'answer'):>11.4f} {lp[0]:>9.4f} [{lp[1]:.4f}, {lp[2]:.4f}]")
        print(f"{'':>9} RRL / PPO exact {ratio(lf, 'exact').text()}, answer {ratio(lf, 'answer').text()}, "
              f"late-prefix exact {ratio(lf, 'exact', 'late_prefix').text()}")
    for name, iv in comparisons.items():
        print(f"  {name}: {iv.text()} (target {iv.target})")
    lev = levels[main_lf]
    easy = paired_difference([lev["easy"]["rrl"][s] for s in range(len(args.seeds))],
                             [lev["easy"]["ppo"][s] for s in range(len(args.seeds))], target=0.02)
    step_ratio = (sum(lev["step_cpu"]["rrl"]) / len(lev["step_cpu"]["rrl"])) / (
        sum(lev["step_cpu"]["ppo"]) / len(lev["step_cpu"]["ppo"]))
    print(f"easy (level 1) pass@1 RRL - PPO {easy.text(4)}; step CPU time RRL / PPO {step_ratio:.3f}; "
          f"CPU {cpu_s:.0f} s, wall {time.perf_counter() - t0:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({str(k): v for k, v in levels.items()} | {"cpu_s": cpu_s,
                                                                                      "args": vars(args)}, indent=1))
    fields = [f for name, iv in comparisons.items() for f in iv.fields(name)]
    if len(levels) > 1:
        for lf in levels:
            iv = ratio(lf, "exact")
            fields += [f"hard_exact_ratio_lf{lf}={iv.point:.4f}", f"hard_exact_ratio_lf{lf}_lo={iv.lo:.4f}",
                       f"hard_exact_ratio_lf{lf}_hi={iv.hi:.4f}", f"reach_lf{lf}={levels[lf]['premise']['reach_rate']:.4f}"]
    prem = lev["premise"]
    fields += [f"easy_pass1_delta={easy.point:.4f}", f"easy_pass1_delta_lo={easy.lo:.4f}",
               f"easy_pass1_delta_hi={easy.hi:.4f}", f"step_ratio={step_ratio:.4f}",
               f"critic_auc={_fmt(_mean([r['critic_auc_last5'] for r in lev['runs'] if r['variant'] == 'rrl']))}",
               f"pretrain_auc={_fmt(_mean([r.get('pretrain_auc_after') for r in lev['runs'] if r['variant'] == 'rrl']))}",
               f"reach_rate={prem['reach_rate']:.4f}", f"late_prefix_exact={prem['late_prefix_exact']:.4f}",
               f"scratch_exact={prem['scratch_exact']:.4f}", f"step1_accuracy={_fmt(prem['step_accuracy'][0])}",
               f"cancel_distance={prem['cancel_distance']}", f"seeds={len(args.seeds)}", f"steps={args.steps}",
               f"task={args.task}", f"cpu_s={cpu_s:.0f}"]
    print("RESULT " + " ".join(fields))
    return 0


def level_config(args: argparse.Namespace, late_from: int | None):
    """config(variant, seed) of one reach level (the recipe with the late skill from ``late_from``)."""
    from rise_nemo.config import load_config

    def config(variant: str, seed: int):
        return load_config(REPO / "recipes" / TASKS[args.task], [
            f"run.seed={seed}", f"train.steps={args.steps}", f"ppo.critic_pretrain_updates={args.critic_pretrain}",
            *([f"data.task.late_from={late_from}"] if late_from is not None else []), *VARIANTS[variant],
            *args.overrides])

    return config


def level_premise(args: argparse.Namespace, late_from: int | None) -> dict:
    """The premise of one reach level on the warm start (built here if it is not cached), printed."""
    from rise_nemo.loop.data import chain_task
    from rise_nemo.loop.warm_start import warm_started_backend

    cfg0 = level_config(args, late_from)("ppo", args.seeds[0])
    task = chain_task(cfg0)
    lf = task.cfg.late_from or 8  # the control task has no late skill: its same position
    _, generator, stats = warm_started_backend(cfg0, progress=True)
    premise = measure_premise(cfg0, generator, task, lf, args.premise_samples)
    print(f"== task {args.task}, late skill from step {lf}: premise on the warm start ({stats.get('cache_path')}), "
          "before training: " + json.dumps(premise), flush=True)
    return premise


def run_level(args: argparse.Namespace, late_from: int | None, premise: dict | None, started: float) -> dict:
    """Every seed and variant at one position of the late skill (one reach level). Seeds saved in
    --resume-dir by an earlier invocation (measured before ``started``) add their recorded CPU time."""
    from rise_nemo.backends import build_critic
    from rise_nemo.loop.data import PromptSampler, chain_task
    from rise_nemo.loop.warm_start import evaluate_heldout, warm_started_backend
    from rise_nemo.methods.registry import get_method
    from rise_nemo.steps.critic_pretrain import pretrain_critic
    from rise_nemo.steps.reasoning import ReasoningContext, make_hooks, reasoning_train_step
    from rise_nemo.steps.verifiers import build_verifier

    config = level_config(args, late_from)
    cfg0 = config("ppo", args.seeds[0])
    task = chain_task(cfg0)
    lf = task.cfg.late_from or 8
    _, generator, _ = warm_started_backend(cfg0)
    train_levels = list(cfg0.data.task.train_levels)
    easy_problems = [p for p in task.heldout if p.difficulty == 1]

    evals = {v: {"scratch": [], "late_prefix": []} for v in ["warm_start", *args.variants]}
    easy: dict[str, list[float]] = {v: [] for v in args.variants}
    step_cpu: dict[str, list[float]] = {v: [] for v in args.variants}
    runs, reused_cpu = [], 0.0
    spec = {k: v for k, v in vars(args).items()
            if k not in ("seeds", "late_from", "out", "resume_dir", "quick", "workers", "measure_only")}

    def run_seed(seed: int) -> dict:
        train, heldout = seed_problems(task, seed, train_levels, int(cfg0.data.task.train_per_level), HELDOUT_LEVEL,
                                       args.heldout)
        prefixes = late_prefixes(generator, heldout, lf)
        seed_cfg = config("ppo", seed)  # the seed's evaluation stream
        out = {"evals": {"warm_start": {"scratch": score_samples(seed_cfg, generator, heldout, args.samples),
                                        "late_prefix": score_samples(seed_cfg, generator, heldout, args.samples,
                                                                     prefixes=prefixes)}},
               "easy": {}, "step_cpu": {}, "runs": []}
        pretrained = None
        for variant in args.variants:
            cfg = config(variant, seed)
            policy, gen, _ = warm_started_backend(cfg)
            verifier, step_accuracy = build_verifier(cfg)
            method = get_method(str(cfg.method))
            critic = build_critic(cfg, policy)
            ctx = ReasoningContext(cfg=cfg, policy=policy, generator=gen, verifier=verifier, method=method,
                                   critic=critic, pad_id=_pad(gen), rng=random.Random(seed),
                                   hooks=make_hooks(method, cfg, len(train)), step_accuracy=step_accuracy)
            pre = {}
            if args.critic_pretrain and pretrained is None:  # once per seed: every variant starts from it
                pre = pretrain_critic(ctx, train, seed)
                pretrained = (critic.state_dict(), pre)
            elif pretrained is not None:
                critic.load_state_dict(pretrained[0])
                pre = pretrained[1]
            sampler = PromptSampler(train, int(cfg.sampling.prompts_per_step), seed, True)
            steps, cpu = [], []
            for step in range(1, args.steps + 1):
                c = cpu_seconds()
                steps.append(reasoning_train_step(ctx, sampler.next_batch(), step))
                cpu.append(cpu_seconds() - c)
            ev = {"scratch": score_samples(cfg, gen, heldout, args.samples),
                  "late_prefix": score_samples(cfg, gen, heldout, args.samples, prefixes=prefixes)}
            out["evals"][variant], out["step_cpu"][variant] = ev, cpu
            out["easy"][variant] = evaluate_heldout(cfg, gen, easy_problems, args.samples)["levels"]["1"]["pass_at_k"]["1"]
            rec = {"seed": seed, "variant": variant, "late_from": lf, "exact": rate([ev["scratch"]], "exact"),
                   "answer": rate([ev["scratch"]], "answer"), "late_prefix_exact": rate([ev["late_prefix"]], "exact"),
                   "easy_pass1": out["easy"][variant],
                   "train_reward_last5": _mean([m["reward/mean"] for m in steps[-5:]]), "step_cpu_s": _mean(cpu),
                   "replay_fraction": _mean([m.get("rrl/replay_fraction") for m in steps]),
                   "solve_rate_replayed": _mean([m.get("rrl/solve_rate_replayed") for m in steps]),
                   "states_dropped": sum(m.get("rrl/states_dropped") or 0 for m in steps),
                   "explained_variance_last5": _mean([m.get("critic/explained_variance") for m in steps[-5:]]),
                   "critic_auc_last5": _mean([m.get("critic/auc") for m in steps[-5:]]),
                   "pretrain_auc_after": pre.get("critic_pretrain/auc_after")}
            out["runs"].append(rec)
            print(json.dumps(rec), flush=True)
        return out

    for seed in args.seeds:
        got = resumable(args.resume_dir, f"{args.task}_lf{lf}_s{seed}", {**spec, "late_from": lf, "seed": seed},
                        lambda seed=seed: run_seed(seed))
        if got.get("reused") and got.get("measured_at", 0.0) < started:  # else a --workers child measured it
            reused_cpu += got["cpu_s"]
            print(f"seed {seed}: measurements reused from {args.resume_dir}", flush=True)
        for v in ["warm_start", *args.variants]:
            for which in ("scratch", "late_prefix"):
                evals[v][which].append(got["evals"][v][which])
        for v in args.variants:
            easy[v].append(got["easy"][v])
            step_cpu[v] += got["step_cpu"][v]
        runs += got["runs"]
    return {"premise": premise, "evals": evals, "easy": easy, "step_cpu": step_cpu, "runs": runs,
            "reused_cpu_s": reused_cpu}


def late_prefixes(generator, problems, late_from: int) -> list[list[int]]:
    """Token ids of each problem's clean reference cut before step ``late_from`` (no EOS)."""
    from rise_nemo.data.chain_task import step_prefixes
    from rise_nemo.steps.rollouts import encode_response

    return [encode_response(generator, step_prefixes(p)[late_from - 1])[:-1] for p in problems]


def measure_premise(cfg, generator, task, late_from: int, samples: int) -> dict:
    """On the warm start, the task's own held-out level-10 problems x ``samples`` (the evaluation stream of step
    0): the reach rate of step ``late_from`` with a correct prefix, pass@1 (answer, exact) from scratch and from
    the clean prefix before it, the step accuracy at each position given a correct prefix, and the error modes."""
    from rise_nemo.data.chain_task import reach_profile
    from rise_nemo.loop.data import _plain
    from rise_nemo.tasks.reasoning import ReasoningWarmStartConfig, error_shift_distance

    problems = [p for p in task.heldout if p.difficulty == HELDOUT_LEVEL]
    texts = sample_texts(cfg, generator, problems, samples)
    late = score_samples(cfg, generator, problems, samples, prefixes=late_prefixes(generator, problems, late_from))
    profile = reach_profile(problems, texts, late_from)
    scratch = score_texts(problems, texts)
    wcfg = ReasoningWarmStartConfig.from_mapping({k: v for k, v in _plain(cfg.data.warm_start).items()
                                                  if k != "enabled"})
    offsets = wcfg.error_offsets(task.cfg.late_from)
    # how close 10 or fewer injected errors come to 0 mod M (0: some wrong path reaches the right answer)
    distance, closest = error_shift_distance(offsets, task.cfg.modulus) if offsets else (-1, [])
    return {"late_from": late_from, "rollouts": profile["responses"], "reach_rate": profile["reach_rate"],
            "scratch_answer": rate([scratch], "answer"), "scratch_exact": rate([scratch], "exact"),
            "late_prefix_answer": rate([late], "answer"), "late_prefix_exact": rate([late], "exact"),
            "step_accuracy": [None if a is None else round(a, 4) for a in profile["step_accuracy"]],
            "error_offsets": offsets,
            "cancel_distance": distance, "cancelling": [list(c) for c in closest] if distance == 0 else []}


def _pad(generator) -> int:
    from rise_nemo.steps.rollouts import pad_id_of

    return pad_id_of(generator)


def _fmt(x) -> str:
    return "nan" if x is None else f"{x:.4f}"


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


if __name__ == "__main__":
    raise SystemExit(main())
