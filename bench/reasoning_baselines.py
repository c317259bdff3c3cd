"""Reasoning baselines benchmark: PPO (critic + GAE) and sparse GRPO on the embedded
chained-arithmetic task (rise_nemo/data/chain_task.py, docs/DESIGN.md §7).

1. Warm start once (cached under $RISE_NEMO_CACHE, default ~/.cache/rise_nemo) from
   recipes/reasoning_base_local.yaml and measure the warm start on held-out instances (never in the warm
   start): short (1-step) pass@1, longest level pass@1 and pass@8 (unbiased estimator, n samples/problem),
   per-step accuracy per level.
2. For every seed and method: from the warm-started weights, --steps RL steps on the recipe's training
   levels (the hard levels, where from-scratch success is rare), then held-out pass@1 on the same levels.
   gain = pass@1 after - pass@1 of the warm start, both measured on the same problems with the same
   sampling seed (the seed changes the RL sampling stream, the prompt order and the evaluation stream).

Ends with
    RESULT short_pass1_base=... long_pass1_base=... long_pass8_base=... ppo_gain=<worst seed> grpo_gain=<worst seed>

Usage: python bench/reasoning_baselines.py [--steps 20] [--seeds 0 1 2] [--samples 8] [--eval-per-level N] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._cli import parse_with_overrides  # noqa: E402

RECIPES = {"ppo": "ppo_chain_tiny_cpu.yaml", "grpo": "grpo_chain_tiny_cpu.yaml"}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--samples", type=int, default=8, help="samples per held-out problem (>= 8 for pass@8)")
    p.add_argument("--eval-per-level", type=int, default=None,
                   help="held-out problems per level in the gain evaluations (default: all)")
    p.add_argument("--methods", nargs="+", default=["ppo", "grpo"], choices=sorted(RECIPES))
    p.add_argument("--out", default=None, help="write every measurement as JSON here")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. local.lr=2e-4")
    return parse_with_overrides(p)


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from rise_nemo.backends import build_critic
    from rise_nemo.config import load_config
    from rise_nemo.loop.data import PromptSampler, load_prompts
    from rise_nemo.loop.warm_start import (
        evaluate_heldout,
        format_warm_start_properties,
        warm_start_properties,
        warm_started_backend,
    )
    from rise_nemo.methods.registry import get_method
    from rise_nemo.steps.reasoning import ReasoningContext, reasoning_train_step
    from rise_nemo.steps.reasoning_eval import format_reasoning_eval
    from rise_nemo.steps.rollouts import pad_id_of
    from rise_nemo.steps.verifiers import build_verifier

    args = parse_args()
    recipes = REPO / "recipes"
    t0 = time.perf_counter()

    def setup(method: str, seed: int):
        cfg = load_config(recipes / RECIPES[method], [f"run.seed={seed}", f"train.steps={args.steps}", *args.overrides])
        return (cfg, *warm_started_backend(cfg, progress=False))

    def evaluate(cfg, generator, problems):  # the step-0 evaluation stream of cfg's run.seed
        return evaluate_heldout(cfg, generator, problems, args.samples)

    base_cfg, policy, generator, stats = setup("grpo", args.seeds[0])
    print(f"warm start: {stats}", flush=True)
    train_levels = set(base_cfg.data.task.train_levels)
    _, heldout = load_prompts(base_cfg)
    max_level = max(p.difficulty for p in heldout)
    # The warm start's properties: the short (1-step) and the longest level, every held-out problem.
    base_all = evaluate(base_cfg, generator, [p for p in heldout if p.difficulty in (1, max_level)])
    print(format_reasoning_eval(base_all), flush=True)
    props = warm_start_properties(base_all)
    print(format_warm_start_properties(props), flush=True)
    short_pass1, long_pass1, long_pass8 = props["short_pass1"], props["long_pass1"], props["long_pass8"]
    hard = [p for p in heldout if p.difficulty in train_levels]
    if args.eval_per_level:
        hard = [p for lv in sorted(train_levels) for p in [q for q in hard if q.difficulty == lv][: args.eval_per_level]]
    print(f"RL trains on levels {sorted(train_levels)}; gains are measured on their {len(hard)} held-out problems",
          flush=True)

    gains: dict[str, list[float]] = {m: [] for m in args.methods}
    records = []
    for seed in args.seeds:
        base = None  # the warm start on this seed's evaluation stream (identical for every method)
        for method in args.methods:
            cfg, policy, generator, _ = setup(method, seed)
            if base is None:
                base = evaluate(cfg, generator, hard)["pass_at_1"]
            train, _ = load_prompts(cfg)
            verifier, _ = build_verifier(cfg)
            m = get_method(method)
            critic = build_critic(cfg, policy) if m.critic else None
            ctx = ReasoningContext(cfg=cfg, policy=policy, generator=generator, verifier=verifier, method=m,
                                   critic=critic, pad_id=pad_id_of(generator))
            sampler = PromptSampler(train, int(cfg.sampling.prompts_per_step), seed, True)
            t_run = time.perf_counter()
            rewards = []
            for step in range(1, args.steps + 1):
                metrics = reasoning_train_step(ctx, sampler.next_batch(), step)
                rewards.append(metrics["reward/mean"])
            after = evaluate(cfg, generator, hard)["pass_at_1"]
            gains[method].append(after - base)
            rec = {"seed": seed, "method": method, "base_pass1": base, "after_pass1": after, "gain": after - base,
                   "train_reward_first5": sum(rewards[:5]) / 5, "train_reward_last5": sum(rewards[-5:]) / 5,
                   "seconds": time.perf_counter() - t_run}
            records.append(rec)
            print(json.dumps(rec), flush=True)

    if args.out:
        Path(args.out).write_text(json.dumps({"base": base_all, "runs": records}, indent=1))
    print(f"total {time.perf_counter() - t0:.0f} s")
    worst = {m: min(v) for m, v in gains.items()}
    fields = [f"short_pass1_base={short_pass1:.4f}", f"long_pass1_base={long_pass1:.4f}",
              f"long_pass8_base={long_pass8:.4f}" if long_pass8 is not None else "long_pass8_base=nan"]
    fields += [f"{m}_gain={worst[m]:.4f}" for m in args.methods]
    fields.append(f"seeds={len(args.seeds)} steps={args.steps}")
    print("RESULT " + " ".join(fields))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
