"""One training step of the reasoning methods (docs/DESIGN.md §7), written against rise_nemo.interfaces.

``reasoning_train_step`` reads top to bottom; which method runs is configuration: the scorer, advantage
estimator and hooks its ``ReasoningMethod`` names (rise_nemo.methods; the pieces of the reasoning step kind,
rise_nemo.methods.registry.REASONING):

  ppo   G rollouts per problem, sparse verifier reward on the last token, critic values, GAE (core.value),
        clipped PG on per-token advantages, then the critic's clipped value loss; during the first
        ``ppo.critic_warmup_steps`` steps only the critic trains (verl's critic warm-up; every critic method)
  rrl   ppo whose rollouts may continue value-selected states from a per-problem replay buffer (the hooks of
        rise_nemo.steps.rrl; docs/DESIGN.md §9)
  grpo  G rollouts per problem, sparse 0/1 verifier reward, group advantages (eq. 1 of RISE-RL / GRPO)
  exprl_outcome / exprl_process / self_distillation / sft   ExpRL's Stage I and its baselines
        (rise_nemo.steps.exprl; docs/DESIGN.md §8): the reference judge's scores as group rewards or
        per-segment token advantages, the reference-in-context teacher's token advantages, or SFT

The seams RRL and ExpRL plug into without forking this step:
  hooks          ``ReasoningContext.hooks`` (a ``StepHooks``; default: every method but rrl, all no-ops):
                 ``start_states(ctx, problems, step)`` gives per-ROLLOUT response prefixes [N][G] (token ids;
                 [] = from the problem) or None = every rollout from scratch (RRL's replay buffer,
                 rise_nemo.steps.rrl); given tokens are context only (token_mask 0) and GAE starts at
                 the state (core.value.gae). ``after_score`` sees the scored groups and the built batch
                 (critic values included) and which rollouts solved their problem (``StepScores.solved_mask``)
                 before the policy update; ``after_train`` the step's metrics.
  scores         ``ReasoningContext.score`` runs the run's scorer (the recipe's ``reward.scorer`` or the method's): rewards
                 [N, G] and a valid mask as one ``StepScores``, which may carry per-token advantages
                 (ExpRL-Process). Verifier 0/1 here; ExpRL's reference judge in rise_nemo.steps.exprl, a reward
                 model's score in rise_nemo.steps.reward_model.
  advantages     the method's registered advantage estimator (``group`` and ``gae`` here, ``segment`` and
                 ``self_distillation`` in rise_nemo.steps.exprl) writes the batch's advantage columns.
Sampling parameters, batch building and the policy loss are every step's (rise_nemo.steps.rollouts); the SFT
baseline's step is rise_nemo.steps.sft.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rise_nemo.core.advantages import group_advantages
from rise_nemo.core.metrics import finite_or_none, perplexity_variance, ranking_auc
from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.core.replay import state_boundaries
from rise_nemo.core.value import (
    explained_variance,
    gae,
    make_value_loss,
    monte_carlo_returns,
    terminal_token_rewards,
    whiten,
)
from rise_nemo.interfaces import (
    KIND_NATURAL,
    BatchMetricsVerifier,
    Critic,
    Generator,
    Policy,
    Rollout,
    Verifier,
)
from rise_nemo.judges.checked import build_checked_judge
from rise_nemo.methods.registry import REASONING, ReasoningMethod, Scorer
from rise_nemo.steps.rollouts import (
    STREAM_NATURAL,
    TrainSample,
    build_batch,
    eval_sampling_params,
    find_tokenizer,
    generate_each,
    recipe_policy_loss_fn,
    sampling_params,
    token_texts,
    verify_groups,
)
from rise_nemo.steps.verifiers import build_problem_parts, check_real_model, check_verifier


@dataclass
class StepScores:
    """What a reasoning step's scoring hook returns. rewards, valid: [N, G]; token_advantages: per (i, j)
    of a valid rollout, advantages aligned with its ``response_token_ids`` (per-token methods only)."""

    rewards: torch.Tensor
    valid: torch.Tensor
    token_advantages: dict[tuple[int, int], torch.Tensor] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    # [N, G] bool: which rollouts solved their problem (RRL's "correct", Algorithm 1 lines 9 and 14); None =
    # reward > 0.5, i.e. the 0/1 verifier's verdict. The reward-model scorer sets it (beats the reference reply).
    solved: torch.Tensor | None = None

    def solved_mask(self) -> torch.Tensor:
        return self.solved if self.solved is not None else self.rewards > 0.5


@REASONING.hooks.implement("none")
class StepHooks:
    """What a method adds around the shared step (the default: nothing; PPO / GRPO / ExpRL / SFT). A method's
    hooks (``ReasoningMethod.hooks``) are built once per run from the recipe and the training set's size."""

    def __init__(self, cfg: Any = None, n_train_problems: int = 0):
        pass

    @classmethod
    def check_data(cls, cfg: Any, train_problems: Sequence[Any]) -> None:
        """Refuses (one-line UserError) training data these hooks cannot work on, before any model is built."""
        return None

    def start_states(self, ctx: ReasoningContext, problems: Sequence[ReasoningProblem],
                     step: int) -> list[list[list[int]]] | None:
        """Per-rollout given response prefixes [N][G] ([] = from the problem), or None: all from scratch."""
        return None

    def after_score(self, ctx: ReasoningContext, problems: Sequence[ReasoningProblem], groups: list[list[Rollout]],
                    solved: torch.Tensor, valid: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """After scoring and advantages, before the policy update (``solved`` [N, G]: which rollouts solved their
        problem); returns metrics for the step."""
        return {}

    def after_train(self, ctx: ReasoningContext, metrics: dict[str, Any]) -> dict[str, Any]:
        """After the policy and critic updates, with the step's train metrics; returns metrics."""
        return {}

    def state_dict(self) -> dict[str, Any] | None:
        """The hooks' own state for the trainer's checkpoint (None: stateless)."""
        return None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        return None


@dataclass
class ReasoningContext:
    """Everything a reasoning step needs; built once by the trainer."""

    cfg: Any  # validated recipe
    policy: Policy
    generator: Generator
    verifier: Verifier
    method: ReasoningMethod
    critic: Critic | None = None  # required when method.critic (its advantage estimator reads values)
    pad_id: int = 0
    hooks: StepHooks | None = None  # method-specific stages (RRL: rise_nemo.steps.rrl); None: no-ops
    rng: random.Random = field(default_factory=random.Random)  # method-level choices (RRL replay); checkpointed
    samples_per_step: int = 0  # rollouts recorded in ``last_samples`` (samples.jsonl); 0 = none
    last_samples: list[dict[str, Any]] = field(default_factory=list)
    reference_judge: Any = None  # ExpRL methods: rise_nemo.judges.reference (sees the hidden reference)
    step_accuracy: Any = None  # the task's step-accuracy checker for evaluation (None: not reported)
    reward_model: Any = None  # interfaces.RewardModel (the ``reward_model`` scorer), or None

    scorer: Scorer = field(init=False)  # the recipe's ``reward.scorer`` or the method's own

    def __post_init__(self) -> None:
        self.scorer = self.method.scorer_for(self.cfg)
        if self.method.critic and self.critic is None:
            raise ValueError(f"method {self.method.name!r} needs a critic (backend build_critic)")
        if self.scorer.judge == "reference" and self.reference_judge is None:
            raise ValueError(f"scorer {self.scorer.name!r} needs a reference judge (rise_nemo.judges.reference)")
        if self.hooks is None:
            self.hooks = StepHooks()

    def score(self, problems: Sequence[ReasoningProblem], groups: Sequence[Sequence[Rollout]]) -> StepScores:
        """The step's rewards from the run's scorer."""
        return REASONING.scorers.impl(self.scorer.name)(self, problems, groups)

    def reference_judge_calls(self) -> int:
        return int(self.reference_judge.calls) if self.reference_judge is not None else 0

    # The trainer's view of the method's own state (rise_nemo.methods.registry.StepState).
    def state_dict(self) -> dict[str, Any]:
        return {"hooks": self.hooks.state_dict()}  # RRL: replay buffer + value-loss stabilisation

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.hooks.load_state_dict(state.get("hooks"))

    def summary(self, step: int) -> dict[str, Any]:
        return {"switch_reason": None, "switch_step": None}


@REASONING.scorers.implement("verifier")
def verifier_scores(ctx: ReasoningContext, problems: Sequence[ReasoningProblem],
                    groups: Sequence[Sequence[Rollout]]) -> StepScores:
    """The verifier's 0/1 rewards. A verifier with a ``batch_metrics()`` method (e.g. the code reward's pass
    fraction and outcome kinds) adds what it returns, for the batch it just verified, to the step's metrics."""
    rewards, valid = verify_rewards(ctx.verifier, problems, groups)
    metrics = dict(ctx.verifier.batch_metrics()) if isinstance(ctx.verifier, BatchMetricsVerifier) else {}
    return StepScores(rewards, valid, metrics=metrics)


def reasoning_train_step(ctx: ReasoningContext, problems: Sequence[ReasoningProblem], step: int) -> dict[str, Any]:
    t_start = time.perf_counter()
    prefixes = ctx.hooks.start_states(ctx, problems, step)  # None, or per-rollout given response tokens (RRL)
    groups = sample_groups(ctx, problems, prefixes, step)  # [N][G]
    scored = ctx.score(problems, groups)
    rewards, valid = scored.rewards, scored.valid  # [N, G] each
    t_sample = time.perf_counter()

    batch = rollout_batch(groups, valid, ctx.pad_id)  # row b = the b-th valid rollout (valid_rollouts)
    batch["prev_logprobs"] = ctx.policy.get_logprobs(batch)  # [B, T], the policy that sampled (no grad)
    extra: dict[str, Any] = dict(scored.metrics)
    extra["diversity/ppl_variance"] = scratch_perplexity_variance(batch, groups, valid)
    extra.update(REASONING.advantages.impl(ctx.method.advantage)(ctx, problems, groups, scored, batch))  # advantages
    extra.update(ctx.hooks.after_score(ctx, problems, groups, scored.solved_mask(), valid, batch))
    if ctx.samples_per_step:
        ctx.last_samples = reasoning_sample_records(step, problems, groups, rewards, valid, batch, ctx.samples_per_step)
    warmup = critic_warmup(ctx, step)
    train_metrics = {} if warmup else ctx.policy.train(batch, recipe_policy_loss_fn(ctx.cfg))
    if ctx.critic is not None:
        if int(ctx.cfg.ppo.critic_warmup_steps) > 0:  # off (0): the metrics stay exactly as before
            train_metrics["critic/warmup"] = warmup
        value_loss = make_value_loss(ctx.cfg.ppo.value_clip)
        for _ in range(int(ctx.cfg.ppo.critic_updates)):
            train_metrics.update(ctx.critic.train(batch, value_loss))
    extra.update(ctx.hooks.after_train(ctx, train_metrics))
    t_train = time.perf_counter()
    return reasoning_metrics(step, groups, rewards, valid, batch, {**train_metrics, **extra},
                             times=(t_start, t_sample, t_train))


# ---- the batch's row order: one contract, stated and checked here ------------------------------------------
# Row b of a step's batch is the b-th valid rollout in (problem i, sample j) order, the order of
# ``rewards[valid]``. Every reader that maps rows back to rollouts relies on it (the advantage estimators,
# place_token_advantages, RRL's after_score, scratch_perplexity_variance); the ones that read rollouts
# row by row go through ``batch_rollouts``, which checks it.


def valid_rollouts(groups: Sequence[Sequence[Rollout]], valid: torch.Tensor) -> list[tuple[int, int, Rollout]]:
    """(i, j, rollout) of every valid rollout in (problem, sample) order: the batch's row order."""
    return [(i, j, r) for i, g in enumerate(groups) for j, r in enumerate(g) if bool(valid[i, j])]


def rollout_batch(groups: Sequence[Sequence[Rollout]], valid: torch.Tensor, pad_id: int) -> dict[str, torch.Tensor]:
    """The step's training batch: row b = ``valid_rollouts(groups, valid)[b]`` (natural rows, given prefixes
    masked out of the loss)."""
    return build_batch([TrainSample(list(r.prompt_token_ids), list(r.response_token_ids), KIND_NATURAL, 0.0,
                                    list(r.sampling_logprobs), sampled_under_train_prompt=True,
                                    given_tokens=r.given_token_count)
                        for _, _, r in valid_rollouts(groups, valid)], pad_id)


def batch_rollouts(batch: dict[str, torch.Tensor], groups: Sequence[Sequence[Rollout]],
                   valid: torch.Tensor) -> list[tuple[int, int, Rollout]]:
    """``valid_rollouts`` checked against the batch: row b must hold the b-th valid rollout's prompt and
    response tokens, the response ending at ``input_lengths[b]``. A batch whose rows were reordered, dropped
    or added raises ValueError naming the first row that does not match (instead of silently pairing a
    row with another rollout's advantages, states or groups)."""
    rows = valid_rollouts(groups, valid)
    if len(rows) != int(batch["input_ids"].shape[0]):
        raise ValueError(f"batch has {int(batch['input_ids'].shape[0])} rows for {len(rows)} valid rollouts; row b must "
                         "be the b-th valid rollout in (problem, sample) order (reasoning_step.rollout_batch)")
    for b, (i, j, r) in enumerate(rows):
        end = int(batch["input_lengths"][b])
        if batch["input_ids"][b, :end].tolist() != [*r.prompt_token_ids, *r.response_token_ids]:
            raise ValueError(f"batch row {b} does not hold valid rollout {b} (problem {i}, sample {j}); row b must be "
                             "the b-th valid rollout in (problem, sample) order (reasoning_step.rollout_batch)")
    return rows


def critic_warmup(ctx: ReasoningContext, step: int) -> bool:
    """verl's ``trainer.critic_warmup``: the first ``ppo.critic_warmup_steps`` steps (1-based) train only the
    critic; the policy is not updated. A function of the step number only, so resume is exact."""
    return ctx.critic is not None and step <= int(ctx.cfg.ppo.critic_warmup_steps)


# ---- advantage estimators (REASONING.advantages): (ctx, problems, groups, scored, batch) ->
# the step's metrics; each writes ``batch["advantages"]`` [B] (and ``token_advantages`` [B, T]); batch row b is
# the b-th valid rollout in (problem, sample) order (rollout_batch; checked by batch_rollouts).


@REASONING.advantages.implement("group")
def group_advantage_columns(ctx: ReasoningContext, problems, groups, scored: StepScores,
                            batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Eq. 1 of RISE-RL / GRPO: group-normalised rewards, one per row."""
    batch["advantages"] = group_advantages(scored.rewards, eps=float(ctx.cfg.advantage.eps), valid=scored.valid)[scored.valid]
    return {}


@REASONING.advantages.implement("gae")
def gae_advantage_columns(ctx: ReasoningContext, problems, groups, scored: StepScores,
                          batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """PPO: critic values and GAE (add_gae_columns) on the sparse reward of each row; ``critic/auc`` where the
    task knows which prefixes are correct so far (prefix_value_auc)."""
    out = add_gae_columns(ctx, batch, scored.rewards[scored.valid])  # token_advantages, values, returns
    if ctx.step_accuracy is not None:
        out["critic/auc"] = prefix_value_auc(ctx, problems, groups, scored.valid, batch, batch["values"])
    return out


def place_token_advantages(batch: dict[str, torch.Tensor], groups, valid: torch.Tensor,
                           per_rollout: dict[tuple[int, int], torch.Tensor]) -> torch.Tensor:
    """[B, T] from per-rollout advantages aligned with response tokens: row b = the b-th valid rollout (the
    batch's order, checked by batch_rollouts); its response starts after its prompt, so the row's response span
    is where ``input_lengths - len(response)`` begins."""
    out = torch.zeros_like(batch["token_mask"])
    for row, (i, j, _) in enumerate(batch_rollouts(batch, groups, valid)):
        adv = per_rollout[i, j]
        end = int(batch["input_lengths"][row])
        out[row, end - len(adv) : end] = adv
    return out * batch["token_mask"]


def sample_groups(
    ctx: ReasoningContext, problems: Sequence[ReasoningProblem], prefixes: list[list[list[int]]] | None, step: int
) -> list[list[Rollout]]:
    """G rollouts per problem under its original prompt. ``prefixes[i][j]``: the given response tokens rollout j
    of problem i continues ([] = from the problem). Without any given token this is exactly one
    ``generate(prompts, G)`` call (the PPO / GRPO sampling stream); otherwise one call with N * G prompts,
    n = 1, regrouped."""
    params = sampling_params(ctx.cfg, step, STREAM_NATURAL)
    g = int(ctx.cfg.sampling.group_size)
    prompts = [list(p.messages) for p in problems]
    if prefixes is None or not any(len(x) for row in prefixes for x in row):
        return ctx.generator.generate(prompts, g, params)
    if len(prefixes) != len(problems) or any(len(row) != g for row in prefixes):
        raise ValueError(f"start states: expected [{len(problems)}][{g}] prefixes, got "
                         f"{[len(row) for row in prefixes]}")
    return generate_each(ctx.generator, [[m] * g for m in prompts], params, prefixes)


def scratch_perplexity_variance(batch: dict[str, torch.Tensor], groups: Sequence[Sequence[Rollout]],
                                valid: torch.Tensor) -> float | None:
    """core.metrics.perplexity_variance of the rollouts sampled from the problem alone (replayed rollouts
    continue a state, so their perplexity is not the query's), under the policy that sampled them."""
    rows = [(i, r.given_token_count == 0) for i, _, r in batch_rollouts(batch, groups, valid)]
    keep = torch.tensor([k for _, k in rows], dtype=batch["token_mask"].dtype).reshape(-1, 1)
    return perplexity_variance(batch["prev_logprobs"], batch["token_mask"] * keep, [i for i, _ in rows])


def verify_rewards(
    verifier: Verifier, problems: Sequence[ReasoningProblem], groups: Sequence[Sequence[Rollout]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse rewards [N, G] (1 correct, 0 wrong) and valid [N, G] (False where the verifier could not
    decide: the response is excluded, never scored). One verifier call for the whole step."""
    verdicts = verify_groups(verifier, problems, groups)
    n, g = len(groups), max((len(x) for x in groups), default=0)
    rewards, valid = torch.zeros(n, g), torch.zeros(n, g, dtype=torch.bool)
    for i, row in enumerate(verdicts):
        for j, v in enumerate(row):
            if v is not None:
                rewards[i, j], valid[i, j] = float(bool(v)), True
    return rewards, valid


def add_gae_columns(ctx: ReasoningContext, batch: dict[str, torch.Tensor], row_rewards: torch.Tensor) -> dict:
    """Critic values, GAE advantages and value targets as batch columns (core.value; NeMo-RL conventions).

    The sparse reward sits on each row's last sampled token; given prefix tokens are not actions, so GAE
    starts at the state after them, bootstrapped from the critic's value there."""
    p = ctx.cfg.ppo
    mask = batch["token_mask"]  # [B, T], sampled response tokens
    values = ctx.critic.get_values(batch)  # [B, T], V(input_ids[:, :t])
    token_rewards = terminal_token_rewards(row_rewards, mask)
    adv, returns = gae(token_rewards, values, mask, float(p.gae_gamma), float(p.gae_lambda))
    if p.normalize_advantages:
        adv = whiten(adv, mask)
    batch["token_advantages"] = adv
    batch["advantages"] = torch.zeros(mask.shape[0])  # per-sample column unused by the PG term (kept for shape)
    batch["values"] = values
    batch["returns"] = returns
    batch["value_token_count"] = torch.full((mask.shape[0],), float(mask.sum()))
    # Undefined (null) when every rollout earned the same return: nothing for the critic to explain.
    ev = explained_variance(values, returns, mask, mc_returns=monte_carlo_returns(token_rewards, mask, float(p.gae_gamma)))
    return {"critic/explained_variance": ev,
            "critic/value_mean": float(values[mask.bool()].mean()) if bool(mask.any()) else None}


def _rise_only(key: str) -> bool:
    """The shared policy loss (core.losses) also reports RISE's guidance term (eq. 11), which is always 0 here."""
    return key == "loss/guide" or key.startswith("guide/")


def reasoning_metrics(step, groups, rewards, valid, batch, train_metrics, times) -> dict[str, Any]:
    t_start, t_sample, t_train = times
    lengths = [len(r.response_token_ids) - r.given_token_count for g in groups for r in g]
    metrics: dict[str, Any] = {
        "step": step,
        "reward/mean": float(rewards[valid].mean()) if bool(valid.any()) else None,
        "reward/solved_groups": int(((rewards * valid).sum(1) > 0).sum()),
        "verifier/undecided_excluded": int((~valid).sum()),
        "batch/rows": int(batch["input_ids"].shape[0]),
        "batch/given_tokens": int(sum(r.given_token_count for g in groups for r in g)),
        "response/length_mean": sum(lengths) / max(1, len(lengths)),
        "loss/pg": None,
        "policy/entropy": None,
    }
    metrics.update({k: finite_or_none(float(v)) if v is not None else None for k, v in train_metrics.items()
                    if not _rise_only(k)})
    metrics["time/step_s"] = t_train - t_start
    metrics["time/sample_s"] = t_sample - t_start
    metrics["time/train_s"] = t_train - t_sample
    return metrics


# ----------------------------------------------------------------------------------------------------------
# The step object of the reasoning step kind (rise_nemo.methods.registry.REASONING)

REASONING_PROGRESS_KEYS = (("reward/mean", "r"), ("critic/explained_variance", "ev"), ("loss/pg", "pg"))


def make_hooks(method: ReasoningMethod, cfg: Any, n_train_problems: int) -> StepHooks:
    """The hooks the method names (RRL's replay for ``rrl``, no-ops for the others), built for this run."""
    return REASONING.hooks.impl(method.hooks)(cfg, n_train_problems)


@REASONING.implement_step
class ReasoningStep:
    """Verifier-rewarded reasoning methods: sample G rollouts per problem, score, advantages, train."""

    train_step = staticmethod(reasoning_train_step)

    @staticmethod
    def check(method: ReasoningMethod, cfg: Any) -> None:
        """The verifier's and the scorer's needs (rise_nemo.steps.verifiers), before any data is read."""
        scorer = method.scorer_for(cfg)
        check_verifier(cfg, scorer)
        check_real_model(cfg, scorer)

    @staticmethod
    def check_data(method: ReasoningMethod, cfg: Any, train_prompts: Sequence[ReasoningProblem]) -> None:
        REASONING.hooks.impl(method.hooks).check_data(cfg, train_prompts)  # e.g. RRL: rrl.granularity cuts them

    @staticmethod
    def build_judge(method: ReasoningMethod, cfg: Any) -> Any:
        """ExpRL's reference judge for a scorer that grades with one (from the ``judge:`` block), else None."""
        return build_checked_judge(cfg.judge, reference=True) if method.scorer_for(cfg).judge == "reference" else None

    @staticmethod
    def build_parts(method: ReasoningMethod, cfg: Any, policy: Any, checkpoint: Any) -> dict[str, Any]:
        """Reward model, verifier, step-accuracy checker, and the critic when the method trains one: it copies the
        policy's body, so it is built AFTER the warm start (a resume overwrites it from ``checkpoint``)."""
        from rise_nemo.backends import build_critic

        parts = build_problem_parts(cfg, method.scorer_for(cfg))
        return {**parts, "critic": build_critic(cfg, policy, checkpoint=checkpoint) if method.critic else None}

    @staticmethod
    def build_context(method: ReasoningMethod, run: Any) -> ReasoningContext:
        if run.verifier is None:
            raise ValueError(f"method {method.name!r} needs a verifier")
        hooks = make_hooks(method, run.cfg, run.n_train_problems)
        # ExpRL methods: ``judge`` is the reference judge (rise_nemo.judges.reference); its counters go to
        # metrics.jsonl like the rubric judge's.
        return ReasoningContext(cfg=run.cfg, policy=run.policy, generator=run.generator, verifier=run.verifier,
                                method=method, critic=run.critic, pad_id=run.pad_id, rng=run.rng,
                                samples_per_step=run.samples_per_step, reference_judge=run.judge, hooks=hooks,
                                step_accuracy=run.step_accuracy, reward_model=run.reward_model)

    @staticmethod
    def progress_keys(method: ReasoningMethod) -> tuple[tuple[str, str], ...]:
        """Only what the method logs (no critic: no explained variance), never a column that stays '-'."""
        return tuple(k for k in REASONING_PROGRESS_KEYS if method.critic or not k[0].startswith("critic/"))

    @staticmethod
    def evaluate(ctx: ReasoningContext, eval_prompts: Sequence[Any], step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """pass@1 on the held-out problems (rise_nemo.steps.reasoning_eval): (result, fields to log)."""
        from rise_nemo.steps.reasoning_eval import evaluate_reasoning

        result = evaluate_reasoning(ctx.generator, ctx.verifier, eval_prompts, int(ctx.cfg.eval.samples_per_prompt),
                                    eval_sampling_params(ctx.cfg, step), step, step_accuracy=ctx.step_accuracy)
        return result, {"pass@1": result["pass_at_1"], "mean length": f"{result['response_length']:.1f}"}


def reasoning_sample_records(step: int, problems: Sequence[Any], groups: Sequence[Sequence[Any]], rewards: Any,
                             valid: Any, batch: Mapping[str, Any], cap: int) -> list[dict[str, Any]]:
    """What the step trained on, for ``samples.jsonl``: per rollout the step, prompt id, difficulty, the response
    (given prefix + sampled continuation, as generated), how many of its tokens were given (a replayed prefix /
    start state: context only, not trained) and how many sampled, the reward (null when the verifier could not
    decide: not trained on), the advantage it was trained with (GRPO: its group advantage; PPO: the mean of its
    per-token GAE advantages over the sampled tokens) and its kind (0). At most ``cap`` rollouts per step, the
    first problems of the batch in order. ``groups[i][j]`` is problem i's j-th rollout; ``rewards`` / ``valid``
    [N, G]; ``batch`` holds one row per valid rollout in (i, j) order with ``token_advantages`` [B, T] (PPO) or
    ``advantages`` [B] (GRPO)."""
    per_row = batch.get("token_advantages")
    if per_row is not None:
        mask = batch["token_mask"]
        per_row = (per_row * mask).sum(1) / mask.sum(1).clamp(min=1)
    else:
        per_row = batch["advantages"]
    records: list[dict[str, Any]] = []
    row = 0
    for i, group in enumerate(groups):
        for j, rollout in enumerate(group):
            trained = bool(valid[i, j])
            if len(records) < cap:
                given = int(rollout.given_token_count)
                records.append({
                    "step": step,
                    "prompt_id": problems[i].prompt_id,
                    "difficulty": problems[i].difficulty,
                    "response": rollout.response_text,
                    "given_tokens": given,
                    "sampled_tokens": len(rollout.response_token_ids) - given,
                    "reward": float(rewards[i, j]) if trained else None,
                    "advantage": float(per_row[row]) if trained else None,
                    "kind": 0 if trained else None,
                })
            row += int(trained)
    return records


def prefix_value_auc(ctx: Any, problems: Sequence[Any], groups: Sequence[Sequence[Any]], valid: torch.Tensor,
                     batch: dict[str, torch.Tensor], values: torch.Tensor) -> float | None:
    """``critic/auc`` (docs/DESIGN.md §9.5): where the task knows the truth of a partial solution (its
    step-accuracy checker: a prefix is "correct so far" when every step it writes is right), the AUC
    (core.metrics.ranking_auc) of the critic's value V(q; y_1..y_k) at the step cut points k
    (core.replay.state_boundaries) separating correct-so-far prefixes from already-wrong ones, over the sampled
    part of every valid rollout (batch row b = the b-th valid rollout). RRL's argmax-V state selection is only
    as good as this ranking (0.5 = arbitrary cut points). None without a step-accuracy checker or when one class
    is empty."""
    scores, labels = prefix_scores_and_labels(ctx, problems, groups, valid, batch, values)
    return ranking_auc(scores, labels) if scores else None


def prefix_scores_and_labels(ctx: Any, problems, groups, valid, batch, values) -> tuple[list[float], list[bool]]:
    check = ctx.step_accuracy
    if check is None:
        return [], []
    tok = find_tokenizer(ctx.generator)
    marker = str(ctx.cfg.rrl.step_marker)
    scores, labels = [], []
    for row, (i, _, rollout) in enumerate(batch_rollouts(batch, groups, valid)):  # row b = valid rollout b
        ids = list(rollout.response_token_ids)
        prompt_len = int(batch["input_lengths"][row]) - len(ids)
        for k in state_boundaries(token_texts(ctx.generator, ids), "step", marker):
            if k <= rollout.given_token_count:
                continue  # a replayed state's own cut points are not this rollout's states
            correct, total = check(problems[i], tok.decode(ids[:k], skip_special_tokens=True))
            scores.append(float(values[row, prompt_len + k]))
            labels.append(0 < total == correct)  # a prefix without a readable step is not correct so far
    return scores, labels
