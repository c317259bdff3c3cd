"""One training step of RISE-RL and of its baselines (docs/DESIGN.md §2), written against rise_nemo.interfaces.

``train_step`` reads top to bottom; every stage is a named function below it. Which method runs is
configuration only (the switches of the method's ``RubricMethod``, rise_nemo.methods.rise; this is the
rubric step kind's step, rise_nemo.methods.registry.RUBRIC):

  rise       GRPO on natural rollouts + the decoupled guide loss on retained privileged rollouts (eq. 12)
  rubric_rl  GRPO only (guidance off)
  uniform    rise with uniform token weights in the guide loss (log p instead of log rho)
  coupled    privileged rollouts, re-scored under the original prompt, join the natural GRPO group
  ruscarl    natural rollouts sampled under scaffolded prompts, trained under the original prompt as GRPO

Every formula comes from rise_nemo.core; this module only moves data between the policy, the generator
and the judge and decides what happens when.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rise_nemo.core.advantages import (
    coupled_group_advantages,
    group_advantages,
    reference_advantages,
)
from rise_nemo.core.guidance import (
    FailureGate,
    GuidanceOptions,
    PreviousFailures,
    budget_targets,
    length_ok,
    no_regression_retention,
    sentence_span,
    token_span_mask,
)
from rise_nemo.core.losses import overlong_penalty
from rise_nemo.core.metrics import finite_or_none
from rise_nemo.core.prompts import (
    build_privileged_prompt,
    build_ruscarl_prompt,
    hint_templates,
    ruscarl_num_scaffold,
)
from rise_nemo.core.rewards import criterion_priority, failure_matrix, rubric_reward, select_feedback
from rise_nemo.core.rubric import Criterion, RubricPrompt
from rise_nemo.core.schedule import GuidanceSchedule, reward_gap
from rise_nemo.interfaces import (
    KIND_GUIDED,
    KIND_NATURAL,
    AsyncJudge,
    FillsPrevLogprobs,
    GenerationRequest,
    Generator,
    Judge,
    JudgeRequest,
    Policy,
    ResponseDecoder,
    Rollout,
    SpanLocatingJudge,
    Verdict,
)
from rise_nemo.judges.checked import build_checked_judge
from rise_nemo.methods.registry import RUBRIC, RubricMethod
from rise_nemo.steps.judged_stream import JudgedStream, streams_natively
from rise_nemo.steps.rollouts import (
    STREAM_HINT,
    STREAM_NATURAL,
    STREAM_PRIVILEGED,
    TrainSample,
    build_batch,
    derive_request_seed,
    generate_requests,
    recipe_policy_loss_fn,
    sampling_params,
)
from rise_nemo.steps.rubric_eval import evaluate, judge_groups


def make_schedule(cfg: Any) -> GuidanceSchedule:
    """eq. 13's schedule from ``rise.schedule`` (mode fixed / auto / never)."""
    s = cfg.rise.schedule
    return GuidanceSchedule(
        lambda0=float(cfg.rise.lambda_guide), mode=str(s.mode), s_switch=int(s.switch_step), ema=float(s.ema),
        tol=float(s.tolerance), patience=int(s.patience), min_steps=int(s.min_steps),
        floor=None if s.floor is None else float(s.floor),
    )


def guidance_options(cfg: Any) -> GuidanceOptions:
    """Our extensions (docs/DESIGN.md §2) from ``rise.retention`` / ``rise.gate``; all off when
    rise.paper_faithful."""
    rise = cfg.rise
    r, g = rise.retention, rise.gate
    opts = GuidanceOptions(
        no_regression=str(r.no_regression), keep_threshold=float(r.keep_threshold),
        mask_penalised_spans=bool(r.mask_penalised_spans), span_unit=str(r.span_unit),
        max_length_ratio=None if r.max_length_ratio is None else float(r.max_length_ratio),
        gate=bool(g.enabled), gate_ema=float(g.ema), gate_threshold=float(g.threshold),
        privileged_budget=None if g.budget is None else float(g.budget),
        one_pass=str(rise.guidance_pass) == "one",
    )
    return opts.with_paper(bool(rise.paper_faithful))


def hint_style(cfg: Any) -> str:
    return "paper" if bool(cfg.rise.paper_faithful) else str(cfg.rise.hints)


@dataclass
class StepContext:
    """Everything a step needs; built once by the trainer."""

    cfg: Any  # validated recipe (DictConfig)
    policy: Policy
    generator: Generator
    judge: Judge
    schedule: GuidanceSchedule
    rng: random.Random  # template choice (eq. 6) and RuscaRL criterion subsets; checkpointed
    method: RubricMethod  # its switches: guidance, coupled, ruscarl, token_weighting
    total_steps: int
    pad_id: int = 0
    samples_per_step: int = 0  # rollouts per kind recorded in ``last_samples`` (samples.jsonl); 0 = none
    last_samples: list[dict[str, Any]] = field(default_factory=list)
    _prompt_ids: dict[str, list[int]] = field(default_factory=dict)
    options: GuidanceOptions | None = None  # None -> from cfg.rise (guidance_options)
    gate: FailureGate | None = None  # adaptive gating state (checkpointed by the trainer)
    previous: PreviousFailures | None = None  # one-pass guidance: hints of each prompt's previous visit
    request_seeds: bool = False  # each sample and hint template from its own seed (sampling.request_seeds)
    pipelined: bool = False  # the rollout phase judges while it generates (rise.pipeline; pipelined_rollouts)

    def __post_init__(self) -> None:
        if self.options is None:
            self.options = guidance_options(self.cfg)
        if self.gate is None and self.options.gate:
            self.gate = FailureGate(self.options.gate_ema, self.options.gate_threshold)
        if self.options.one_pass and self.options.privileged_budget is not None:
            from rise_nemo.config import ConfigError

            raise ConfigError("config keys 'rise.guidance_pass' and 'rise.gate.budget': one-pass guidance does not "
                              "take a privileged budget (set rise.guidance_pass=two or rise.gate.budget=null)")
        if self.previous is None and self.options.one_pass:
            self.previous = PreviousFailures()

    # The trainer's view of the method's own state (rise_nemo.methods.registry.StepState).
    def state_dict(self) -> dict[str, Any]:
        return {"schedule": self.schedule.state_dict(),
                "gate": self.gate.state_dict() if self.gate is not None else None,  # adaptive guidance gating
                "previous_failures": self.previous.state_dict() if self.previous is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state["schedule"])
        if self.gate is not None and state.get("gate") is not None:
            self.gate.load_state_dict(state["gate"])
        if self.previous is not None and state.get("previous_failures") is not None:
            self.previous.load_state_dict(state["previous_failures"])

    def summary(self, step: int) -> dict[str, Any]:
        """The guidance switch, only if it happened (a fixed schedule past the last step is not reported)."""
        switch_step = self.schedule.switch_step
        switched = self.method.guidance and switch_step is not None and step >= switch_step
        return {"switch_reason": self.schedule.switch_reason if switched else None,
                "switch_step": switch_step if switched else None}

    def original_prompt_ids(self, prompt: RubricPrompt) -> list[int]:
        key = prompt.prompt_id
        if key not in self._prompt_ids:
            self._prompt_ids[key] = list(self.generator.encode_prompt(list(prompt.messages)))
        return self._prompt_ids[key]


