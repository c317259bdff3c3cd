"""ExpRL benchmark on the embedded chained-arithmetic task (docs/DESIGN.md §8), decided on pooled intervals.

Arms with the SAME step budget S1 + S2 from the same cached warm start, per seed:

  exprl     Stage I: ExpRL (--variant outcome|process) with the embedded reference judge for S1 steps, then
            Stage II: sparse 0/1 GRPO for S2 steps from Stage I's final weights (KL 0, temperature 0.8)
  dense     the same two stages, but Stage I's judge has NO reference (judges.reference.PromptOnlyRuleJudge:
            what a rule can check from the prompt alone, on the same 1-5 scale; on a task without a hidden
            operation it IS the reference judge): isolates what the reference adds to a dense reward
  grpo      sparse 0/1 GRPO for S1 + S2 steps (GRPO-only)
  sft_grpo  (--arms) SFT on the references for S1 steps, then the same Stage II

Tasks (--task): ``hidden`` (default) is ExpRL's premise: one step of every problem is ``zap k``, an operation
whose meaning (subtract k) the prompt never states; the warm start misreads it (adds k) and writes the true
result only ``data.warm_start.hidden_op_true_rate`` (0.1) of the time, so sparse success on long chains starts
near zero (about 0.1 p^L), and only the reference carries the hidden step's result. ``control`` is today's task
(full references, nothing hidden: the reference adds nothing a rule cannot compute from the prompt, so
``dense`` = ``exprl``), ``premise`` the earlier sketch-reference task (``data.task.reference=sketch``).

Independent seeds: every seed trains on its own fresh problems (``--train-per-level`` per training level) and
is evaluated on its own ``--heldout`` fresh level-10 problems (bench/_miniature.seed_problems); the warm start
is shared (it takes ~8 min of CPU; a per-seed warm start is not cheap). Within a seed every arm is evaluated
with the same sampling seed on the same problems. Before training the bench prints the premise, measured on the
warm start over the task's own held-out levels 6-10 (80 problems x 8 samples): sparse success per level, the
hidden step's true rate (among rollouts that reach it with a correct prefix) and how each judge scores a right
vs a misread hidden step there, and the reference's per-token NLL vs the model's own samples.

Comparisons (rise_nemo.core.comparison: pooled over seeds and problems, two-stage paired bootstrap, 95%):
  final_hard_pass1_ratio  ExpRL / GRPO-only exact pass@1 (every step right) on the held-out level-10 problems after
                          S1 + S2 steps (target >= 1.2 with the lower bound above 1); answer_ratio: answer-only
  reference_ratio         ExpRL / dense (the reference's own contribution; target 1.2); reference_answer_ratio:
                          answer-only
  dense_ratio             dense / GRPO-only; dense_answer_ratio: answer-only
  stage1_pass8_ratio      ExpRL / GRPO-only unbiased pass@8 (of --samples) after S1 steps: GRPO at the same step
  judge_calls_per_rollout ExpRL-Process with the LLM judge mode against the rule-grader server on 127.0.0.1
                          (target <= 1.0; ExpRL's code makes one call per segment)
Each comparison prints <name>, <name>_lo, <name>_hi, <name>_verdict (effect / effect_below_target /
no_effect_at_target / underpowered).

Budget: ~40 CPU-minutes at the defaults with the warm start cached (2,315 s measured: docs/results.md); the
hidden task's warm start is built once and cached. ``--quick``: 2 seeds, 3 + 3 steps, 16 problems, 8 samples (a smoke run).

Ends with
    RESULT final_hard_pass1_ratio=... final_hard_pass1_ratio_lo=... _hi=... _verdict=... answer_ratio=... ...
           reference_ratio... dense_ratio... stage1_pass8_ratio... base_pass1=... judge_calls_per_rollout=...
           seeds=10 steps=20+20 task=hidden cpu_s=...

Usage: python bench/embedded_exprl.py [--stage1-steps 20] [--stage2-steps 20] [--seeds 0 .. 9] [--variant outcome]
       [--samples 16] [--heldout 64] [--train-per-level 64] [--task hidden|control|premise]
       [--arms exprl dense grpo] [--quick] [--out F] [--resume-dir D] [--workers N] [key=value ...]
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
from bench._miniature import (  # noqa: E402
    counts,
    cpu_seconds,
    rate,
    resumable,
    run_workers,
    score_samples,
    seed_problems,
)

STAGE2 = ["policy_loss.kl_coef=0.0", "sampling.temperature=0.8"]  # ExpRL's Stage II: sparse GRPO, KL 0, temperature 0.8
TASKS = {
    "hidden": ["++data.task.hidden_op=true", "local.tokenizer=builtin:reasoning_task_zap",
               "++data.warm_start.hidden_op_true_rate=0.1"],
    "control": [],
    "premise": ["++data.task.reference=sketch"],
}
ARMS = ("exprl", "dense", "grpo", "sft_grpo")
TARGET = 1.2  # ExpRL / GRPO-only final hard pass@1 (and the other ratios' target)
HELDOUT_LEVEL = 10


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stage1-steps", type=int, default=20)
    p.add_argument("--stage2-steps", type=int, default=20)
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--variant", choices=["outcome", "process"], default="outcome", help="ExpRL's Stage I method")
    p.add_argument("--samples", type=int, default=16, help="samples per held-out problem (pass@1 and pass@8)")
    p.add_argument("--heldout", type=int, default=64, help="fresh held-out level-10 problems per seed")
    p.add_argument("--train-per-level", type=int, default=64, help="fresh training problems per level per seed")
    p.add_argument("--judge-steps", type=int, default=2, help="Stage I steps measured against the loopback judge")
    p.add_argument("--task", choices=sorted(TASKS), default="hidden")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=["exprl", "dense", "grpo"])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 seeds, 3 + 3 steps, 16 problems x 8 samples")
    p.add_argument("--out", default=None, help="write every measurement as JSON here")
    p.add_argument("--resume-dir", default=None,
                   help="save each seed's measurements here and reuse those of an earlier run with the same settings")
    p.add_argument("--workers", type=int, default=1,
                   help="measure the seeds in this many processes (the same runs and CPU time, less wall time)")
    p.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # a --workers child
    p.add_argument("overrides", nargs="*", help="recipe overrides for every arm, e.g. local.lr=2e-4")
    args = parse_with_overrides(p)
    if args.quick:
        args.seeds, args.stage1_steps, args.stage2_steps = args.seeds[:2], 3, 3
        args.samples, args.heldout, args.train_per_level = 8, 16, 8
    for arm in ("exprl", "grpo"):
        if arm not in args.arms:
            raise SystemExit(f"--arms: {arm} is needed (the RESULT line compares ExpRL with GRPO-only)")
    if args.samples < 8:
        raise SystemExit("--samples: at least 8 (pass@8)")
    return args


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from rise_nemo.config import load_config
    from rise_nemo.core.comparison import pooled_rate, pooled_ratio
    from rise_nemo.judges.reference import PromptOnlyRuleJudge, RuleReferenceJudge
    from rise_nemo.loop.data import PromptSampler, chain_task
    from rise_nemo.loop.warm_start import warm_started_backend

    args = parse_args()
    args.overrides = [*TASKS[args.task], *args.overrides]
    recipes = REPO / "recipes"
    stage1_recipe = f"exprl_{args.variant}_chain_tiny_cpu.yaml"
    t0, c0, started = time.perf_counter(), cpu_seconds(), time.time()
    if args.workers > 1 and not args.measure_only and not args.resume_dir:
        import tempfile

        args.resume_dir = tempfile.mkdtemp(prefix="embedded_exprl_")

    def config(recipe: str, seed: int, *extra: str):
        return load_config(recipes / recipe, [f"run.seed={seed}", *args.overrides, *extra])

    def fresh(seed: int):
        cfg = config("grpo_chain_tiny_cpu.yaml", seed)
        return (cfg, *warm_started_backend(cfg, progress=True))

    base_cfg, _, _, stats = fresh(args.seeds[0])
    print(f"warm start: {stats}", flush=True)
    task = chain_task(base_cfg)
    levels = sorted(set(base_cfg.data.task.train_levels))
    premise = {} if args.measure_only else measure_premise(base_cfg, task, args.task)
    print("premise, measured on the warm start before training: " + json.dumps(premise), flush=True)
    print(f"per seed: {args.train_per_level} fresh training problems per level {levels}, {args.heldout} fresh held-out "
          f"level-{HELDOUT_LEVEL} problems x {args.samples} samples; budget {args.stage1_steps} + {args.stage2_steps} "
          f"steps; arms {args.arms}; ExpRL-{args.variant}", flush=True)

    s1, s2 = args.stage1_steps, args.stage2_steps
    evals: dict[str, dict[str, list]] = {arm: {"stage1": [], "final": []} for arm in [*args.arms, "warm_start"]}
    records, reused_cpu = [], 0.0
    spec = {k: v for k, v in vars(args).items()
            if k not in ("seeds", "out", "resume_dir", "quick", "judge_steps", "workers", "measure_only")}

    def run_seed(seed: int) -> dict:
        train_set, heldout = seed_problems(task, seed, levels, args.train_per_level, HELDOUT_LEVEL, args.heldout)
        eval_cfg, _, generator, _ = fresh(seed)
        out: dict = {"evals": {}, "rec": {"seed": seed}}

        def evaluate(arm: str, when: str, gen, step: int) -> None:
            scores = score_samples(eval_cfg, gen, heldout, args.samples, step)
            out["evals"].setdefault(arm, {})[when] = scores
            out["rec"][f"{arm}_{when}"] = {"exact": rate([scores], "exact"), "answer": rate([scores], "answer"),
                                           "pass8": _pass_k_mean(scores, "exact", 8)}

        evaluate("warm_start", "final", generator, 0)
        for arm in args.arms:
            t, c = time.perf_counter(), cpu_seconds()
            _, policy, generator, _ = fresh(seed)
            sampler = PromptSampler(train_set, int(eval_cfg.sampling.prompts_per_step), seed, True)  # both stages
            stage2 = config("grpo_chain_tiny_cpu.yaml", seed, *STAGE2)
            if arm == "grpo":  # one run of S1 + S2 steps, evaluated after S1 as well
                m = train(stage2, policy, generator, sampler, 1, s1)
                evaluate(arm, "stage1", generator, s1)
            else:
                if arm == "sft_grpo":
                    m = train(config("sft_chain_tiny_cpu.yaml", seed), policy, generator, sampler, 1, s1)
                else:
                    judge = RuleReferenceJudge() if arm == "exprl" else PromptOnlyRuleJudge()
                    m = train(config(stage1_recipe, seed), policy, generator, sampler, 1, s1, judge=judge)
                evaluate(arm, "stage1", generator, s1)
                policy.begin_stage()  # Stage II: fresh optimiser, KL reference = Stage I's final weights
            m += train(stage2, policy, generator, sampler, s1 + 1, s2)
            evaluate(arm, "final", generator, s1 + s2)
            out["rec"][arm] = {"reward_first": m[0].get("reward/mean"),
                               "reward_stage1_last": m[s1 - 1].get("reward/mean"),
                               "reward_last": m[-1].get("reward/mean"), "cpu_s": cpu_seconds() - c,
                               "wall_s": time.perf_counter() - t}
        print(json.dumps(out["rec"]), flush=True)
        return out

    if args.workers > 1 and not args.measure_only:
        run_workers(__file__, sys.argv[1:], args.seeds, args.workers, ["--resume-dir", args.resume_dir])
    for seed in args.seeds:
        got = resumable(args.resume_dir, f"exprl_{args.task}_s{seed}", {**spec, "seed": seed},
                        lambda seed=seed: run_seed(seed))
        if got.get("reused") and got.get("measured_at", 0.0) < started:  # else a --workers child measured it
            reused_cpu += got["cpu_s"]
            print(f"seed {seed}: measurements reused from {args.resume_dir}", flush=True)
        for arm, whens in got["evals"].items():
            for when, scores in whens.items():
                evals[arm][when].append(scores)
        records.append(got["rec"])

    if args.measure_only:
        return 0
    calls_per_rollout = judge_calls_per_rollout(config, args) if args.judge_steps else float("nan")
    cpu_s = cpu_seconds() - c0 + reused_cpu  # a resumed run counts its earlier seeds

    def final(arm: str, key: str = "exact"):
        return counts(evals[arm]["final"], key)

    samples = [[p["n"] for p in problems] for problems in evals["grpo"]["final"]]
    comparisons = {
        "final_hard_pass1_ratio": pooled_ratio(final("exprl"), final("grpo"), samples, target=TARGET),
        "answer_ratio": pooled_ratio(final("exprl", "answer"), final("grpo", "answer"), samples, target=TARGET),
        "stage1_pass8_ratio": pooled_ratio(_pass_k(evals["exprl"]["stage1"], "exact", 8),
                                           _pass_k(evals["grpo"]["stage1"], "exact", 8), target=TARGET),
    }
    if "dense" in args.arms:
        comparisons["reference_ratio"] = pooled_ratio(final("exprl"), final("dense"), samples, target=TARGET)
        comparisons["dense_ratio"] = pooled_ratio(final("dense"), final("grpo"), samples, target=TARGET)
        # answer-only too: exact solutions at level 10 can be too rare to decide what the reference adds
        comparisons["reference_answer_ratio"] = pooled_ratio(final("exprl", "answer"), final("dense", "answer"),
                                                             samples, target=TARGET)
        comparisons["dense_answer_ratio"] = pooled_ratio(final("dense", "answer"), final("grpo", "answer"), samples,
                                                         target=TARGET)
    if "sft_grpo" in args.arms:
        comparisons["sft_ratio"] = pooled_ratio(final("exprl"), final("sft_grpo"), samples, target=TARGET)

    print(f"\nlevel-{HELDOUT_LEVEL} held-out, pooled over {len(args.seeds)} seeds x {args.heldout} problems x "
          f"{args.samples} samples (95% intervals over seeds and problems):")
    print(f"{'arm':>10} {'exact p@1 (step ' + str(s1 + s2) + ')':>34} {'answer p@1':>11} {'exact p@8, step ' + str(s1):>18}")
    for arm in ["warm_start", *args.arms]:
        p1 = pooled_rate(final(arm), samples)
        p8 = f"{_mean_pass8(evals[arm]['stage1']):.4f}" if evals[arm]["stage1"] else "-"
        print(f"{arm:>10} {p1[0]:>12.4f} [{p1[1]:.4f}, {p1[2]:.4f}]     {rate(evals[arm]['final'], 'answer'):>11.4f} "
              f"{p8:>18}")
    for name, iv in comparisons.items():
        print(f"  {name}: {iv.text()} (target {iv.target})")
    print(f"CPU {cpu_s:.0f} s, wall {time.perf_counter() - t0:.0f} s")

    if args.out:
        Path(args.out).write_text(json.dumps({"premise": premise, "runs": records, "evals": evals,
                                              "judge_calls_per_rollout": calls_per_rollout, "cpu_s": cpu_s,
                                              "args": vars(args)}, indent=1))
    fields = [f for name, iv in comparisons.items() for f in iv.fields(name)]
    fields += [f"base_pass1={rate(evals['warm_start']['final'], 'answer'):.4f}",
               f"judge_calls_per_rollout={calls_per_rollout:.4f}", f"seeds={len(args.seeds)}", f"steps={s1}+{s2}",
               f"task={args.task}", f"variant={args.variant}"]
    fields += [f"{k}={v:.4f}" for k, v in premise.items() if isinstance(v, float)]
    fields.append(f"cpu_s={cpu_s:.0f}")
    print("RESULT " + " ".join(fields))
    return 0


def train(cfg, policy, generator, sampler, first_step: int, steps: int, judge=None) -> list[dict]:
    """Steps ``first_step``.. (``steps`` of them) of the recipe's method on the problems ``sampler`` hands out
    (the method's registered step; sft: no sampling). The step number seeds the step's sampling stream."""
    from rise_nemo.methods.registry import get_method
    from rise_nemo.steps.reasoning import ReasoningContext
    from rise_nemo.steps.rollouts import pad_id_of
    from rise_nemo.steps.verifiers import build_verifier

    verifier, _ = build_verifier(cfg)
    method = get_method(str(cfg.method))
    ctx = ReasoningContext(cfg=cfg, policy=policy, generator=generator, verifier=verifier,
                           method=method, pad_id=pad_id_of(generator), reference_judge=judge)
    train_step = method.training_step().train_step
    return [train_step(ctx, sampler.next_batch(), step) for step in range(first_step, first_step + steps)]


def measure_premise(cfg, task, task_name: str) -> dict:
    """The premise on the warm start (module docstring), on the task's own held-out levels 6-10 x 8 samples."""
    from rise_nemo.data.chain_task import HIDDEN_OP, RuleArithmeticVerifier, _written_steps, problem_chain
    from rise_nemo.judges.reference import PromptOnlyRuleJudge, RuleReferenceJudge, ScoreRequest
    from rise_nemo.loop.warm_start import warm_started_backend
    from rise_nemo.steps.rollouts import eval_sampling_params

    _, generator, _ = warm_started_backend(cfg)
    problems = [p for p in task.heldout if p.difficulty >= 6]
    groups = generator.generate([list(p.messages) for p in problems], 8, eval_sampling_params(cfg, 0))
    flat = [(p, r.response_text) for p, g in zip(problems, groups) for r in g]
    ok = RuleArithmeticVerifier().verify([p for p, _ in flat], [t for _, t in flat])
    out: dict = {}
    for level in sorted({p.difficulty for p in problems}):
        hits = [v for (p, _), v in zip(flat, ok) if p.difficulty == level]
        out[f"sparse_success_L{level}"] = sum(hits) / len(hits)
    ref_nll, own_nll = reference_vs_own_nll(cfg, problems)
    out["reference_nll"], out["own_nll"] = ref_nll, own_nll
    if task.cfg.hidden_op:
        reached = {"right": [], "misread": []}
        for p, text in flat:
            chain, got = problem_chain(p), _written_steps(text)
            i = [op for op, _ in chain.ops].index(HIDDEN_OP)
            clean = _written_steps(p.reference_solution)
            if len(got) > i and got[:i] == clean[:i] and got[i][:3] == clean[i][:3]:
                reached["right" if got[i] == clean[i] else "misread"].append((p, text))
        n_reached = len(reached["right"]) + len(reached["misread"])
        out["hidden_true_rate"] = len(reached["right"]) / n_reached if n_reached else float("nan")
        out["hidden_reached"] = n_reached
        for name, judge in (("reference", RuleReferenceJudge()), ("prompt_only", PromptOnlyRuleJudge())):
            for kind, rows in reached.items():
                scores = judge.score([ScoreRequest(p, t) for p, t in rows])
                out[f"{name}_score_{kind}"] = sum(s[0] for s in scores) / len(scores) if scores else float("nan")
    out["task"] = task_name
    return out


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


def judge_calls_per_rollout(config, args) -> float:
    """ExpRL-Process through the LLM judge mode over real HTTP on 127.0.0.1: HTTP calls per judged rollout."""
    from rise_nemo.judges.reference import build_reference_judge
    from rise_nemo.judges.rule_server import RuleGraderServer
    from rise_nemo.loop.data import PromptSampler, load_prompts
    from rise_nemo.loop.warm_start import warm_started_backend

    seed = args.seeds[0]
    cfg = config("exprl_process_chain_tiny_cpu.yaml", seed)
    policy, generator, _ = warm_started_backend(cfg)
    sampler = PromptSampler(load_prompts(cfg)[0], int(cfg.sampling.prompts_per_step), seed, True)
    with RuleGraderServer() as server:
        judge = build_reference_judge({"type": "http", "model": "rule-grader", "base_urls": [server.url],
                                       "timeout_s": 30.0})
        try:
            metrics = train(cfg, policy, generator, sampler, 1, args.judge_steps, judge=judge)
            calls = judge.calls
        finally:
            judge.close()
    judged = sum(m["exprl/judged_rollouts"] for m in metrics)
    segments = sum(m["exprl/segments_mean"] * m["exprl/judged_rollouts"] for m in metrics)
    print(f"LLM judge mode (process, loopback): {calls} HTTP calls for {judged} judged rollouts "
          f"(~{segments / max(1, judged):.1f} segments each; one call per segment would be {segments:.0f})", flush=True)
    return calls / judged if judged else float("nan")


def _pass_k(per_seed, key: str, k: int) -> list[list[float]]:
    """[seeds][problems] unbiased pass@k (core.metrics.pass_at_k) from each problem's counts."""
    from rise_nemo.core.metrics import pass_at_k

    return [[pass_at_k(p["n"], p[key], k) for p in problems] for problems in per_seed]


def _pass_k_mean(scores, key: str, k: int) -> float:
    (vals,) = _pass_k([scores], key, k)
    return sum(vals) / len(vals)


def _mean_pass8(per_seed) -> float:
    vals = [v for row in _pass_k(per_seed, "exact", 8) for v in row]
    return sum(vals) / len(vals)


if __name__ == "__main__":
    raise SystemExit(main())
