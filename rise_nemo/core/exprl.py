"""ExpRL's reference-guided dense rewards (ExpRL: Exploratory RL for LLM mid-training; docs/DESIGN.md §8).

A judge that sees a hidden reference solution scores a rollout 1-5; the score is normalised to [0, 1].

  ExpRL-Outcome   the normalised score is the rollout's reward; GRPO group advantages (RISE-RL eq. 1).
  ExpRL-Process   the rollout is cut into segments y_1..y_T (``segment_token_spans``), segment t gets a
                  score s_t, and the segment advantages are (the paper's process rule)

                      A_1 = s_1 - s_T,        A_t = s_t - s_{t-1}   (t > 1)

                  Every token of segment t gets A_t (``token_process_advantages``); no group normalisation.

Single segment (T = 1, e.g. a rollout without any marker): A_1 = s_1 - s_1 = 0. We keep the formula as it is:
such a rollout carries no policy-gradient signal (only the KL term touches it) and the step counts it in
``exprl/single_segment``. Note that sum_t A_t = 0 for every rollout: the rule redistributes credit between a
rollout's segments rather than rewarding the rollout as a whole.

Normalisations of a 1-5 score (``normalise_score``):
  smooth     (s - 1) / 4                          the paper's mapping: 1 -> 0, 3 -> 0.5, 5 -> 1
  extremes   1 for s = 5, 0 for s = 1, 0.5 otherwise   only the ends of the scale carry a signal; the
                                                  middle (the judge's least reliable region) is neutral
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

__all__ = [
    "NORMALISATIONS",
    "SCORE_MIN",
    "SCORE_MAX",
    "normalise_score",
    "segment_token_spans",
    "process_advantages",
    "token_process_advantages",
]

SCORE_MIN, SCORE_MAX = 1, 5
Normalisation = Literal["smooth", "extremes"]
NORMALISATIONS: tuple[str, ...] = ("smooth", "extremes")


def normalise_score(score: int | float, mode: Normalisation = "smooth") -> float:
    """A judge score on the 1-5 scale -> [0, 1] (module docstring). Raises ValueError outside 1..5."""
    if not SCORE_MIN <= score <= SCORE_MAX:
        raise ValueError(f"judge score {score!r} outside {SCORE_MIN}..{SCORE_MAX}")
    if mode == "smooth":
        return (float(score) - SCORE_MIN) / (SCORE_MAX - SCORE_MIN)
    if mode == "extremes":
        return 1.0 if score == SCORE_MAX else 0.0 if score == SCORE_MIN else 0.5
    raise ValueError(f"unknown score normalisation {mode!r}; expected one of {NORMALISATIONS}")


def segment_token_spans(token_texts: Sequence[str], marker: str) -> list[tuple[int, int]]:
    """Cut a response into segments at every occurrence of ``marker``; returns token spans [start, end).

    ``token_texts[i]`` is the text of response token i on its own (the tokenizer's decode of that one id),
    so the spans are exact in tokens: a marker that starts inside a token, or spans several tokens, opens
    its segment at the token holding the marker's first character. A segment starts at each marker; text
    before the first marker (a preamble) is a segment of its own; a marker at token 0 opens the first
    segment. Spans are contiguous, non-empty and cover every token: ``spans[0][0] == 0`` and
    ``spans[-1][1] == len(token_texts)``. No marker (or an empty response) gives one segment (empty
    response: ``[(0, 0)]``).
    """
    if not marker:
        raise ValueError("segment marker must be a non-empty string")
    n = len(token_texts)
    if n == 0:
        return [(0, 0)]
    owner: list[int] = []  # character -> token index
    for i, piece in enumerate(token_texts):
        owner.extend([i] * len(piece))
    text = "".join(token_texts)
    starts: list[int] = []
    pos = text.find(marker)
    while pos >= 0:
        tok = owner[pos]
        if tok > 0 and (not starts or starts[-1] != tok):
            starts.append(tok)
        pos = text.find(marker, pos + len(marker))
    bounds = [0, *starts, n]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def process_advantages(scores: Sequence[float]) -> list[float]:
    """ExpRL-Process segment advantages: A_1 = s_1 - s_T, A_t = s_t - s_{t-1} for t > 1 (module docstring).

    ``scores``: the T (normalised) segment scores in order; T = 1 gives [0.0]."""
    s = [float(x) for x in scores]
    if not s:
        raise ValueError("process_advantages needs at least one segment score")
    return [s[0] - s[-1]] + [s[t] - s[t - 1] for t in range(1, len(s))]


def token_process_advantages(spans: Sequence[tuple[int, int]], scores: Sequence[float], length: int) -> torch.Tensor:
    """Per-token advantages [length]: every token of segment t gets A_t (``process_advantages``)."""
    if len(spans) != len(scores):
        raise ValueError(f"{len(spans)} segments but {len(scores)} scores")
    out = torch.zeros(length)
    for (a, b), adv in zip(spans, process_advantages(scores)):
        if not 0 <= a <= b <= length:
            raise ValueError(f"segment span {(a, b)} outside a response of {length} tokens")
        out[a:b] = adv
    return out