@dataclass
class Scored:
    """Judged rollouts of N prompts x G samples."""

    rollouts: list[list[Rollout]]
    verdicts: list[list[list[Verdict]]]  # [N][G][K_n]
    rewards: torch.Tensor  # [N, G] eq. 3 (+ overlong penalty); 0 where invalid
    valid: torch.Tensor  # bool [N, G]; False = some verdict unknown -> response excluded

    @property
    def mean_reward(self) -> float | None:
        return float(self.rewards[self.valid].mean()) if bool(self.valid.any()) else None


# ----------------------------------------------------------------------------------------------------------
# The step


def train_step(ctx: StepContext, prompts: Sequence[RubricPrompt], step: int) -> dict[str, Any]:
    t_start = time.perf_counter()
    guided_phase = ctx.method.guidance and bool(ctx.schedule.active)
    lam = float(ctx.schedule.lambda_at(step)) if ctx.method.guidance else 0.0
    plan = phase_plan(ctx, prompts, guided_phase)
    # Natural rollouts judged (eq. 3 rewards), hints (eqs. 4-5, gate), privileged rollouts judged on the ORIGINAL
    # rubric: stage after stage, or pipelined (pipelined_rollouts); the same rollouts and verdicts either way.
    phase = collect_rollouts(ctx, prompts, step, plan)
    nat, priv, targets = phase.nat, phase.priv, phase.targets
    samples, guide_stats = training_samples(ctx, prompts, phase)
    if ctx.samples_per_step:
        ctx.last_samples = sample_records(step, prompts, nat, priv, targets, samples, ctx.samples_per_step)
    batch = build_batch(samples, ctx.pad_id)
    if not (isinstance(ctx.policy, FillsPrevLogprobs) and ctx.policy.fills_prev_logprobs):  # only the loss reads them
        batch["prev_logprobs"] = ctx.policy.get_logprobs(batch)  # [B, T], the policy that sampled (no grad)
    train_metrics = ctx.policy.train(batch, step_loss_fn(ctx, lam))  # eq. 12, ONE call for both kinds
    t_train = time.perf_counter()

    delta_r = guidance_delta(nat, priv, targets)  # eq. 13
    if ctx.method.guidance:
        ctx.schedule.update(step, delta_r)
    guide_stats["rollout/pipelined"] = bool(ctx.pipelined)
    guide_stats.update(rollout_metrics(phase))
    return step_metrics(ctx, step, lam, guided_phase, nat, priv, delta_r, batch, train_metrics, guide_stats,
                        times=(t_start, phase.t_natural, phase.t_priv, t_train, time.perf_counter()))


def training_samples(ctx: StepContext, prompts: Sequence[RubricPrompt],
                     phase: RolloutPhase) -> tuple[list[TrainSample], dict[str, Any]]:
    """The step's training rows from its rollout phase: natural rows with eq. 1's advantages, and guided rows
    (eqs. 7-8, our retention rules) or, for the coupled ablation, privileged rows in the natural groups."""
    natural, nat, priv, targets = phase.natural, phase.nat, phase.priv, phase.targets
    nat_adv = group_advantages(nat.rewards, eps=ctx.cfg.advantage.eps, valid=nat.valid)  # eq. 1, [N, G]
    samples = natural_samples(ctx, prompts, natural, nat, nat_adv)
    stats: dict[str, Any] = dict(phase.stats)
    if priv is not None and targets:
        if ctx.method.coupled:
            samples, coupled_stats = coupled_samples(ctx, prompts, natural, nat, priv, targets)
            stats.update(coupled_stats)
        else:
            guided, retention_stats = guided_samples(ctx, prompts, nat, priv, targets)  # eqs. 7-8 (+ ours)
            stats.update(retention_stats)
            samples += guided
    return samples, stats


# ----------------------------------------------------------------------------------------------------------
# The rollout phase: natural rollouts, their verdicts, hints, privileged rollouts and theirs


@dataclass
class RolloutPhase:
    """What the rollout phase hands the rest of the step (the same in both modes)."""

    natural: list[list[Rollout]]  # [N][G]
    nat: Scored
    priv: Scored | None  # the targets' privileged rollouts, judged on the ORIGINAL rubric
    targets: list[int]  # positions with a hint (guided phase)
    stats: dict[str, Any]  # guidance/gated_out_prompts, budget_dropped_prompts, one_pass_prompts, two_pass_prompts
    t_natural: float  # perf_counter when every natural verdict was in
    t_priv: float  # ... and every privileged one
    timings: dict[str, float] = field(default_factory=dict)  # stage seconds (sequential) / wall seconds (pipelined)


@dataclass
class PhasePlan:
    """What the step decided before its rollout phase: guidance on, one-pass hints, first visits."""

    guided: bool
    one_pass: bool
    early: dict[int, list[int]]  # position -> the previous visit's rubric indices (one-pass hints)
    first_visit: list[int]


def phase_plan(ctx: StepContext, prompts: Sequence[RubricPrompt], guided_phase: bool) -> PhasePlan:
    """One-pass guidance (core.guidance rule 6): prompts seen before are hinted with their previous visit's
    feedback and sampled in the natural generate call; first visits take the paper's two passes."""
    one_pass = guided_phase and ctx.previous is not None
    early, first_visit = ctx.previous.plan([p.prompt_id for p in prompts]) if one_pass else ({}, [])
    return PhasePlan(guided_phase, one_pass, early, first_visit)


