"""Verifiable reasoning problems (no I/O): the data model RRL, ExpRL and the PPO / sparse-GRPO baselines share.

A problem is shown to the policy as ``messages`` only. ``reference_solution`` is hidden from the policy: RRL
teacher-forces it through the critic to find promising states (docs/DESIGN.md §2b) and ExpRL's judge reads it
to score rollouts (§2c). ``answer`` is what a ``Verifier`` compares a response's final answer with.
"""

from __future__ import annotations

from dataclasses import dataclass

from rise_nemo.core.rubric import Conversation


@dataclass(frozen=True)
class ReasoningProblem:
    prompt_id: str
    messages: Conversation  # what the policy sees (the problem as a chat)
    reference_solution: str  # canonical step-by-step solution; never shown to the policy
    answer: str  # the final answer a verifier checks against
    difficulty: int | None = None  # e.g. number of steps, or MATH's level 1-5
