"""Guidance without its side effects: our extensions of RISE-RL's retention rule (eq. 8) and guidance policy.

The paper keeps a privileged response when A_ref > 0 on the full rubric (eqs. 7-8) and imitates it whole
(eq. 11). A kept response can still carry habits the rubric penalises — one persistent criterion gained
outweighs one lost — and the guide loss then teaches them (measured on the embedded task: the
negative-criterion rate rises during guidance and hinted responses are longer). Everything here is OUR
extension, not the paper's; ``options.paper()`` switches every rule off.

1. No-regression retention (extends eq. 8). A criterion is *protected* for a prompt when at least
   ``threshold`` of the prompt's valid natural responses satisfy it (meet a positive criterion, avoid a
   negative one). ``hard``: keep a privileged response only if A_ref > 0 AND it satisfies every protected
   criterion. ``soft``: keep it if A_ref > 0 and scale its guide weight (A~ of eq. 11) by the share of
   protected criteria it satisfies. Drops are counted per criterion.
2. Penalised-span exclusion. Where the judge can locate the text behind a met negative criterion, those
   tokens are masked out of the guide loss (the rest of the response is still imitated); such a criterion
   then does not count as a regression in rule 1.
3. Adaptive gating. Privileged rollouts only for prompts whose natural group shows a persistent failure:
   per (prompt, criterion) an exponential moving average of the group's failure share over the prompt's
   visits; a feedback criterion (eq. 5) passes when its EMA >= ``threshold``. The hint then names only the
   passing criteria; a prompt with none gets no privileged rollouts. ``ema=0`` is the "current group's
   failure share above a threshold" rule.
4. Length check. A privileged response longer than ``max_length_ratio`` x the mean length of its prompt's
   valid natural responses is not retained (hinted/natural length ratios are logged).
5. Privileged budget (bounds the guided step's extra generation). At most ``privileged_budget`` x the
   step's natural rollouts are privileged: when more prompts qualify, the ones whose hinted criteria fail
   most (gate on: the largest EMA failure share; off: the current group's) keep their G' rollouts, the
   rest get none this step (``budget_targets``). Early in training nearly every prompt fails its
   persistent criteria, so this is where the paper's guided step costs most.
6. One-pass guidance (``PreviousFailures``). A prompt's hints are the feedback criteria (eqs. 4-5, after
   rule 3) of its PREVIOUS visit, so its privileged rollouts can be sampled in the same generate call as
   its natural ones; a prompt seen for the first time falls back to the paper's two passes. Criteria the
   policy keeps missing are by definition the ones it missed last time; what changes is only WHICH
   criteria are hinted (the previous group's) and WHEN the privileged rollouts are generated. Eqs. 7-11
   (scoring under the original prompt, the filter, policy-support weights, the guide loss) are unchanged.

All functions are pure (no I/O); shapes are documented per function.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch

from rise_nemo.core.advantages import retained

__all__ = [
    "GuidanceOptions",
    "satisfied_matrix",
    "protected_criteria",
    "no_regression_retention",
    "length_ok",
    "FailureGate",
    "budget_targets",
    "PreviousFailures",
    "sentence_span",
    "quote_spans",
    "token_span_mask",
]

NoRegression = Literal["none", "hard", "soft"]


@dataclass(frozen=True)
class GuidanceOptions:
    """The extensions' switches and parameters, every one given (their defaults live in the recipe schema,
    rise_nemo.config.schema RetentionCfg / GateCfg); ``paper()`` is RISE-RL exactly as published (all off)."""

    no_regression: NoRegression
    keep_threshold: float  # share of valid natural responses satisfying a criterion -> protected
    mask_penalised_spans: bool
    span_unit: Literal["match", "sentence"]  # mask the located text or its whole sentence
    max_length_ratio: float | None  # per-response length check vs the natural mean; None = off
    gate: bool
    gate_ema: float  # weight of the previous EMA value (0 = the current group only)
    gate_threshold: float  # EMA failure share a feedback criterion needs to be hinted
    privileged_budget: float | None  # most privileged rollouts per step / natural rollouts; None = off
    one_pass: bool  # rule 6: hints from the previous visit, privileged rollouts in the natural call

    def paper(self) -> GuidanceOptions:
        """These options with every extension off (the parameters of an off rule are never read)."""
        return replace(self, no_regression="none", mask_penalised_spans=False, max_length_ratio=None, gate=False,
                       privileged_budget=None, one_pass=False)

    def with_paper(self, paper_faithful: bool) -> GuidanceOptions:
        return self.paper() if paper_faithful else replace(self)


def satisfied_matrix(verdicts: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Which criteria each response satisfies: met for a positive criterion, NOT met for a negative one.

    verdicts: bool [G, K] ("met" = the statement holds); weights: [K]. Returns bool [G, K].
    """
    z = torch.as_tensor(verdicts).bool()
    negative = torch.as_tensor(weights) < 0
    return torch.where(negative.unsqueeze(0), ~z, z)


