"""RRL benchmark on the embedded chained-arithmetic task (docs/DESIGN.md §7.5, §9).

Two tasks (--tasks): ``premise`` = recipes/rrl_chain_late_tiny_cpu.yaml, the chain task with a LATE-ONLY
SKILL (steps 8.. use operands 6..12 and their own warm-start error mode), where RRL's premise holds; and
``control`` = recipes/rrl_chain_tiny_cpu.yaml, today's task (flat per-step error, one skill), where it
does not. Variants with the SAME step budget (--steps) from the task's cached warm start, per seed:

  ppo      PPO (critic + GAE), the baseline
  rrl      RRL: PPO + replay of states from policy AND canonical solutions (beta 0.4, 5 states per problem)
  rrl_ref  RRL whose candidate states are scored by the reference judge's prefix score instead of V
           (``rrl.state_scorer=reference``; beyond the paper)
  rrl_cs   states only from canonical solutions (the paper's "CS" ablation)
  rrl_pgs  states only from policy-generated solutions ("PGS")

Within a task every variant is the same recipe (PPO: ``method=ppo``: identical data, sampling and optimiser
settings), the seed changes the RL sampling stream, the prompt order and the evaluation stream; within a
seed every variant is evaluated with the same sampling seed on the same held-out problems (never in the warm
start). Every critic (PPO's too) is first pre-trained on the warm start's rollouts (--critic-pretrain
updates, ``ppo.critic_pretrain_*``; 0 = off).

Premise, printed BEFORE training (warm start, hardest level, --samples per problem, T = eval temperature):
  late_reach_rate     fraction of from-scratch rollouts whose first late_from - 1 steps are all correct
                      (they reach the first late step with a correct prefix)
  late_prefix_pass1   pass@1 when continuing the clean reference cut before the first late step
  scratch_pass1       pass@1 from scratch
(on the control task the same position, without a late skill there).

Measured (premise task; worst seed):
  hard_pass1_ratio  RRL / PPO pass@1 on the hardest held-out level (target >= 1.5); nan when both are 0,
                    inf when only PPO's is 0
  hard_pass8_ratio  the same for the unbiased pass@8
  easy_pass1_delta  RRL - PPO pass@1 on the easiest held-out level (target >= -0.02)
  step_ratio        RRL / PPO mean training-step time, measured side by side in this process (target <= 1.25)
  ref_hard_pass1_ratio  rrl_ref / PPO hard pass@1 (when rrl_ref runs)
  control_ratio     RRL / PPO hard pass@1 on the control task (expected near 1)
  critic_auc        RRL's critic/auc (correct-so-far vs already-wrong prefixes, steps.reasoning.prefix_value_auc)
                    over the last 5 steps, mean over seeds; pretrain_auc: after pre-training, held-out rollouts

Ends with
    RESULT hard_pass1_ratio=... hard_pass8_ratio=... easy_pass1_delta=... seeds=3 step_ratio=... control_ratio=...
           critic_auc=... ref_hard_pass1_ratio=... late_reach_rate=... late_prefix_pass1=... scratch_pass1=...

Usage: python bench/embedded_rrl.py [--steps 40] [--seeds 0 1 2] [--samples 16] [--eval-per-level N]
       [--tasks premise control] [--variants ppo rrl rrl_ref rrl_cs rrl_pgs] [--critic-pretrain 100]
       [--out F] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._cli import parse_with_overrides  # noqa: E402

TASKS = {"premise": "rrl_chain_late_tiny_cpu.yaml", "control": "rrl_chain_tiny_cpu.yaml"}
VARIANTS = {
    "ppo": ["method=ppo"],
    "rrl": ["method=rrl", "rrl.state_sources=[policy, canonical]"],
    "rrl_ref": ["method=rrl", "rrl.state_sources=[policy, canonical]", "rrl.state_scorer=reference"],
    "rrl_cs": ["method=rrl", "rrl.state_sources=[canonical]"],
    "rrl_pgs": ["method=rrl", "rrl.state_sources=[policy]"],
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--samples", type=int, default=16, help="samples per held-out problem (>= 8 for pass@8)")
    p.add_argument("--eval-per-level", type=int, default=None, help="held-out problems per level (default: all)")
    p.add_argument("--variants", nargs="+", default=["ppo", "rrl", "rrl_ref"], choices=list(VARIANTS))
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--critic-pretrain", type=int, default=100,
                   help="critic pre-training updates on warm-start rollouts for every variant (0 = off)")
    p.add_argument("--out", default=None, help="write every measurement as JSON here")
    p.add_argument("overrides", nargs="*", help="recipe overrides for every variant, e.g. rrl.beta=0.3")
    return parse_with_overrides(p)


def ratio(a: float, b: float) -> float:
    if b > 0:
        return a / b
    return math.nan if a == 0 else math.inf


def main() -> int:
    import torch

    torch.set_num_threads(1)
    args = parse_args()
    t0 = time.perf_counter()
    out: dict = {}
    for task in args.tasks:
        out[task] = run_task(args, task)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"total {time.perf_counter() - t0:.0f} s")
    main_task = "premise" if "premise" in out else args.tasks[0]
    res = out[main_task]["summary"]
    if "ppo" not in args.variants or "rrl" not in args.variants:  # a part of a run (merge the --out files)
        print("no RESULT: --variants without ppo and rrl measure records only")
        return 0
    fields = [f"hard_pass1_ratio={res['hard_pass1_ratio']:.4f}", f"hard_pass8_ratio={res['hard_pass8_ratio']:.4f}",
              f"easy_pass1_delta={res['easy_pass1_delta']:.4f}", f"seeds={len(args.seeds)}",
              f"step_ratio={res['step_ratio']:.4f}"]
    if "control" in out:
        fields.append(f"control_ratio={out['control']['summary']['hard_pass1_ratio']:.4f}")
    fields.append(f"critic_auc={_fmt(res['critic_auc'])}")
    fields.append(f"pretrain_auc={_fmt(res['pretrain_auc'])}")
    if "ref_hard_pass1_ratio" in res:
        fields.append(f"ref_hard_pass1_ratio={res['ref_hard_pass1_ratio']:.4f}")
    prem = out[main_task]["premise"]
    fields += [f"late_reach_rate={prem['late_reach_rate']:.4f}", f"late_prefix_pass1={prem['late_prefix_pass1']:.4f}",
               f"scratch_pass1={prem['scratch_pass1']:.4f}", f"steps={args.steps}", f"task={main_task}"]
    print("RESULT " + " ".join(fields))
    return 0


def run_task(args: argparse.Namespace, task: str) -> dict:
    from rise_nemo.backends import build_critic
    from rise_nemo.config import load_config
    from rise_nemo.loop.data import PromptSampler, load_prompts
    from rise_nemo.loop.warm_start import evaluate_heldout, warm_started_backend
    from rise_nemo.methods.registry import get_method
    from rise_nemo.steps.critic_pretrain import pretrain_critic
    from rise_nemo.steps.reasoning import ReasoningContext, make_hooks, reasoning_train_step
    from rise_nemo.steps.rollouts import pad_id_of
    from rise_nemo.steps.verifiers import build_verifier

    def config(variant: str, seed: int):
        return load_config(REPO / "recipes" / TASKS[task], [
            f"run.seed={seed}", f"train.steps={args.steps}", f"ppo.critic_pretrain_updates={args.critic_pretrain}",
            *VARIANTS[variant], *args.overrides])

    cfg0 = config("ppo", args.seeds[0])
    late_from = load_config(REPO / "recipes" / TASKS["premise"]).data.task.late_from  # the same position on both
    _, heldout = load_prompts(cfg0)
    levels = sorted({p.difficulty for p in heldout})
    easy, hard = levels[0], levels[-1]
    problems = [p for p in heldout if p.difficulty in (easy, hard)]
    if args.eval_per_level:
        problems = [p for lv in (easy, hard) for p in [q for q in problems if q.difficulty == lv][: args.eval_per_level]]
    print(f"== task {task} ({TASKS[task]}): training levels {list(cfg0.data.task.train_levels)}, "
          f"{cfg0.data.task.train_per_level} problems each; evaluation: levels {easy} and {hard}, {len(problems)} "
          f"held-out problems x {args.samples} samples", flush=True)

    records, by_seed = [], {}
    step_times: dict[str, list[float]] = {v: [] for v in args.variants}
    premise = None
    for seed in args.seeds:
        by_seed[seed] = {}
        for variant in args.variants:
            cfg = config(variant, seed)
            policy, generator, _ = warm_started_backend(cfg)
            train, _ = load_prompts(cfg)
            verifier, step_accuracy = build_verifier(cfg)
            if premise is None:  # before any training: the premise, on the warm start
                premise = measure_premise(cfg, generator, verifier, [p for p in problems if p.difficulty == hard],
                                          late_from, args.samples)
                print(f"premise ({task}, warm start, level {hard}, from step {late_from}): " + json.dumps(premise),
                      flush=True)
            if not by_seed[seed]:  # the warm start itself, on this seed's (step-0) evaluation stream
                base = evaluate_heldout(cfg, generator, problems, args.samples)
                by_seed[seed]["warm_start"] = rec = {"seed": seed, "variant": "warm_start", **_levels(base, easy, hard,
                                                                                                        args.samples)}
                records.append(rec)
                print(json.dumps(rec), flush=True)
            method = get_method(str(cfg.method))
            ctx = ReasoningContext(cfg=cfg, policy=policy, generator=generator, verifier=verifier, method=method,
                                   critic=build_critic(cfg, policy), pad_id=pad_id_of(generator),
                                   rng=random.Random(seed), hooks=make_hooks(method, cfg, len(train)),
                                   step_accuracy=step_accuracy)
            pre = pretrain_critic(ctx, train, seed) if int(cfg.ppo.critic_pretrain_updates) else {}
            sampler = PromptSampler(train, int(cfg.sampling.prompts_per_step), seed, True)
            steps = []
            for step in range(1, args.steps + 1):
                steps.append(reasoning_train_step(ctx, sampler.next_batch(), step))
            step_times[variant] += [m["time/step_s"] for m in steps]
            ev = evaluate_heldout(cfg, generator, problems, args.samples)  # the same stream as the warm start's
            stabilised = next((m["step"] for m in steps if m.get("rrl/stabilised")), None)
            rec = {"seed": seed, "variant": variant, **_levels(ev, easy, hard, args.samples),
                   "train_reward_first5": _mean([m["reward/mean"] for m in steps[:5]]),
                   "train_reward_last5": _mean([m["reward/mean"] for m in steps[-5:]]),
                   "step_s": _mean([m["time/step_s"] for m in steps]),
                   "replay_fraction": _mean([m.get("rrl/replay_fraction") for m in steps]),
                   "solve_rate_replayed": _mean([m.get("rrl/solve_rate_replayed") for m in steps]),
                   "buffer_size_final": steps[-1].get("rrl/buffer_size"), "stabilised_at_step": stabilised,
                   "states_dropped": sum(m.get("rrl/states_dropped") or 0 for m in steps),
                   "ppl_variance_last5": _mean([m.get("diversity/ppl_variance") for m in steps[-5:]]),
                   "explained_variance_last5": _mean([m.get("critic/explained_variance") for m in steps[-5:]]),
                   "critic_auc_first5": _mean([m.get("critic/auc") for m in steps[:5]]),
                   "critic_auc_last5": _mean([m.get("critic/auc") for m in steps[-5:]]),
                   "pretrain_auc_before": pre.get("critic_pretrain/auc_before"),
                   "pretrain_auc_after": pre.get("critic_pretrain/auc_after"),
                   "pretrain_s": pre.get("critic_pretrain/seconds")}
            by_seed[seed][variant] = rec
            records.append(rec)
            print(json.dumps(rec), flush=True)

    print(f"\n{'seed':>4} {'variant':>10} {'easy p@1':>9} {'hard p@1':>9} {'hard p@8':>9} {'hard acc':>9} {'step s':>7} "
          f"{'replay':>7} {'solved@replay':>13} {'r last5':>8} {'auc last5':>9}")
    for r in records:
        print(f"{r['seed']:>4} {r['variant']:>10} {_f(r['easy_pass1'])} {_f(r['hard_pass1'])} {_f(r['hard_pass8'])} "
              f"{_f(r.get('hard_step_accuracy'))} {_f(r.get('step_s'), 7)} {_f(r.get('replay_fraction'), 7)} "
              f"{_f(r.get('solve_rate_replayed'), 13)} {_f(r.get('train_reward_last5'), 8)} "
              f"{_f(r.get('critic_auc_last5'))}")
    runs = by_seed.values()
    if "ppo" not in args.variants or "rrl" not in args.variants:
        return {"premise": premise, "runs": records, "step_times": step_times, "summary": {}}
    summary = {
        "hard_pass1_ratio": _worst([ratio(s["rrl"]["hard_pass1"], s["ppo"]["hard_pass1"]) for s in runs]),
        "hard_pass8_ratio": _worst([ratio(s["rrl"]["hard_pass8"] or 0.0, s["ppo"]["hard_pass8"] or 0.0) for s in runs]),
        "easy_pass1_delta": min(s["rrl"]["easy_pass1"] - s["ppo"]["easy_pass1"] for s in runs),
        "step_ratio": _mean(step_times["rrl"]) / _mean(step_times["ppo"]),
        "critic_auc": _mean([s["rrl"]["critic_auc_last5"] for s in runs]),
        "pretrain_auc": _mean([s["rrl"]["pretrain_auc_after"] for s in runs]),
    }
    if "rrl_ref" in args.variants:
        summary["ref_hard_pass1_ratio"] = _worst([ratio(s["rrl_ref"]["hard_pass1"], s["ppo"]["hard_pass1"]) for s in runs])
    print(f"summary ({task}): {json.dumps(summary)}", flush=True)
    return {"premise": premise, "runs": records, "step_times": step_times, "summary": summary}


def measure_premise(cfg, generator, verifier, problems, late_from: int, samples: int) -> dict:
    """Reach rate of the first late step with a correct prefix, and pass@1 from the clean reference cut before
    it vs from scratch, on the warm start (the evaluation sampling parameters, their step-0 stream)."""
    from rise_nemo.data.chain_task import leading_correct_steps, step_prefixes
    from rise_nemo.steps.rollouts import encode_response, eval_sampling_params

    params = eval_sampling_params(cfg, 0)
    scratch = generator.generate([list(p.messages) for p in problems], samples, params)
    flat = [(p, r.response_text) for p, g in zip(problems, scratch) for r in g]
    reached = sum(leading_correct_steps(p, text) >= late_from - 1 for p, text in flat)
    scratch_ok = sum(bool(v) for v in verifier.verify([p for p, _ in flat], [t for _, t in flat]))
    prefixes = [encode_response(generator, step_prefixes(p)[late_from - 1])[:-1] for p in problems]  # no EOS
    late = generator.generate([list(p.messages) for p in problems], samples, params, prefixes=prefixes)
    late_flat = [(p, r.response_text) for p, g in zip(problems, late) for r in g]
    late_ok = sum(bool(v) for v in verifier.verify([p for p, _ in late_flat], [t for _, t in late_flat]))
    return {"late_from": late_from, "rollouts": len(flat), "late_reach_rate": reached / len(flat),
            "late_prefix_pass1": late_ok / len(late_flat), "scratch_pass1": scratch_ok / len(flat)}


def _fmt(x) -> str:
    return "nan" if x is None else f"{x:.4f}"


def _levels(ev: dict, easy: int, hard: int, samples: int) -> dict:
    lv_e, lv_h = ev["levels"][str(easy)], ev["levels"][str(hard)]
    return {"easy_pass1": lv_e["pass_at_k"]["1"], "hard_pass1": lv_h["pass_at_k"]["1"],
            "hard_pass8": lv_h["pass_at_k"].get(str(min(8, samples))), "hard_step_accuracy": lv_h.get("step_accuracy")}


def _worst(values: list[float]) -> float:
    """The worst seed's ratio; nan (both variants 0 on some seed) counts as worst."""
    return math.nan if any(math.isnan(v) for v in values) else min(values)


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _f(x, width: int = 9) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:{width}.4f}"


if __name__ == "__main__":
    raise SystemExit(main())
