"""ExpRL benchmark on the embedded chained-arithmetic task (docs/DESIGN.md §8).

Three arms with the SAME total step budget S1 + S2, from the same cached warm start, per seed:

  exprl     Stage I: ExpRL (--variant outcome|process, embedded rule reference judge) for S1 steps,
            then Stage II: sparse 0/1 GRPO for S2 steps from Stage I's final weights (KL 0, temperature 0.8)
  grpo      sparse 0/1 GRPO for S1 + S2 steps (GRPO-only)
  sft_grpo  SFT on the reference solutions for S1 steps, then the same Stage II for S2 steps

Measured on held-out instances (never in the warm start), same sampling seed for every arm of a seed:
  stage1_pass8_gain       pass@8 on the hard levels (the recipe's training levels) after Stage I minus the
                          warm start's, worst seed (target > 0)
  final_hard_pass1_ratio  ExpRL / GRPO-only pass@1 on the hardest held-out level after Stage II, worst seed
                          (target >= 1.2); nan when both are 0, inf when only GRPO-only is 0
  judge_calls_per_rollout ExpRL-Process with the LLM judge mode (rise_nemo.judges.reference.HttpReferenceJudge)
                          against the rule-grader server on 127.0.0.1: HTTP calls / rollouts sent to the judge
                          over --judge-steps Stage I steps (target <= 1.0; ExpRL's code makes one call per segment)

  sft_ratio               ExpRL / sft_grpo pass@1 on the hardest held-out level after Stage II (same steps),
                          worst seed

``--task premise`` gives every arm sketch references (``data.task.reference=sketch``: every
second step and the last, rise_nemo.data.chain_task.Chain.sketch_text), checkable by the reference judge but
not imitable step by step; ``--task control`` (default) keeps the full step-by-step references. Before
training the bench prints the premise measurement: the references' per-token NLL under the warm start vs
the NLL of the model's own samples (one per hard held-out problem, the step-0 evaluation stream).

Ends with
    RESULT stage1_pass8_gain=... final_hard_pass1_ratio=... judge_calls_per_rollout=... seeds=3 sft_ratio=...
           task=... reference_nll=... own_nll=...

Usage: python bench/embedded_exprl.py [--stage1-steps 4] [--stage2-steps 4] [--seeds 0 1 2] [--variant outcome]
       [--samples 8] [--final-samples 16] [--eval-per-level N] [--task control|premise] [--out F] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._cli import parse_with_overrides  # noqa: E402

STAGE2 = ["policy_loss.kl_coef=0.0", "sampling.temperature=0.8"]  # ExpRL's Stage II: sparse GRPO, KL 0, temperature 0.8


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage1-steps", type=int, default=4)
    p.add_argument("--stage2-steps", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--variant", choices=["outcome", "process"], default="outcome", help="ExpRL's Stage I method")
    p.add_argument("--samples", type=int, default=8, help="samples per problem for pass@8 on the hard levels")
    p.add_argument("--final-samples", type=int, default=16, help="samples per problem on the hardest level")
    p.add_argument("--eval-per-level", type=int, default=8, help="held-out problems per hard level for pass@8")
    p.add_argument("--judge-steps", type=int, default=2, help="Stage I steps measured against the loopback judge")
    p.add_argument("--task", choices=["control", "premise"], default="control",
                   help="control: full references; premise: sketch references (checkable, not imitable)")
    p.add_argument("--out", default=None, help="write every measurement as JSON here")
    p.add_argument("overrides", nargs="*", help="recipe overrides for every arm, e.g. local.lr=2e-4")
    return parse_with_overrides(p)


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from rise_nemo.config import load_config
    from rise_nemo.judges.reference import RuleReferenceJudge, build_reference_judge
    from rise_nemo.judges.rule_server import RuleGraderServer
    from rise_nemo.loop.data import PromptSampler, load_prompts
    from rise_nemo.loop.warm_start import evaluate_heldout, warm_started_backend
    from rise_nemo.methods.registry import get_method
    from rise_nemo.steps.reasoning import ReasoningContext
    from rise_nemo.steps.rollouts import pad_id_of
    from rise_nemo.steps.verifiers import build_verifier

    args = parse_args()
    if args.task == "premise":
        args.overrides = ["++data.task.reference=sketch", *args.overrides]
    recipes = REPO / "recipes"
    stage1_recipe = f"exprl_{args.variant}_chain_tiny_cpu.yaml"
    t0 = time.perf_counter()

    def config(recipe: str, seed: int, *extra: str):
        return load_config(recipes / recipe, [f"run.seed={seed}", *args.overrides, *extra])

    def fresh(seed: int):
        cfg = config("grpo_chain_tiny_cpu.yaml", seed)
        return (cfg, *warm_started_backend(cfg))

    def train(cfg, policy, generator, steps: int, seed: int, judge=None) -> list[dict]:
        train_set, _ = load_prompts(cfg)
        verifier, _ = build_verifier(cfg)
        method = get_method(str(cfg.method))
        ctx = ReasoningContext(cfg=cfg, policy=policy, generator=generator, verifier=verifier,
                               method=method, pad_id=pad_id_of(generator), reference_judge=judge)
        train_step = method.training_step().train_step  # the method's registered step (sft: no sampling)
        sampler = PromptSampler(train_set, int(cfg.sampling.prompts_per_step), seed, True)
        return [train_step(ctx, sampler.next_batch(), step) for step in range(1, steps + 1)]

    def evaluate(cfg, generator, problems, n: int):  # the step-0 evaluation stream of cfg's run.seed
        return evaluate_heldout(cfg, generator, problems, n)

    base_cfg, _, _, stats = fresh(args.seeds[0])
    print(f"warm start: {stats}", flush=True)
    _, heldout = load_prompts(base_cfg)
    levels = sorted(set(base_cfg.data.task.train_levels))
    hardest = max(p.difficulty for p in heldout)
    hard = [p for lv in levels for p in [q for q in heldout if q.difficulty == lv][: args.eval_per_level]]
    top = [p for p in heldout if p.difficulty == hardest]
    print(f"hard levels {levels}: {len(hard)} held-out problems x {args.samples} samples; hardest level {hardest}: "
          f"{len(top)} problems x {args.final_samples} samples; budget {args.stage1_steps} + {args.stage2_steps} steps",
          flush=True)

    ref_nll, own_nll = reference_vs_own_nll(base_cfg, hard)
    print(f"premise ({args.task} task): reference per-token NLL under the warm start {ref_nll:.3f} vs the model's "
          f"own samples {own_nll:.3f} (hard held-out problems)", flush=True)

    def pass8(result) -> float:
        vals = [lv["pass_at_k"].get(str(min(8, args.samples))) for lv in result["levels"].values()]
        return sum(vals) / len(vals)

    def top_pass1(result) -> float:
        return result["levels"][str(hardest)]["pass_at_k"]["1"]

    records, gains, ratios, sft_ratios = [], [], [], []
    s1, s2 = args.stage1_steps, args.stage2_steps
    for seed in args.seeds:
        rec: dict = {"seed": seed}
        cfg, policy, generator, _ = fresh(seed)
        base_hard = evaluate(cfg, generator, hard, args.samples)
        base_top = evaluate(cfg, generator, top, args.final_samples)
        rec["base"] = {"hard_pass8": pass8(base_hard), "hard_pass1": base_hard["pass_at_1"],
                       "hardest_pass1": top_pass1(base_top)}

        # ExpRL: Stage I (reference judge) -> Stage II (sparse GRPO) from Stage I's final weights
        t = time.perf_counter()
        c1 = config(stage1_recipe, seed)
        judge = RuleReferenceJudge()
        m1 = train(c1, policy, generator, s1, seed, judge=judge)
        after1 = evaluate(cfg, generator, hard, args.samples)
        policy.begin_stage()
        c2 = config("grpo_chain_tiny_cpu.yaml", seed, *STAGE2)
        m2 = train(c2, policy, generator, s2, seed)
        final = evaluate(cfg, generator, top, args.final_samples)
        rec["exprl"] = {"stage1_hard_pass8": pass8(after1), "stage1_hard_pass1": after1["pass_at_1"],
                        "stage1_step_accuracy": _step_acc(after1), "hardest_pass1": top_pass1(final),
                        "stage1_reward_first": m1[0]["reward/mean"], "stage1_reward_last": m1[-1]["reward/mean"],
                        "stage2_reward_last": m2[-1]["reward/mean"], "judge_calls": judge.calls,
                        "seconds": time.perf_counter() - t}
        gains.append(rec["exprl"]["stage1_hard_pass8"] - rec["base"]["hard_pass8"])

        # GRPO-only for the whole budget
        t = time.perf_counter()
        cfg, policy, generator, _ = fresh(seed)
        m = train(config("grpo_chain_tiny_cpu.yaml", seed, *STAGE2), policy, generator, s1 + s2, seed)
        final = evaluate(cfg, generator, top, args.final_samples)
        rec["grpo"] = {"hardest_pass1": top_pass1(final), "reward_last": m[-1]["reward/mean"],
                       "seconds": time.perf_counter() - t}

        # SFT on the references -> the same Stage II
        t = time.perf_counter()
        cfg, policy, generator, _ = fresh(seed)
        msft = train(config("sft_chain_tiny_cpu.yaml", seed), policy, generator, s1, seed)
        after_sft = evaluate(cfg, generator, hard, args.samples)
        policy.begin_stage()
        train(config("grpo_chain_tiny_cpu.yaml", seed, *STAGE2), policy, generator, s2, seed)
        final = evaluate(cfg, generator, top, args.final_samples)
        rec["sft_grpo"] = {"stage1_hard_pass8": pass8(after_sft), "stage1_step_accuracy": _step_acc(after_sft),
                           "hardest_pass1": top_pass1(final), "sft_nll_last": msft[-1].get("sft/nll"),
                           "seconds": time.perf_counter() - t}
        ratios.append(_ratio(rec["exprl"]["hardest_pass1"], rec["grpo"]["hardest_pass1"]))
        sft_ratios.append(_ratio(rec["exprl"]["hardest_pass1"], rec["sft_grpo"]["hardest_pass1"]))
        records.append(rec)
        print(json.dumps(rec), flush=True)

    # Judge calls per rollout: ExpRL-Process through the LLM judge mode over real HTTP on 127.0.0.1.
    cfg, policy, generator, _ = fresh(args.seeds[0])
    with RuleGraderServer() as server:
        judge = build_reference_judge({"type": "http", "model": "rule-grader", "base_urls": [server.url],
                                       "timeout_s": 30.0})
        try:
            metrics = train(config("exprl_process_chain_tiny_cpu.yaml", args.seeds[0]), policy, generator,
                            args.judge_steps, args.seeds[0], judge=judge)
            judged = sum(m["exprl/judged_rollouts"] for m in metrics)
            segments = sum(m["exprl/segments_mean"] * m["exprl/judged_rollouts"] for m in metrics)
            calls = judge.calls
        finally:
            judge.close()
    calls_per_rollout = calls / judged if judged else float("nan")
    print(f"LLM judge mode (process, loopback): {calls} HTTP calls for {judged} judged rollouts "
          f"(~{segments / max(1, judged):.1f} segments each; one call per segment would be {segments:.0f})", flush=True)

    if args.out:
        Path(args.out).write_text(json.dumps({"runs": records, "judge_calls": calls, "judged_rollouts": judged,
                                              "reference_nll": ref_nll, "own_nll": own_nll, "args": vars(args)},
                                             indent=1))
    print(f"total {time.perf_counter() - t0:.0f} s")
    print(f"RESULT stage1_pass8_gain={min(gains):.4f} final_hard_pass1_ratio={_worst(ratios):.4f} "
          f"judge_calls_per_rollout={calls_per_rollout:.4f} seeds={len(args.seeds)} sft_ratio={_worst(sft_ratios):.4f} "
          f"task={args.task} reference_nll={ref_nll:.4f} own_nll={own_nll:.4f}")
    return 0


def reference_vs_own_nll(cfg, problems) -> tuple[float, float]:
    """Per-token NLL under a fresh warm start of ``cfg`` of the problems' references and of the model's own
    samples (one each, the step-0 evaluation stream)."""
    from rise_nemo.loop.warm_start import warm_started_backend
    from rise_nemo.steps.rollouts import eval_sampling_params
    from rise_nemo.tasks.sft import Example, response_nll

    policy, generator, _ = warm_started_backend(cfg)
    messages = [[dict(m) for m in p.messages] for p in problems]
    rows = generator.generate([p.messages for p in problems], 1, eval_sampling_params(cfg, 0))
    own = [Example(m, r[0].response_text) for m, r in zip(messages, rows)]
    refs = [Example(m, p.reference_solution) for m, p in zip(messages, problems)]
    return response_nll(policy, generator, refs), response_nll(policy, generator, own)


def _step_acc(result) -> float | None:
    num = sum((lv["step_accuracy"] or 0.0) * lv["problems"] for lv in result["levels"].values())
    den = sum(lv["problems"] for lv in result["levels"].values())
    return num / den if den else None


def _ratio(a: float, b: float) -> float:
    if b > 0:
        return a / b
    return float("nan") if a == 0 else math.inf


def _worst(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return min(finite) if finite else float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