def protected_criteria(nat_verdicts: torch.Tensor, weights: torch.Tensor, nat_valid: torch.Tensor,
                       threshold: float) -> torch.Tensor:
    """Criteria that at least ``threshold`` of the valid natural responses satisfy. bool [K].

    nat_verdicts: bool [G, K]; nat_valid: bool [G]. No valid natural response -> nothing protected.
    """
    sat = satisfied_matrix(nat_verdicts, weights)[torch.as_tensor(nat_valid).bool()]  # [G_valid, K]
    if sat.shape[0] == 0:
        return torch.zeros(sat.shape[-1], dtype=torch.bool)
    return sat.float().mean(0) >= threshold


def no_regression_retention(
    a_ref: torch.Tensor,
    priv_verdicts: torch.Tensor,
    priv_valid: torch.Tensor,
    nat_verdicts: torch.Tensor,
    nat_valid: torch.Tensor,
    weights: torch.Tensor,
    mode: NoRegression,
    threshold: float = 0.5,
    excused: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our extension of eq. 8 for ONE prompt: which privileged responses are kept and with what weight scale.

    a_ref: [G'] (eq. 7); priv_verdicts: bool [G', K]; priv_valid: bool [G']; nat_verdicts: bool [G, K];
    nat_valid: bool [G]; weights: [K]; excused: optional bool [G', K], regressions that do not count
    (a located penalised span that is masked out of the guide loss instead).
    Returns (keep bool [G'], scale float [G'] multiplying the guide weight A~, dropped bool [G', K]: the
    protected criteria a response fails — in ``hard`` mode these are the reasons it was dropped).
    ``none`` is eq. 8 itself: keep = A_ref > 0 (and valid), scale 1.
    """
    base = retained(a_ref) & torch.as_tensor(priv_valid).bool()  # eq. 8
    g, k = priv_verdicts.shape
    scale = torch.ones(g)
    no_drop = torch.zeros(g, k, dtype=torch.bool)
    if mode == "none":
        return base, scale, no_drop
    if mode not in ("hard", "soft"):
        raise ValueError(f"no_regression must be 'none', 'hard' or 'soft', got {mode!r}")
    protected = protected_criteria(nat_verdicts, weights, nat_valid, threshold)  # [K]
    failed = protected.unsqueeze(0) & ~satisfied_matrix(priv_verdicts, weights)  # [G', K]
    if excused is not None:
        failed = failed & ~torch.as_tensor(excused).bool()
    failed = failed & base.unsqueeze(1)  # only responses eq. 8 would keep can be dropped by this rule
    n_protected = int(protected.sum())
    if mode == "hard":
        return base & ~failed.any(1), scale, failed
    if n_protected:
        scale = 1.0 - failed.sum(1).float() / n_protected
    return base & (scale > 0), scale, failed


def length_ok(priv_lengths: Sequence[int], nat_lengths: Sequence[int], max_ratio: float | None) -> list[bool]:
    """Per privileged response: length <= max_ratio x mean natural length (always True when off or no
    natural length is known)."""
    if max_ratio is None or not nat_lengths:
        return [True] * len(priv_lengths)
    bound = max_ratio * (sum(nat_lengths) / len(nat_lengths))
    return [n <= bound for n in priv_lengths]


class FailureGate:
    """Adaptive guidance gating: EMA of each criterion's natural failure share per prompt.

    ``update(prompt_id, failure_share)`` folds in one visit (failure_share [K]: the share of the prompt's
    valid natural responses failing each criterion; the first visit is taken as is) and returns the EMA.
    ``passes(ema, candidates)`` keeps the candidate criteria whose EMA >= threshold. The state is plain
    JSON (``state_dict`` / ``load_state_dict``) so a resumed run gates exactly as the uninterrupted one.
    """

    def __init__(self, ema: float = 0.5, threshold: float = 0.75):
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"gate ema must be in [0, 1), got {ema}")
        self.ema, self.threshold = float(ema), float(threshold)
        self.values: dict[str, list[float]] = {}

    def update(self, prompt_id: str, failure_share: Sequence[float]) -> list[float]:
        new = [float(x) for x in failure_share]
        old = self.values.get(prompt_id)
        if old is not None and len(old) == len(new):
            new = [self.ema * o + (1.0 - self.ema) * x for o, x in zip(old, new)]
        self.values[prompt_id] = new
        return new

    def passes(self, ema: Sequence[float], candidates: Sequence[int]) -> list[int]:
        return [k for k in candidates if ema[k] >= self.threshold - 1e-12]

    def state_dict(self) -> dict:
        return {"ema": self.ema, "threshold": self.threshold, "values": {k: list(v) for k, v in self.values.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        self.values = {str(k): [float(x) for x in v] for k, v in dict(state.get("values", {})).items()}


def budget_targets(priorities: Sequence[float], n_natural: int, group_priv: int,
                   budget: float | None) -> list[int]:
    """Rule 5: which candidate prompts keep their privileged rollouts under the budget.

    priorities: per candidate prompt, how strongly its hinted criteria fail (higher first); n_natural: the
    step's natural rollouts; group_priv: G'. At most max(1, floor(budget x n_natural / G')) candidates are
    kept, highest priority first, ties to the earlier candidate. Returns their positions in ``priorities``
    in the original order. ``budget`` None keeps all.
    """
    if budget is None:
        return list(range(len(priorities)))
    if budget <= 0:
        raise ValueError(f"privileged budget must be > 0, got {budget}")
    most = max(1, int(budget * n_natural // group_priv + 1e-9))
    ranked = sorted(range(len(priorities)), key=lambda i: (-float(priorities[i]), i))
    return sorted(ranked[:most])


class PreviousFailures:
    """Rule 6 (one-pass guidance): per prompt, the rubric indices its hint named at its previous visit.

    ``plan(prompt_ids)`` -> (hinted, first_visit): hinted maps a position in ``prompt_ids`` to the
    previous visit's criteria (non-empty only: a prompt that failed nothing last time gets no privileged
    rollouts), first_visit lists the positions of prompts never recorded (the two-pass fallback).
    ``record(prompt_id, indices)`` stores this visit's feedback for the next one. The state is plain JSON
    (``state_dict`` / ``load_state_dict``) so a resumed run hints exactly as the uninterrupted one.
    """

    def __init__(self) -> None:
        self.hints: dict[str, list[int]] = {}

    def plan(self, prompt_ids: Sequence[str]) -> tuple[dict[int, list[int]], list[int]]:
        hinted: dict[int, list[int]] = {}
        first_visit: list[int] = []
        for i, pid in enumerate(prompt_ids):
            previous = self.hints.get(pid)
            if previous is None:
                first_visit.append(i)
            elif previous:
                hinted[i] = list(previous)
        return hinted, first_visit

    def record(self, prompt_id: str, indices: Sequence[int]) -> None:
        self.hints[prompt_id] = [int(k) for k in indices]

    def state_dict(self) -> dict:
        return {"hints": {k: list(v) for k, v in self.hints.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        self.hints = {str(k): [int(x) for x in v] for k, v in dict(state.get("hints", {})).items()}


_SENTENCE_END = re.compile(r"[.!?\n]")


def sentence_span(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen [start, end) to the sentence holding it: from after the previous '.', '!', '?' or newline
    to its next one (inclusive), leading whitespace excluded."""
    left = max((m.end() for m in _SENTENCE_END.finditer(text, 0, start)), default=0)
    while left < start and text[left].isspace():
        left += 1
    m = _SENTENCE_END.search(text, end)
    right = m.end() if m else len(text)
    return left, max(right, end)


def quote_spans(response: str, quote: str | None) -> list[tuple[int, int]]:
    """Where a judge's quoted evidence occurs in the response (case- and whitespace-insensitive).

    Robust to absence: no quote, an empty one, or one not found in the response -> [] (nothing masked).
    """
    if not quote or not quote.strip():
        return []
    words = [re.escape(w) for w in quote.split()]
    pattern = re.compile(r"\s+".join(words), re.IGNORECASE)
    return [(m.start(), m.end()) for m in pattern.finditer(response)]


def token_span_mask(n_tokens: int, prefix_chars: Callable[[int], int],
                    spans: Sequence[tuple[int, int]]) -> list[int]:
    """Per-token loss mask (1 keep, 0 excluded) for a response of ``n_tokens`` tokens.

    prefix_chars(i) = length of the decoded text of the first i tokens (non-decreasing in i); token i
    covers characters [prefix_chars(i), prefix_chars(i + 1)). A token overlapping any span is excluded.
    Boundaries are found by binary search, O(log n) decodes per span.
    """
    mask = [1] * n_tokens
    cache: dict[int, int] = {}

    def end_of(i: int) -> int:  # end character of token i
        if i not in cache:
            cache[i] = prefix_chars(i + 1)
        return cache[i]

    def first_token_ending_after(c: int) -> int:  # smallest i with end_of(i) > c
        lo, hi = 0, n_tokens
        while lo < hi:
            mid = (lo + hi) // 2
            if end_of(mid) > c:
                hi = mid
            else:
                lo = mid + 1
        return lo

    for start, end in spans:
        if end <= start:
            continue
        first = first_token_ending_after(start)
        last = first_token_ending_after(end - 1)  # the token holding the span's last character
        for i in range(first, min(last, n_tokens - 1) + 1):
            mask[i] = 0
    return mask
