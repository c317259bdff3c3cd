"""The SFT baseline's training step (ExpRL's baselines, docs/DESIGN.md §8): one optimiser step of teacher-forced
NLL on the problems' reference solutions under the plain prompts; nothing is sampled. It shares the reasoning
step's context and evaluation (rise_nemo.steps.reasoning) and records the references it trained on.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.interfaces import Generator, Policy, Verifier
from rise_nemo.methods.registry import SFT, SFTMethod
from rise_nemo.steps.reasoning import ReasoningStep, reasoning_metrics
from rise_nemo.steps.rollouts import TrainSample, build_batch, encode_response
from rise_nemo.steps.verifiers import build_problem_parts, check_real_model, check_verifier
from rise_nemo.tasks.sft import sft_loss


@dataclass
class SFTContext:
    """What the SFT step needs; built once by the trainer. Nothing is sampled or scored while training; the
    verifier and step-accuracy checker evaluate (the reasoning step's evaluation)."""

    cfg: Any
    policy: Policy
    generator: Generator
    verifier: Verifier
    method: SFTMethod
    pad_id: int = 0
    rng: random.Random = field(default_factory=random.Random)  # checkpointed by the trainer; SFT draws nothing
    samples_per_step: int = 0  # references recorded in ``last_samples`` (samples.jsonl); 0 = none
    last_samples: list[dict[str, Any]] = field(default_factory=list)
    step_accuracy: Any = None  # the task's step-accuracy checker for evaluation (None: not reported)

    # The trainer's view of the method's own state (rise_nemo.methods.registry.StepState): none, under the key
    # every reasoning-data run checkpoints its hooks' state with.
    def state_dict(self) -> dict[str, Any]:
        return {"hooks": None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def summary(self, step: int) -> dict[str, Any]:
        return {"switch_reason": None, "switch_step": None}


def sft_reference_batch(ctx: SFTContext, problems: Sequence[ReasoningProblem]) -> dict[str, torch.Tensor]:
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


def sft_step(ctx: SFTContext, problems: Sequence[ReasoningProblem], step: int) -> dict[str, Any]:
    """The SFT baseline: one optimiser step of NLL on the problems' reference solutions (plain prompts)."""
    t_start = time.perf_counter()
    batch = sft_reference_batch(ctx, problems)
    if ctx.samples_per_step:
        ctx.last_samples = sft_sample_records(step, problems, batch, ctx.samples_per_step)
    t_sample = time.perf_counter()
    train_metrics = ctx.policy.train(batch, sft_loss)  # teacher-forced NLL (rise_nemo.tasks.sft)
    t_train = time.perf_counter()
    n = len(problems)
    return reasoning_metrics(step, [[] for _ in problems], torch.zeros(n, 1), torch.zeros(n, 1, dtype=torch.bool),
                             batch, train_metrics, times=(t_start, t_sample, t_train))


@SFT.implement_step
class SFTStep:
    """The SFT baseline: NLL on the references (no sampling); the reasoning step's evaluation."""

    train_step = staticmethod(sft_step)
    evaluate = staticmethod(ReasoningStep.evaluate)

    @staticmethod
    def check(method: SFTMethod, cfg: Any) -> None:
        """The verifier's needs (it evaluates), before any data is read."""
        check_verifier(cfg)
        check_real_model(cfg)

    @staticmethod
    def check_data(method: SFTMethod, cfg: Any, train_prompts: Sequence[ReasoningProblem]) -> None:
        return None

    @staticmethod
    def build_judge(method: SFTMethod, cfg: Any) -> None:
        return None

    @staticmethod
    def build_parts(method: SFTMethod, cfg: Any, policy: Any, checkpoint: Any) -> dict[str, Any]:
        return build_problem_parts(cfg)  # the verifier (and HH's reward model) of the evaluation

    @staticmethod
    def build_context(method: SFTMethod, run: Any) -> SFTContext:
        if run.verifier is None:
            raise ValueError(f"method {method.name!r} needs a verifier (its evaluation)")
        return SFTContext(cfg=run.cfg, policy=run.policy, generator=run.generator, verifier=run.verifier,
                          method=method, pad_id=run.pad_id, rng=run.rng, samples_per_step=run.samples_per_step,
                          step_accuracy=run.step_accuracy)

    @staticmethod
    def progress_keys(method: SFTMethod) -> tuple[tuple[str, str], ...]:
        return (("sft/nll", "nll"),)
