"""Rubric data model (no I/O): criteria with signed weights and optional machine checks.

Conventions fixed in docs/DESIGN.md §2:
- A criterion's ``weight`` is its points. Negative points describe an undesirable behaviour; such a
  criterion is *met* when the behaviour occurs, and then subtracts (HealthBench convention).
- A rubric must have at least one criterion with positive points (otherwise eq. 3 has no
  denominator); ``Rubric.validate`` raises ``RubricError`` naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Message = Mapping[str, str]  # {"role": "system"|"user"|"assistant", "content": str}
Conversation = Sequence[Message]

REASONING_OPEN, REASONING_CLOSE = "<think>", "</think>"


def judged_text(response: str) -> str:
    """What a judge sees of a response: the answer the user would read, never the model's reasoning.

    A Qwen3-style reasoning block (``<think>...</think>``) is dropped: the text after the LAST closing tag,
    leading whitespace removed. A response that opens a reasoning block and never closes it (cut at
    max_new_tokens mid-thought) gave no answer: the judge sees "". Text without the tags is judged as is.
    The token ids used for training always keep the reasoning. Every judge request goes through this one
    function (``interfaces.JudgeRequest`` applies it), so the orchestration, the embedded backend and the
    NeMo-RL environment grade the same text.
    """
    head, sep, tail = response.rpartition(REASONING_CLOSE)
    if sep:
        return tail.lstrip()
    if response.lstrip().startswith(REASONING_OPEN):
        return ""
    return response

CheckKind = Literal["regex", "contains", "absent", "min_words", "max_words"]
CHECK_KINDS: tuple[str, ...] = ("regex", "contains", "absent", "min_words", "max_words")


class RubricError(ValueError):
    """Invalid rubric data. The message names the source (file:line) and the offending key."""


@dataclass(frozen=True)
class MachineCheck:
    """A machine-decidable test of a response, used by the rule judge.

    kind:
      regex      met when ``re.search(value, response, re.IGNORECASE)`` matches
      contains   met when the (case-insensitive) phrase ``value`` occurs
      absent     met when the phrase ``value`` does NOT occur
      min_words  met when the response has at least ``int(value)`` words
      max_words  met when the response has at most ``int(value)`` words
    """

    kind: CheckKind
    value: str

    def __post_init__(self) -> None:
        if self.kind not in CHECK_KINDS:
            raise RubricError(f"unknown machine check kind {self.kind!r}; expected one of {CHECK_KINDS}")
        if self.kind in ("min_words", "max_words"):
            try:
                int(self.value)
            except ValueError as exc:
                raise RubricError(f"machine check {self.kind} needs an integer value, got {self.value!r}") from exc


@dataclass(frozen=True)
class Criterion:
    text: str
    weight: float
    tags: tuple[str, ...] = ()
    check: MachineCheck | None = None

    @property
    def is_negative(self) -> bool:
        return self.weight < 0


@dataclass(frozen=True)
class Rubric:
    criteria: tuple[Criterion, ...]

    def __len__(self) -> int:
        return len(self.criteria)

    @property
    def weights(self) -> list[float]:
        return [c.weight for c in self.criteria]

    @property
    def positive_total(self) -> float:
        return sum(c.weight for c in self.criteria if c.weight > 0)

    def validate(self, where: str = "rubric") -> Rubric:
        if not self.criteria:
            raise RubricError(f"{where}: rubric has no criteria")
        for k, c in enumerate(self.criteria):
            if not isinstance(c.text, str) or not c.text.strip():
                raise RubricError(f"{where}: criterion {k} has empty text")
            if isinstance(c.weight, bool) or not isinstance(c.weight, int | float):
                raise RubricError(f"{where}: criterion {k} has non-numeric points {c.weight!r}")
            if c.weight != c.weight:  # NaN
                raise RubricError(f"{where}: criterion {k} has NaN points")
        if self.positive_total <= 0:
            raise RubricError(f"{where}: rubric has no criterion with positive points (eq. 3 undefined)")
        return self


@dataclass(frozen=True)
class RubricPrompt:
    """One training/eval example: a chat conversation whose last turn is the user's, and its rubric."""

    prompt_id: str
    messages: tuple[Mapping[str, str], ...]
    rubric: Rubric
    reference: str | None = None  # reference solution (ExpRL), optional
    source: str = ""  # "file:line" for error messages
    meta: Mapping[str, object] = field(default_factory=dict)
