"""The SFT baseline's training step (ExpRL's baselines, docs/DESIGN.md §8): one optimiser step of teacher-forced
NLL on the problems' reference solutions under the plain prompts; nothing is sampled. It shares the reasoning
step's context and evaluation (rise_nemo.steps.reasoning) and records the references it trained on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.methods import Method, register_loss, register_step
from rise_nemo.steps.reasoning import ReasoningContext, ReasoningStep, reasoning_metrics
from rise_nemo.steps.rollouts import TrainSample, build_batch, encode_response


def sft_reference_batch(ctx: Any, problems: Sequence[ReasoningProblem]) -> dict[str, torch.Tensor]:
    """Reference solutions teacher-forced under the plain prompts (the SFT baseline's batch)."""
    samples = []
    for p in problems:
        ids = encode_response(ctx.generator, p.reference_solution)
        samples.append(TrainSample(ctx.generator.encode_prompt(list(p.messages)), ids, 0, 0.0, [],
                                   sampled_under_train_prompt=False))
    batch = build_batch(samples, ctx.pad_id)
    batch["global_tokens"] = batch["natural_token_count"]
    return batch


def sft_sample_records(step: int, problems: Sequence[Any], batch: Mapping[str, Any], cap: int) -> list[dict[str, Any]]:
    """The SFT baseline's step trains on the problems' reference solutions (nothing is sampled): one record per
    problem, row i of ``batch``, with the reference as the response and its trained token count."""
    trained = batch["token_mask"].sum(1)
    return [{"step": step, "prompt_id": p.prompt_id, "difficulty": p.difficulty, "response": p.reference_solution,
             "given_tokens": 0, "sampled_tokens": 0, "trained_tokens": int(trained[i]), "reward": None,
             "advantage": None, "kind": "sft_reference"} for i, p in enumerate(problems[:cap])]


def sft_step(ctx: ReasoningContext, problems: Sequence[ReasoningProblem], step: int) -> dict[str, Any]:
    """The SFT baseline: one optimiser step of NLL on the problems' reference solutions (plain prompts)."""
    t_start = time.perf_counter()
    batch = sft_reference_batch(ctx, problems)
    if ctx.samples_per_step:
        ctx.last_samples = sft_sample_records(step, problems, batch, ctx.samples_per_step)
    t_sample = time.perf_counter()
    train_metrics = ctx.policy.train(batch, ctx.method.loss_factory()(ctx.cfg))
    t_train = time.perf_counter()
    n = len(problems)
    return reasoning_metrics(step, [[] for _ in problems], torch.zeros(n, 1), torch.zeros(n, 1, dtype=torch.bool),
                             batch, train_metrics, times=(t_start, t_sample, t_train))


@register_loss("sft_nll")
def make_sft_loss(cfg: Any, lam: float = 0.0, token_weighting: str = "policy_support") -> Any:
    """Teacher-forced NLL (rise_nemo.tasks.sft); the policy-loss arguments do not apply."""
    from rise_nemo.tasks.sft import sft_loss

    return sft_loss


@register_step("sft")
class SFTStep(ReasoningStep):
    """The SFT baseline: the reasoning step's context and evaluation, NLL on the references (no sampling)."""

    scores_rollouts = False

    train_step = staticmethod(sft_step)

    @staticmethod
    def progress_keys(method: Method) -> tuple[tuple[str, str], ...]:
        return (("sft/nll", "nll"),)
