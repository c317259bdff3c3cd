"""RRL benchmark on the embedded chained-arithmetic task (docs/DESIGN.md §7.5, §9).

Four variants with the SAME step budget (--steps) from the same cached warm start, per seed:

  ppo      PPO (critic + GAE), the baseline
  rrl      RRL: PPO + replay of states from policy AND canonical solutions (beta 0.4, 5 states per problem)
  rrl_cs   states only from canonical solutions (the paper's "CS" ablation)
  rrl_pgs  states only from policy-generated solutions ("PGS")

Every variant is recipes/rrl_chain_tiny_cpu.yaml (PPO: ``method=ppo``, so the data, sampling and optimiser
settings are identical: the small training set on which problems come back every few steps), the seed
changes the RL sampling stream, the prompt order and the evaluation stream; within a seed every variant is
evaluated with the same sampling seed on the same held-out problems (never in the warm start).

Measured:
  hard_pass1_ratio  RRL / PPO pass@1 on the hardest held-out level, worst seed (target >= 1.5); nan when both
                    are 0, inf when only PPO's is 0
  hard_pass8_ratio  the same for the unbiased pass@8
  easy_pass1_delta  RRL - PPO pass@1 on the easiest held-out level, worst seed (target >= -0.02)
  step_ratio        RRL / PPO mean training-step time, measured side by side in this process (target <= 1.25)

Ends with
    RESULT hard_pass1_ratio=... hard_pass8_ratio=... easy_pass1_delta=... seeds=3 step_ratio=...

Usage: python bench/embedded_rrl.py [--steps 20] [--seeds 0 1 2] [--samples 16] [--eval-per-level N]
       [--variants ppo rrl rrl_cs rrl_pgs] [--out F] [key=value ...]
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

RECIPE = "rrl_chain_tiny_cpu.yaml"
VARIANTS = {
    "ppo": ["method=ppo"],
    "rrl": ["method=rrl", "rrl.state_sources=[policy, canonical]"],
    "rrl_cs": ["method=rrl", "rrl.state_sources=[canonical]"],
    "rrl_pgs": ["method=rrl", "rrl.state_sources=[policy]"],
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--samples", type=int, default=16, help="samples per held-out problem (>= 8 for pass@8)")
    p.add_argument("--eval-per-level", type=int, default=None, help="held-out problems per level (default: all)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
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
    from rise_nemo.backends import build_critic
    from rise_nemo.config import load_config
    from rise_nemo.methods import get_method
    from rise_nemo.orchestration.data import PromptSampler, load_prompts, reasoning_tools
    from rise_nemo.orchestration.reasoning_step import ReasoningContext, reasoning_train_step
    from rise_nemo.orchestration.reasoning_warm_start import evaluate_heldout, warm_started_backend
    from rise_nemo.orchestration.rrl import make_step_hooks
    from rise_nemo.orchestration.tokens import pad_id_of

    args = parse_args()
    if "ppo" not in args.variants or "rrl" not in args.variants:
        raise SystemExit("--variants must include ppo and rrl (the RESULT compares them)")
    t0 = time.perf_counter()

    def config(variant: str, seed: int):
        return load_config(REPO / "recipes" / RECIPE, [f"run.seed={seed}", f"train.steps={args.steps}",
                                                       *VARIANTS[variant], *args.overrides])

    cfg0 = config("ppo", args.seeds[0])
    _, heldout = load_prompts(cfg0)
    levels = sorted({p.difficulty for p in heldout})
    easy, hard = levels[0], levels[-1]
    problems = [p for p in heldout if p.difficulty in (easy, hard)]
    if args.eval_per_level:
        problems = [p for lv in (easy, hard) for p in [q for q in problems if q.difficulty == lv][: args.eval_per_level]]
    print(f"training levels {list(cfg0.data.task.train_levels)}, {cfg0.data.task.train_per_level} problems each; "
          f"evaluation: levels {easy} and {hard}, {len(problems)} held-out problems x {args.samples} samples",
          flush=True)

    records, by_seed = [], {}
    step_times: dict[str, list[float]] = {v: [] for v in args.variants}
    for seed in args.seeds:
        by_seed[seed] = {}
        for variant in args.variants:
            cfg = config(variant, seed)
            policy, generator, _ = warm_started_backend(cfg)
            train, _ = load_prompts(cfg)
            verifier, _ = reasoning_tools(cfg)
            if not by_seed[seed]:  # the warm start itself, on this seed's (step-0) evaluation stream
                base = evaluate_heldout(cfg, generator, problems, args.samples)
                by_seed[seed]["warm_start"] = rec = {"seed": seed, "variant": "warm_start", **_levels(base, easy, hard,
                                                                                                        args.samples)}
                records.append(rec)
                print(json.dumps(rec), flush=True)
            method = get_method(str(cfg.method))
            ctx = ReasoningContext(cfg=cfg, policy=policy, generator=generator, verifier=verifier, method=method,
                                   critic=build_critic(cfg, policy), pad_id=pad_id_of(generator),
                                   rng=random.Random(seed), hooks=make_step_hooks(cfg, method.name, len(train)))
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
                   "ppl_variance_last5": _mean([m.get("diversity/ppl_variance") for m in steps[-5:]]),
                   "explained_variance_last5": _mean([m.get("critic/explained_variance") for m in steps[-5:]])}
            by_seed[seed][variant] = rec
            records.append(rec)
            print(json.dumps(rec), flush=True)

    print(f"\n{'seed':>4} {'variant':>10} {'easy p@1':>9} {'hard p@1':>9} {'hard p@8':>9} {'hard acc':>9} {'step s':>7} "
          f"{'replay':>7} {'solved@replay':>13} {'r last5':>8}")
    for r in records:
        print(f"{r['seed']:>4} {r['variant']:>10} {_f(r['easy_pass1'])} {_f(r['hard_pass1'])} {_f(r['hard_pass8'])} "
              f"{_f(r.get('hard_step_accuracy'))} {_f(r.get('step_s'), 7)} {_f(r.get('replay_fraction'), 7)} {_f(r.get('solve_rate_replayed'), 13)} "
              f"{_f(r.get('train_reward_last5'), 8)}")
    p1 = [ratio(s["rrl"]["hard_pass1"], s["ppo"]["hard_pass1"]) for s in by_seed.values()]
    p8 = [ratio(s["rrl"]["hard_pass8"] or 0.0, s["ppo"]["hard_pass8"] or 0.0) for s in by_seed.values()]
    delta = [s["rrl"]["easy_pass1"] - s["ppo"]["easy_pass1"] for s in by_seed.values()]
    step_ratio = _mean(step_times["rrl"]) / _mean(step_times["ppo"])
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": records, "step_times": step_times}, indent=1))
    print(f"total {time.perf_counter() - t0:.0f} s")
    print(f"RESULT hard_pass1_ratio={_worst(p1):.4f} hard_pass8_ratio={_worst(p8):.4f} "
          f"easy_pass1_delta={min(delta):.4f} seeds={len(args.seeds)} step_ratio={step_ratio:.4f}")
    return 0


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