def collect_rollouts(ctx: StepContext, prompts: Sequence[RubricPrompt], step: int, plan: PhasePlan) -> RolloutPhase:
    if ctx.pipelined:
        return pipelined_rollouts(ctx, prompts, step, plan)
    return sequential_rollouts(ctx, prompts, step, plan)


def sequential_rollouts(ctx: StepContext, prompts: Sequence[RubricPrompt], step: int,
                        plan: PhasePlan) -> RolloutPhase:
    """The stages one after the other: generate natural (+ one-pass hinted) -> judge -> hints -> generate
    privileged -> judge."""
    t0 = time.perf_counter()
    natural, early_rollouts = sample_natural_and_hinted(ctx, prompts, plan.early, step)  # [N][G], {i: [G']}
    t1 = time.perf_counter()
    nat = judge_and_score(ctx, prompts, natural)  # rewards/valid [N, G]
    t_natural = time.perf_counter()
    timings = {"natural_generation_s": t1 - t0, "natural_judging_s": t_natural - t1}
    priv, targets, stats = None, [], {}
    if plan.guided:
        feedback = step_feedback(ctx, prompts, nat.verdicts, plan, stats)  # eqs. 4-5 (+ gate, budget, one-pass)
        finish_feedback_stats(plan, dict(enumerate(feedback)), stats)
        targets = [i for i, ks in enumerate(feedback) if ks]
        criteria = {i: [prompts[i].rubric.criteria[k] for k in feedback[i]] for i in targets}
        # eq. 6, judged on the ORIGINAL rubric; one-pass: only the first visits are sampled here
        priv = sample_privileged(ctx, prompts, criteria, targets, step, early_rollouts, timings)
    t_end = time.perf_counter()
    # what generation could not hide: the last judging stage (rollout_metrics)
    timings["judge_tail_s"] = timings.get("privileged_judging_s", timings["natural_judging_s"])
    return RolloutPhase(natural, nat, priv, targets, stats, t_natural, t_end, {**timings, "rollout_s": t_end - t0})


def pipelined_rollouts(ctx: StepContext, prompts: Sequence[RubricPrompt], step: int,
                       plan: PhasePlan) -> RolloutPhase:
    """The same rollout phase as one stream (judged_stream.JudgedStream, docs/nemo_rl.md "The step's timeline"):
    every response is judged as soon as it is generated, a prompt's hint is picked as soon as its natural group is
    judged, and its privileged request goes to the generator at once, while other prompts are still generated or
    judged. The result is sequential_rollouts', exactly: the same generate calls slot for slot, the same judge
    requests, and the same order for everything that draws from or updates the step's state. With request seeds
    every sample and hint template has its own seed, so prompts are decided as they are judged; without them
    (one random stream per call, templates from the step's RNG) in position order; always in position order within
    a prompt id (the gate's EMA and one-pass hints are per prompt id). The privileged budget ranks every prompt:
    with it, hints are picked once all natural groups are judged (responses are still judged as generated)."""
    t0 = time.perf_counter()
    n, g_priv = len(prompts), privileged_group_size(ctx.cfg)

    def judge_request(group: tuple[str, int], rollout: Rollout) -> JudgeRequest:
        prompt = prompts[group[1]]  # the ORIGINAL conversation, never a hint (as judge_groups)
        return JudgeRequest(list(prompt.messages), rollout.response_text, prompt.rubric, prompt.prompt_id)

    stream = JudgedStream(ctx.generator, ctx.judge, judge_request)
    natural = natural_requests(ctx, prompts, step)
    per_prompt = len(natural) // n  # 1 request of G samples, or G requests of one (RuscaRL)
    for i in range(n):
        stream.add_group(("nat", i), int(ctx.cfg.sampling.group_size))
    order = sorted(plan.early)
    hinted = hinted_requests(ctx, prompts, {i: [prompts[i].rubric.criteria[k] for k in plan.early[i]] for i in order},
                             order, step)
    call = stream.call("natural", len(natural) + len(hinted), sampling_params(ctx.cfg, step, STREAM_NATURAL))
    for slot, request in enumerate(natural):
        call.put(slot, request, ("nat", slot // per_prompt), first=slot % per_prompt if per_prompt > 1 else 0)
    for k, (i, request) in enumerate(zip(order, hinted)):
        stream.add_group(("priv", i), g_priv, priority=1)  # nothing waits on its verdicts but the step's end
        call.put(len(natural) + k, request, ("priv", i))
    privileged = stream.call("privileged", n, sampling_params(ctx.cfg, step, STREAM_PRIVILEGED)) if plan.guided else None
    decided: dict[int, list[int]] = {}
    stats: dict[str, Any] = {}
    t_natural: list[float] = []

    def nat_verdicts(i: int) -> list[list[Verdict]]:
        return stream.groups[("nat", i)].verdicts  # type: ignore[return-value]

    def send(i: int, chosen: list[int]) -> None:
        decided[i] = chosen
        if not chosen or ("priv", i) in stream.groups:  # no hint, or sampled with the natural call (one-pass)
            privileged.skip(i)
            return
        (request,) = hinted_requests(ctx, prompts, {i: [prompts[i].rubric.criteria[k] for k in chosen]}, [i], step)
        stream.add_group(("priv", i), g_priv, priority=1)
        privileged.put(i, request, ("priv", i))

    def on_judged(group: tuple[str, int]) -> None:
        if group[0] != "nat":
            return
        all_judged = all(stream.groups[("nat", i)].judged for i in range(n))
        if all_judged and not t_natural:
            t_natural.append(time.perf_counter())
        if not plan.guided or len(decided) == n:
            return
        if ctx.options.privileged_budget is not None:
            if all_judged:
                for i, chosen in enumerate(step_feedback(ctx, prompts, [nat_verdicts(i) for i in range(n)], plan,
                                                         stats)):
                    send(i, chosen)
            return
        for i in range(n):
            if i in decided:
                continue
            pid = prompts[i].prompt_id
            if stream.groups[("nat", i)].judged and all(k in decided for k in range(i) if prompts[k].prompt_id == pid):
                send(i, prompt_feedback(ctx, prompts[i], nat_verdicts(i), plan, i, stats))
            elif not ctx.request_seeds:
                return  # one random stream per call: prompts are decided in position order

    def done() -> bool:
        return all(grp.judged for grp in stream.groups.values()) and (not plan.guided or len(decided) == n)

    stream.run(on_judged, done)
    nat = score_groups(ctx, prompts, [list(stream.groups[("nat", i)].rollouts) for i in range(n)],
                       [nat_verdicts(i) for i in range(n)])
    targets = [i for i in range(n) if decided.get(i)]
    priv = None
    if targets:
        groups = [stream.groups[("priv", i)] for i in targets]
        priv = score_groups(ctx, [prompts[i] for i in targets], [list(grp.rollouts) for grp in groups],
                            [list(grp.verdicts) for grp in groups])
    if plan.guided:
        finish_feedback_stats(plan, decided, stats)
    t_end = time.perf_counter()
    timings = {"rollout_s": t_end - t0, "judge_calls": float(stream.judge_calls),
               "judge_backlog_at_generation_end": float(stream.backlog_at_last_response)}
    if stream.t_last_response is not None and stream.t_last_verdict is not None:
        timings["judge_tail_s"] = max(0.0, stream.t_last_verdict - stream.t_last_response)
    if stream.knows_capacity:
        timings["judge_saturated_s"] = stream.saturated_s
    return RolloutPhase(nat.rollouts, nat, priv, targets, stats, t_natural[0] if t_natural else t_end, t_end, timings)


def rollout_metrics(phase: RolloutPhase) -> dict[str, float | None]:
    """What bounded the rollout phase, for sizing judge servers against generation:
    - ``time/judge_tail_s``: from the last generated response to the last verdict, the judging that generation did
      not hide (sequential: the whole last judging stage; pipelined: ideally one judge call);
    - ``time/judge_backlog_at_generation_end`` (pipelined): responses still unjudged when the last one was generated;
    - ``time/judge_saturated_share`` (pipelined, a judge that states its capacity): the share of the phase with every
      judge slot in use. Near 1 with a long tail: the judge sets the step's pace (more judge replicas, or a larger
      ``judge.max_concurrency`` if the servers have room); low with a short tail: generation does.
    All three depend on timing, hence ``time/`` (left out of what a resumed run must reproduce)."""
    t = phase.timings
    rollout_s = t.get("rollout_s") or 0.0
    return {
        "time/judge_tail_s": t.get("judge_tail_s"),
        "time/judge_backlog_at_generation_end": t.get("judge_backlog_at_generation_end"),
        "time/judge_saturated_share": (t["judge_saturated_s"] / rollout_s if "judge_saturated_s" in t and rollout_s > 0
                                  else None),
    }


def sample_seeds(ctx: StepContext, step: int, stream: int, position: int, n: int) -> tuple[int, ...] | None:
    """Request seeds of a request's n samples, or None (the call's random stream)."""
    if not ctx.request_seeds:
        return None
    run_seed = int(ctx.cfg.run.seed)
    return tuple(derive_request_seed(run_seed, step, stream, position, j) for j in range(n))


def template_rng(ctx: StepContext, step: int, position: int) -> random.Random:
    """The RNG that picks the hint template of the prompt at ``position`` (eq. 6): the step's own RNG in call
    order, or one seeded for this prompt with request seeds."""
    if not ctx.request_seeds:
        return ctx.rng
    return random.Random(derive_request_seed(int(ctx.cfg.run.seed), step, STREAM_HINT, position))


def natural_requests(ctx: StepContext, prompts: Sequence[RubricPrompt], step: int) -> list[GenerationRequest]:
    """G rollouts per prompt under the original conversation; RuscaRL: G single requests per prompt, each under its
    own scaffold (drawn here, in position order, from the step's RNG)."""
    g = int(ctx.cfg.sampling.group_size)
    if not ctx.method.ruscarl:
        return [GenerationRequest(list(p.messages), g, sample_seeds(ctx, step, STREAM_NATURAL, i, g))
                for i, p in enumerate(prompts)]
    progress = (step - 1) / max(1, ctx.total_steps)  # x in [0, 1): training progress of phi(x)
    out = []
    for i, p in enumerate(prompts):
        criteria = list(p.rubric.criteria)
        seeds = sample_seeds(ctx, step, STREAM_NATURAL, i, g)
        for j in range(g):
            n_shown = ruscarl_num_scaffold(
                len(criteria), j, g, progress, alpha=float(ctx.cfg.ruscarl.alpha), t0=float(ctx.cfg.ruscarl.t0)
            )
            out.append(GenerationRequest(build_ruscarl_prompt(list(p.messages), criteria, ctx.rng, num=n_shown), 1,
                                         None if seeds is None else (seeds[j],)))
    return out


def hinted_requests(ctx: StepContext, prompts: Sequence[RubricPrompt], feedback: Any, positions: Sequence[int],
                    step: int) -> list[GenerationRequest]:
    """Eq. 6 for each position: G' rollouts under its conversation with a hint naming ``feedback[i]``."""
    g_priv = privileged_group_size(ctx.cfg)
    templates = hint_templates(hint_style(ctx.cfg))
    return [GenerationRequest(build_privileged_prompt(list(prompts[i].messages), feedback[i],
                                                      template_rng(ctx, step, i), templates),
                              g_priv, sample_seeds(ctx, step, STREAM_PRIVILEGED, i, g_priv))
            for i in positions]


def sample_natural_and_hinted(
    ctx: StepContext, prompts: Sequence[RubricPrompt], hints: dict[int, list[int]], step: int
) -> tuple[list[list[Rollout]], dict[int, list[Rollout]]]:
    """The natural rollouts and, for one-pass guidance, the privileged rollouts of the prompts in ``hints``
    (position -> rubric indices of the previous visit's feedback) in the SAME generate call (on NeMo-RL: one
    vLLM request batch). Returns ([N][G] natural, {position: G' privileged})."""
    natural = natural_requests(ctx, prompts, step)
    order = sorted(hints)
    hinted = hinted_requests(ctx, prompts, {i: [prompts[i].rubric.criteria[k] for k in hints[i]] for i in order},
                             order, step)
    groups = generate_requests(ctx.generator, natural + hinted, sampling_params(ctx.cfg, step, STREAM_NATURAL))
    nat, early = groups[: len(natural)], dict(zip(order, groups[len(natural):]))
    if len(natural) == len(prompts):
        return nat, early
    g = len(natural) // len(prompts)  # RuscaRL: one single-sample request per scaffolded rollout
    return [[nat[i * g + j][0] for j in range(g)] for i in range(len(prompts))], early


@RUBRIC.scorers.implement("rubric_judge")
def judge_and_score(
    ctx: StepContext, prompts: Sequence[RubricPrompt], groups: Sequence[Sequence[Rollout]]
) -> Scored:
    """Judge every response against its prompt's full rubric in the ORIGINAL conversation; eq. 3 rewards."""
    return score_groups(ctx, prompts, groups, judge_groups(ctx.judge, prompts, groups))


def score_groups(ctx: StepContext, prompts: Sequence[RubricPrompt], groups: Sequence[Sequence[Rollout]],
                 verdicts: list[list[list[Verdict]]]) -> Scored:
    """Eq. 3 rewards (+ the overlong penalty) of judged groups; a response with an unknown verdict is invalid."""
    n, g = len(groups), max((len(x) for x in groups), default=0)
    rewards = torch.zeros(n, g)
    valid = torch.zeros(n, g, dtype=torch.bool)
    for i, (prompt, group) in enumerate(zip(prompts, groups)):
        weights = prompt.rubric.weights
        for j, verdict in enumerate(verdicts[i]):
            if any(v is None for v in verdict):
                continue  # unknown verdict: excluded from rewards, advantages and training (counted)
            z = torch.tensor([float(v) for v in verdict])
            rewards[i, j] = rubric_reward(z, weights, clip_min=ctx.cfg.reward.clip_min)
            valid[i, j] = True
        if ctx.cfg.reward.overlong_buffer > 0 and group:
            lengths = [len(r.response_token_ids) for r in group]
            pen = overlong_penalty(lengths, int(ctx.cfg.sampling.max_new_tokens), int(ctx.cfg.reward.overlong_buffer),
                                   float(ctx.cfg.reward.overlong_factor))
            rewards[i, : len(group)] += torch.where(valid[i, : len(group)], pen, torch.zeros_like(pen))
    return Scored(list(map(list, groups)), verdicts, rewards, valid)


def feedback_indices(
    prompt: RubricPrompt, verdicts: list[list[Verdict]], valid: torch.Tensor, top_m: int | None
) -> list[int]:
    """Eqs. 4-5 over the valid natural responses: rubric indices of the TopM repeatedly failed criteria
    (may be empty), highest priority first."""
    z = valid_verdicts(verdicts, valid)
    if z.shape[0] == 0:
        return []
    weights = prompt.rubric.weights
    failures = failure_matrix(z, weights).sum(0)  # f_k, [K]
    return list(select_feedback(criterion_priority(z, weights), failures, top_m))


def valid_verdicts(verdicts: Sequence[Sequence[Verdict]], valid: torch.Tensor) -> torch.Tensor:
    """bool [G_valid, K] of the valid responses' verdicts (unknown verdicts only occur in invalid rows)."""
    rows = [[bool(v) for v in verdicts[j]] for j in range(len(verdicts)) if bool(valid[j])]
    return torch.tensor(rows, dtype=torch.bool) if rows else torch.zeros(0, 0, dtype=torch.bool)


def verdict_matrix(verdicts: Sequence[Sequence[Verdict]]) -> torch.Tensor:
    """bool [G, K]; unknown verdicts read as False (their rows are excluded through the valid mask)."""
    return torch.tensor([[bool(v) for v in row] for row in verdicts], dtype=torch.bool)


def verdict_validity(verdicts: Sequence[Sequence[Verdict]]) -> torch.Tensor:
    """bool [G]: the responses whose every verdict is known (score_groups' valid row)."""
    return torch.tensor([all(v is not None for v in row) for row in verdicts], dtype=torch.bool)


def prompt_feedback(ctx: StepContext, prompt: RubricPrompt, verdicts: Sequence[Sequence[Verdict]], plan: Any,
                    position: int, stats: dict[str, Any]) -> list[int]:
    """One prompt's hint, rubric indices (empty: no privileged rollouts): eqs. 4-5 over its natural group, the
    gate, and for one-pass guidance the previous visit's hint (this visit's is recorded for the next one). Updates
    the gate's and one-pass guidance's state: call it for the prompts of a step in position order within a prompt
    id (a prompt id may come twice in one step)."""
    chosen = gated(ctx, prompt, verdicts, feedback_indices(prompt, list(verdicts), verdict_validity(verdicts),
                                                           ctx.cfg.rise.top_m), stats)
    if not plan.one_pass:
        return chosen
    ctx.previous.record(prompt.prompt_id, chosen)  # the next visit's hints
    return chosen if position in plan.first_visit else list(plan.early.get(position, []))


def gated(ctx: StepContext, prompt: RubricPrompt, verdicts: Sequence[Sequence[Verdict]], chosen: list[int],
          stats: dict[str, Any]) -> list[int]:
    """Adaptive gating (core.guidance.FailureGate): fold this visit's per-criterion failure shares into the
    prompt's EMA and keep only the feedback criteria whose EMA passes the threshold."""
    if ctx.gate is None:
        return chosen
    stats.setdefault("guidance/gated_out_prompts", 0)
    z = valid_verdicts(verdicts, verdict_validity(verdicts))
    if z.shape[0] == 0:
        return []
    share = failure_matrix(z, prompt.rubric.weights).float().mean(0)  # [K]
    ema = ctx.gate.update(prompt.prompt_id, share.tolist())
    kept = ctx.gate.passes(ema, chosen)
    stats["guidance/gated_out_prompts"] += bool(chosen) and not kept
    return kept


def step_feedback(ctx: StepContext, prompts: Sequence[RubricPrompt], verdicts: Sequence[Sequence[Sequence[Verdict]]],
                  plan: Any, stats: dict[str, Any]) -> list[list[int]]:
    """Every prompt's hint (prompt_feedback in position order), then the privileged budget, which ranks them all."""
    if ctx.options.privileged_budget is None:
        return [prompt_feedback(ctx, p, v, plan, i, stats) for i, (p, v) in enumerate(zip(prompts, verdicts))]
    feedback = [gated(ctx, p, v, feedback_indices(p, list(v), verdict_validity(v), ctx.cfg.rise.top_m), stats)
                for p, v in zip(prompts, verdicts)]  # one-pass guidance does not combine with the budget
    return budget_feedback(ctx, prompts, verdicts, feedback, stats)


def finish_feedback_stats(plan: Any, feedback: dict[int, list[int]], stats: dict[str, Any]) -> None:
    if plan.one_pass:
        stats["guidance/one_pass_prompts"] = len(plan.early)
        stats["guidance/two_pass_prompts"] = sum(1 for i in plan.first_visit if feedback.get(i))


def budget_feedback(ctx: StepContext, prompts: Sequence[RubricPrompt], verdicts: Sequence[Sequence[Sequence[Verdict]]],
                    feedback: list[list[int]], stats: dict[str, Any]) -> list[list[int]]:
    """Privileged budget (core.guidance.budget_targets): the prompts whose hinted criteria fail most keep
    their feedback; the others get none this step. Priority: the gate's EMA when it is on, else the
    current group's failure share, of the prompt's most-failed hinted criterion."""
    candidates, priorities = [], []
    for i, (prompt, chosen) in enumerate(zip(prompts, feedback)):
        if not chosen:
            continue
        if ctx.gate is not None:
            share = ctx.gate.values[prompt.prompt_id]
        else:
            z = valid_verdicts(verdicts[i], verdict_validity(verdicts[i]))
            share = failure_matrix(z, prompt.rubric.weights).float().mean(0).tolist()
        candidates.append(i)
        priorities.append(max(share[k] for k in chosen))
    g_priv = privileged_group_size(ctx.cfg)
    natural_rollouts = len(prompts) * max((len(v) for v in verdicts), default=0)
    kept = {candidates[j] for j in budget_targets(priorities, natural_rollouts, g_priv, ctx.options.privileged_budget)}
    stats["guidance/budget_dropped_prompts"] = len(candidates) - len(kept)
    return [chosen if i in kept else [] for i, chosen in enumerate(feedback)]


def privileged_group_size(cfg: Any) -> int:
    """G' (rise.privileged_group_size, default sampling.group_size)."""
    return int(cfg.rise.privileged_group_size or cfg.sampling.group_size)


def sample_privileged(
    ctx: StepContext, prompts: Sequence[RubricPrompt], feedback: dict[int, list[Criterion]], targets: list[int],
    step: int, sampled: dict[int, list[Rollout]] | None = None, timings: dict[str, float] | None = None,
) -> Scored | None:
    """G' rollouts per target prompt under its privileged prompt (eq. 6), judged on the ORIGINAL rubric.
    ``sampled``: targets whose privileged rollouts one-pass guidance already drew with the natural ones."""
    if not targets:
        return None
    sampled = sampled or {}
    rest = [i for i in targets if i not in sampled]
    t0 = time.perf_counter()
    if rest:
        rollouts = generate_requests(ctx.generator, hinted_requests(ctx, prompts, feedback, rest, step),
                                     sampling_params(ctx.cfg, step, STREAM_PRIVILEGED))
        sampled = {**sampled, **dict(zip(rest, rollouts))}
    t1 = time.perf_counter()
    scored = judge_and_score(ctx, [prompts[i] for i in targets], [sampled[i] for i in targets])
    if timings is not None:
        timings.update(privileged_generation_s=t1 - t0, privileged_judging_s=time.perf_counter() - t1)
    return scored


def natural_samples(
    ctx: StepContext, prompts: Sequence[RubricPrompt], natural: list[list[Rollout]], nat: Scored, adv: torch.Tensor
) -> list[TrainSample]:
    """Kind-0 rows: every valid natural response with its eq. 1 advantage (RuscaRL: under the original prompt)."""
    out = []
    for i, (prompt, group) in enumerate(zip(prompts, natural)):
        for j, r in enumerate(group):
            if not bool(nat.valid[i, j]):
                continue
            prompt_ids = ctx.original_prompt_ids(prompt) if ctx.method.ruscarl else list(r.prompt_token_ids)
            out.append(TrainSample(prompt_ids, list(r.response_token_ids), KIND_NATURAL, float(adv[i, j]),
                                   list(r.sampling_logprobs), sampled_under_train_prompt=not ctx.method.ruscarl,
                                   source=(False, i, j)))
    return out


def guided_samples(
    ctx: StepContext, prompts: Sequence[RubricPrompt], nat: Scored, priv: Scored, targets: list[int]
) -> tuple[list[TrainSample], dict[str, Any]]:
    """Kind-1 rows: privileged responses with A_ref > 0 (eqs. 7-8), spliced onto the ORIGINAL prompt,
    filtered by our retention rules (core.guidance: no-regression, penalised-span masks, length check)."""
    opts = ctx.options
    a_ref = reference_advantages(priv.rewards, nat.rewards[targets], nat.valid[targets])  # [N', G']
    out: list[TrainSample] = []
    dropped_by: dict[str, int] = {}
    counts = {"no_regression": 0, "length": 0, "masked_responses": 0, "masked_tokens": 0, "fully_masked": 0}
    nat_len, priv_len, kept_len = [], [], []
    for t, i in enumerate(targets):
        prompt, rollouts = prompts[i], priv.rollouts[t]
        weights = prompt.rubric.weights
        priv_z = verdict_matrix(priv.verdicts[t])  # [G', K]
        masks, excused = penalised_span_masks(ctx, prompt, rollouts, priv_z, a_ref[t] > 0)
        keep, scale, failed = no_regression_retention(
            a_ref[t], priv_z, priv.valid[t], verdict_matrix(nat.verdicts[i]), nat.valid[i], weights,
            opts.no_regression, opts.keep_threshold, excused)
        if opts.no_regression == "hard":
            counts["no_regression"] += int(failed.any(1).sum())
        for k in failed.any(0).nonzero().flatten().tolist():
            dropped_by[prompt.rubric.criteria[k].text] = dropped_by.get(prompt.rubric.criteria[k].text, 0) + int(failed[:, k].sum())
        lengths = [len(r.response_token_ids) for r in rollouts]
        natural = [len(r.response_token_ids) for j, r in enumerate(nat.rollouts[i]) if bool(nat.valid[i, j])]
        short_enough = length_ok(lengths, natural, opts.max_length_ratio)
        counts["length"] += sum(1 for j, ok in enumerate(short_enough) if bool(keep[j]) and not ok)
        nat_len += natural
        priv_len += [n for j, n in enumerate(lengths) if bool(priv.valid[t, j])]
        for j, r in enumerate(rollouts):
            if not (bool(keep[j]) and short_enough[j]):
                continue
            mask = masks.get(j)
            if mask is not None and not any(mask):
                counts["fully_masked"] += 1  # nothing left to imitate (e.g. one unpunctuated sentence)
                continue
            if mask is not None:
                counts["masked_responses"] += 1
                counts["masked_tokens"] += mask.count(0)
            kept_len.append(lengths[j])
            # Sampling log-probs were taken under the hinted prompt: meaningless under the original one.
            out.append(TrainSample(ctx.original_prompt_ids(prompt), list(r.response_token_ids), KIND_GUIDED,
                                   float(a_ref[t, j] * scale[j]), [0.0] * len(r.response_token_ids),
                                   sampled_under_train_prompt=False, source=(True, t, j), loss_mask=mask))
    valid_refs = a_ref[priv.valid]
    stats = {
        "guidance/retained": len(out),
        "guidance/retained_frac": len(out) / max(1, int(priv.valid.sum())),
        "guidance/a_ref_mean": float(valid_refs.mean()) if valid_refs.numel() else None,
        "guidance/guided_prompts": len(targets),
        "guidance/dropped_no_regression": counts["no_regression"],
        "guidance/dropped_length": counts["length"],
        "guidance/masked_responses": counts["masked_responses"],
        "guidance/masked_tokens": counts["masked_tokens"],
        "guidance/dropped_fully_masked": counts["fully_masked"],
        # hinted / natural mean response length (tokens) over the guided prompts; and of the retained ones
        "guidance/length_ratio": _ratio(statistics_mean(priv_len), statistics_mean(nat_len)),
        "guidance/length_ratio_retained": _ratio(statistics_mean(kept_len), statistics_mean(nat_len)),
    }
    if dropped_by:
        # {criterion text: privileged responses failing it while most natural ones satisfy it}
        stats["guidance/no_regression_by_criterion"] = dict(sorted(dropped_by.items()))
    return out, stats


def statistics_mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def penalised_span_masks(
    ctx: StepContext, prompt: RubricPrompt, rollouts: Sequence[Rollout], priv_z: torch.Tensor, candidates: torch.Tensor
) -> tuple[dict[int, list[int]], torch.Tensor]:
    """Token masks excluding the text of met negative criteria from the guide loss (core.guidance).

    Only for responses eq. 8 could keep (``candidates`` bool [G']), and only where the judge implements
    interfaces.SpanLocatingJudge and the generator can decode (``decode_response``); otherwise nothing
    is masked. Returns ({response index: per-token mask}, excused bool [G', K]: met negative criteria
    whose text was located and masked).
    """
    excused = torch.zeros_like(priv_z)
    judge, generator = ctx.judge, ctx.generator
    if not (ctx.options.mask_penalised_spans and isinstance(judge, SpanLocatingJudge)
            and isinstance(generator, ResponseDecoder)):
        return {}, excused
    negative = [k for k, c in enumerate(prompt.rubric.criteria) if c.is_negative]
    masks: dict[int, list[int]] = {}
    for j, r in enumerate(rollouts):
        if not bool(candidates[j]):
            continue
        spans = []
        request = JudgeRequest(list(prompt.messages), r.response_text, prompt.rubric, prompt.prompt_id)
        for k in negative:
            if not bool(priv_z[j, k]):
                continue
            found = judge.locate_spans(request, k)
            if ctx.options.span_unit == "sentence":
                found = [sentence_span(r.response_text, a, b) for a, b in found]
            if found:
                excused[j, k] = True
                spans += found
        if spans:
            ids = list(r.response_token_ids)
            masks[j] = token_span_mask(len(ids), lambda n, ids=ids: len(generator.decode_response(ids[:n])), spans)
    return masks, excused


def coupled_samples(
    ctx: StepContext,
    prompts: Sequence[RubricPrompt],
    natural: list[list[Rollout]],
    nat: Scored,
    priv: Scored,
    targets: list[int],
) -> tuple[list[TrainSample], dict[str, Any]]:
    """Coupled ablation: privileged rows join their prompt's natural group (eq. 1 over G + G'), all kind 0."""
    adv_nat = group_advantages(nat.rewards, eps=ctx.cfg.advantage.eps, valid=nat.valid).clone()  # [N, G]
    adv_n, adv_p = coupled_group_advantages(nat.rewards[targets], priv.rewards, eps=ctx.cfg.advantage.eps,
                                            nat_valid=nat.valid[targets], priv_valid=priv.valid)
    adv_nat[targets] = adv_n
    samples = natural_samples(ctx, prompts, natural, nat, adv_nat)
    for t, i in enumerate(targets):
        for j, r in enumerate(priv.rollouts[t]):
            if bool(priv.valid[t, j]):
                samples.append(TrainSample(ctx.original_prompt_ids(prompts[i]), list(r.response_token_ids),
                                           KIND_NATURAL, float(adv_p[t, j]), [0.0] * len(r.response_token_ids),
                                           sampled_under_train_prompt=False, source=(True, t, j)))
    return samples, {"guidance/retained": int(priv.valid.sum()), "guidance/retained_frac": 1.0}


def step_loss_fn(ctx: StepContext, lam: float):
    """This step's loss: eq. 12 with this step's lambda_guide and the method's guide-loss token weights; a
    picklable partial (NeMo-RL ships the loss to its workers)."""
    return recipe_policy_loss_fn(ctx.cfg, lam, ctx.method.token_weighting)


def guidance_delta(nat: Scored, priv: Scored | None, targets: list[int]) -> float | None:
    """Eq. 13's Delta_r over the prompts that got guidance (core.schedule.reward_gap: per-prompt gaps)."""
    if priv is None or not targets:
        return None
    return reward_gap(priv.rewards, priv.valid, nat.rewards[targets], nat.valid[targets])


def step_metrics(ctx, step, lam, guided_phase, nat, priv, delta_r, batch, train_metrics, guide_stats, times):
    t_start, t_natural, t_priv, t_train, t_end = times
    unknown = int((~nat.valid).sum()) + (int((~priv.valid).sum()) if priv is not None else 0)
    kind = batch["kind"]
    metrics: dict[str, Any] = {
        "step": step,
        "reward/natural_mean": finite_or_none(nat.mean_reward),
        "reward/natural_std": float(nat.rewards[nat.valid].std()) if int(nat.valid.sum()) > 1 else 0.0,
        "reward/privileged_mean": finite_or_none(priv.mean_reward) if priv is not None else None,
        "guidance/active": bool(guided_phase),
        "guidance/delta_r": finite_or_none(delta_r),
        "guidance/lambda": lam,
        "guidance/retained": 0,
        "guidance/privileged_rollouts": sum(len(g) for g in priv.rollouts) if priv is not None else 0,
        "judge/unknown_excluded": unknown,
        "batch/natural_rows": int((kind == KIND_NATURAL).sum()),
        "batch/guided_rows": int((kind == KIND_GUIDED).sum()),
        "loss/pg": None,
        "loss/guide": None,
        "policy/entropy": None,
    }
    metrics.update(guide_stats)
    metrics.update({k: finite_or_none(float(v)) for k, v in train_metrics.items()})
    if ctx.method.guidance:  # only once guidance has actually been removed (never for a run that did not switch)
        switched = not bool(ctx.schedule.active)
        metrics["guidance/switch_reason"] = ctx.schedule.switch_reason if switched else None
    metrics["time/step_s"] = t_end - t_start
    metrics["time/natural_s"] = t_natural - t_start
    metrics["time/privileged_s"] = t_priv - t_natural
    metrics["time/train_s"] = t_train - t_priv
    return metrics


def request_seeding(cfg: Any, generator: Generator) -> bool:
    """``sampling.request_seeds``: true / false, or auto = what the generator asks for (``seeds_per_request``: NeMo-RL's
    async vLLM engine, whose continuous batching has no per-call random stream); the local backend keeps one
    stream per call (its samples are those of every earlier release)."""
    mode = cfg.sampling.request_seeds
    if mode == "auto":
        return bool(getattr(generator, "seeds_per_request", False))
    return bool(mode)


def pipelining(cfg: Any, generator: Generator, judge: Judge) -> bool:
    """``rise.pipeline``: true / false, or auto = where judging can overlap generation: a generator that streams
    (local backend; NeMo-RL's async vLLM engine) and a judge with latency that does not block (an HTTP or Ray
    judge, interfaces.AsyncJudge). The in-process rule judge answers at once: nothing to overlap."""
    mode = cfg.rise.pipeline
    if mode is False:
        return False
    return mode is True or (streams_natively(generator) and isinstance(judge, AsyncJudge))


# ----------------------------------------------------------------------------------------------------------
# The step object of the rubric step kind (rise_nemo.methods.registry.RUBRIC)

PROGRESS_KEYS = (("reward/natural_mean", "r_nat"), ("reward/privileged_mean", "r_priv"),
                 ("guidance/delta_r", "dr"), ("guidance/lambda", "lam"), ("guidance/retained", "kept"))


@RUBRIC.implement_step
class RubricStep:
    """Rubric-judged GRPO with RISE-RL's guidance (train_step); evaluation without guidance (rubric_eval.py)."""

    train_step = staticmethod(train_step)

    @staticmethod
    def check(method: RubricMethod, cfg: Any) -> None:
        return None  # the judge block is checked by build_judge

    @staticmethod
    def check_data(method: RubricMethod, cfg: Any, train_prompts: Sequence[RubricPrompt]) -> None:
        return None

    @staticmethod
    def build_judge(method: RubricMethod, cfg: Any) -> Judge:
        """The rubric judge of the ``judge:`` block, checked (and HTTP judges probed) before any model is built."""
        return build_checked_judge(cfg.judge)

    @staticmethod
    def build_parts(method: RubricMethod, cfg: Any, policy: Any, checkpoint: Any) -> dict[str, Any]:
        return {}  # the judge scores; no verifier, critic or reward model

    @staticmethod
    def build_context(method: RubricMethod, run: Any) -> StepContext:
        return StepContext(cfg=run.cfg, policy=run.policy, generator=run.generator, judge=run.judge,
                           schedule=make_schedule(run.cfg), rng=run.rng, method=method, total_steps=run.total_steps,
                           pad_id=run.pad_id, samples_per_step=run.samples_per_step,
                           request_seeds=request_seeding(run.cfg, run.generator),
                           pipelined=pipelining(run.cfg, run.generator, run.judge))

    @staticmethod
    def progress_keys(method: RubricMethod) -> tuple[tuple[str, str], ...]:
        return PROGRESS_KEYS

    @staticmethod
    def evaluate(ctx: StepContext, eval_prompts: Sequence[RubricPrompt], step: int) -> tuple[dict[str, Any], dict]:
        """Guidance-free evaluation (rise_nemo.steps.rubric_eval): (result, fields to log)."""
        result = evaluate(ctx.cfg, ctx.generator, ctx.judge, eval_prompts, step)
        return result, {"reward": result["reward_mean"], "persistent coverage": result["persistent_coverage"],
                        "negative rate": result["negative_rate"]}


def _verdict(v: Any) -> bool | None:
    return None if v is None else bool(v)


def sample_records(step: int, prompts: Sequence[Any], nat: Any, priv: Any, targets: Sequence[int],
                   samples: Sequence[Any], cap: int) -> list[dict[str, Any]]:
    """What the step trained on, for ``samples.jsonl`` (like TRL's completion logging): per recorded rollout the
    step, prompt id, whether it was sampled under a hint (privileged, eq. 6), the response, its per-criterion
    verdicts on the ORIGINAL rubric, reward (eq. 3), the advantage it was trained with (eq. 1 natural, A_ref of
    eq. 7 guided; null when it was not trained on: an unknown verdict, or a privileged response with A_ref <= 0,
    eq. 8) and its kind (0 natural, 1 guided). At most ``cap`` natural and ``cap`` privileged rollouts per step
    (the first prompts of the batch, in order), so the file stays small on long runs (``train.log_samples``)."""
    trained = {s.source: s for s in samples if s.source is not None}
    records: list[dict[str, Any]] = []

    def add(scored: Any, privileged: bool, rows: Sequence[tuple[int, int]]) -> None:
        n = 0
        for row, prompt_index in rows:
            for j, rollout in enumerate(scored.rollouts[row]):
                if n >= cap:
                    return
                sample = trained.get((privileged, row, j))
                valid = bool(scored.valid[row, j])
                records.append({
                    "step": step,
                    "prompt_id": prompts[prompt_index].prompt_id,
                    "hinted": privileged,
                    "response": rollout.response_text,
                    "verdicts": [_verdict(v) for v in scored.verdicts[row][j]],
                    "reward": float(scored.rewards[row, j]) if valid else None,
                    "advantage": None if sample is None else float(sample.advantage),
                    "kind": None if sample is None else int(sample.kind),
                })
                n += 1

    add(nat, False, [(i, i) for i in range(len(prompts))])
    if priv is not None:
        add(priv, True, list(enumerate(targets)))
    return records
