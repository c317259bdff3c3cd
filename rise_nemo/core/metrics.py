"""Evaluation metrics: unbiased pass@k, criterion coverage tables (the paper's Tables 12-13), mean
token entropy and pairwise win / tie / lose with swapped positions; ``finite_or_none`` for logged numbers."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from rise_nemo.core.logprobs import token_entropy
from rise_nemo.core.rewards import failure_matrix

__all__ = ["pass_at_k", "criterion_coverage", "CoverageTable", "CriterionCoverage", "mean_token_entropy",
           "perplexity_variance", "win_tie_lose", "bootstrap_mean", "finite_or_none"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021):

        pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)

    The product form never forms the huge binomials, so it is exact enough for n in the thousands.
    """
    if n < 1 or not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs n >= 1, 0 <= c <= n, 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset contains a correct sample
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


@dataclass(frozen=True)
class CriterionCoverage:
    index: int
    name: str
    weight: float
    satisfied: int  # judgments where the response did the right thing (met positive / avoided negative)
    total: int  # known judgments (unknown verdicts excluded)

    @property
    def failed(self) -> int:
        return self.total - self.satisfied

    @property
    def coverage(self) -> float:
        return self.satisfied / self.total if self.total else float("nan")


@dataclass(frozen=True)
class CoverageTable:
    rows: list[CriterionCoverage] = field(default_factory=list)

    @property
    def satisfied(self) -> int:
        return sum(r.satisfied for r in self.rows)

    @property
    def total(self) -> int:
        return sum(r.total for r in self.rows)

    @property
    def coverage(self) -> float:
        return self.satisfied / self.total if self.total else float("nan")

    def to_markdown(self) -> str:
        """Per-criterion failures and satisfied/total, then the aggregate line (like Tables 12 and 13)."""
        lines = ["| criterion | points | failed | satisfied / total | coverage |", "|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(
                f"| {r.name} | {r.weight:g} | {r.failed} | {r.satisfied} / {r.total} | {100 * r.coverage:.1f}% |"
            )
        lines.append(f"| **all** | | {self.total - self.satisfied} | {self.satisfied} / {self.total} | "
                     f"{100 * self.coverage:.1f}% |")  # fmt: skip
        return "\n".join(lines)


def criterion_coverage(
    verdicts: Sequence[Sequence[bool | None]] | torch.Tensor,
    weights: Sequence[float],
    names: Sequence[str] | None = None,
    indices: Sequence[int] | None = None,
) -> CoverageTable:
    """Coverage table over G responses x K criteria: satisfied / total judgments per criterion and overall.

    verdicts[i][k] is the judge's "met" verdict (None = unknown, left out of the totals). "Satisfied" is
    "not failed" as decided by rewards.failure_matrix (the one rule): a positive criterion is satisfied when
    met, a negative one when NOT met, a zero-weight one always (it never fails, met or not). ``indices`` restricts the table to chosen criteria (e.g. the six
    representative ones of the paper's Table 11); ``names`` label the rows (default "c<k>").
    """
    rows_v = verdicts.tolist() if isinstance(verdicts, torch.Tensor) else [list(v) for v in verdicts]
    k_total = len(weights)
    for i, row in enumerate(rows_v):
        if len(row) != k_total:
            raise ValueError(f"verdict row {i} has {len(row)} entries, expected K={k_total}")
    if names is not None and len(names) != k_total:
        raise ValueError(f"names has {len(names)} entries, expected K={k_total}")
    chosen = range(k_total) if indices is None else indices
    out = []
    for k in chosen:
        known = [bool(row[k]) for row in rows_v if row[k] is not None]
        failed = int(failure_matrix(torch.tensor(known, dtype=torch.bool)[:, None], [float(weights[k])]).sum())
        ok = len(known) - failed
        out.append(
            CriterionCoverage(
                k, names[k] if names is not None else f"c{k}", float(weights[k]), ok, len(known)
            )
        )
    return CoverageTable(out)


def mean_token_entropy(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean per-token entropy (nats) over the masked tokens.

    x [B, T]: sampled-token log-probs -> the unbiased estimate mean(-log p(o_t)) (what a LOGPROB loss sees).
    x [B, T, V]: logits -> the exact entropy of each next-token distribution (chunked, aligned with
    input_ids like token_logprobs). mask [B, T] selects the response tokens. Returns a float.
    """
    with torch.no_grad():
        if x.dim() == 2:
            per_token = -x.float()
        elif x.dim() == 3:
            per_token = token_entropy(x)
        else:
            raise ValueError(
                f"mean_token_entropy needs log-probs [B, T] or logits [B, T, V], got {tuple(x.shape)}"
            )
        if per_token.shape != mask.shape:
            raise ValueError(f"mask {tuple(mask.shape)} does not match tokens {tuple(per_token.shape)}")
        m = mask.bool()
        n = int(m.sum())
        if n == 0:
            return float("nan")
        return float(torch.where(m, per_token, torch.zeros_like(per_token)).sum() / n)


def perplexity_variance(logprobs: torch.Tensor, mask: torch.Tensor, groups: Sequence[int]) -> float | None:
    """The RRL paper's diversity measure (its Figure 1, right): the variance, across the samples of one query,
    of the responses' perplexities, averaged over queries.

    logprobs, mask: [B, T] (token log-probs under the policy, 1 on the response tokens that count); groups [B]:
    the query of each row. Perplexity of a row = exp(-mean masked log-prob); per query the population
    variance over its rows (queries with fewer than two rows are left out); None when no query has two."""
    m = mask.to(torch.float64)
    counts = m.sum(1)
    ppl = torch.exp(-(logprobs.to(torch.float64) * m).sum(1) / counts.clamp(min=1))
    by_group: dict[int, list[float]] = {}
    for row, g in enumerate(groups):
        if float(counts[row]) > 0:
            by_group.setdefault(int(g), []).append(float(ppl[row]))
    variances = [float(torch.tensor(v, dtype=torch.float64).var(unbiased=False)) for v in by_group.values()
                 if len(v) >= 2]
    return sum(variances) / len(variances) if variances else None


def win_tie_lose(first: Sequence[int], swapped: Sequence[int]) -> dict[str, float]:
    """Pairwise comparison against another model, each pair judged twice with the positions swapped (RRL's
    RLHF evaluation reports win / tie / lose; the two orders remove the judge's position bias).

    ``first[i]`` / ``swapped[i]``: the verdict on pair i with our response shown first / second, from OUR
    side: +1 ours better, -1 theirs better, 0 tie. A pair is a win when neither order prefers theirs and
    at least one prefers ours, a loss symmetrically, a tie otherwise (both ties, or the orders disagree:
    the conservative rule of MT-Bench, Zheng et al. 2023, §3.4). Returns the fractions ``win``, ``tie``,
    ``lose`` (summing to 1) and ``n``.
    """
    if len(first) != len(swapped):
        raise ValueError(f"win_tie_lose: {len(first)} verdicts vs {len(swapped)} swapped")
    bad = [v for v in (*first, *swapped) if v not in (-1, 0, 1)]
    if bad:
        raise ValueError(f"win_tie_lose: verdicts must be -1, 0 or 1, got {bad[0]!r}")
    n = len(first)
    if n == 0:
        return {"win": 0.0, "tie": 0.0, "lose": 0.0, "n": 0}
    wins = sum(1 for a, b in zip(first, swapped) if min(a, b) >= 0 and max(a, b) == 1)
    losses = sum(1 for a, b in zip(first, swapped) if max(a, b) <= 0 and min(a, b) == -1)
    return {"win": wins / n, "tie": (n - wins - losses) / n, "lose": losses / n, "n": n}


def finite_or_none(x: float | None) -> float | None:
    """A logged metric: the float, or None where it is undefined (NaN / inf; metrics.jsonl is strict JSON)."""
    return None if x is None or not math.isfinite(x) else float(x)


def bootstrap_mean(values: Sequence[float], *, resamples: int = 1000, seed: int = 0,
                   clip: tuple[float, float] | None = None, level: float = 0.95) -> dict[str, float]:
    """Bootstrap of a mean over items (Efron & Tibshirani 1993): ``resamples`` resamples of the items with
    replacement; returns the point ``mean``, the resampled means' standard deviation ``std`` (the standard
    error HealthBench reports, simple-evals ``_compute_clipped_stats``) and the ``level`` percentile interval
    ``lo`` / ``hi`` (Arena-Hard-Auto's confidence interval). ``clip`` (lo, hi) clips every mean, the point
    estimate included (HealthBench reports clip(mean, 0, 1)). Seeded: the same values give the same result."""
    import numpy as np

    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_mean needs at least one value")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError(f"bootstrap_mean needs resamples >= 1 and 0 < level < 1, got {resamples}, {level}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    point = float(x.mean())
    if clip is not None:
        means = np.clip(means, *clip)
        point = float(np.clip(point, *clip))
    tail = (1.0 - level) / 2
    return {"mean": point, "std": float(means.std()), "lo": float(np.quantile(means, tail)),
            "hi": float(np.quantile(means, 1 - tail))}


def ranking_auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve of ``scores`` separating positive from negative ``labels``: the probability
    that a random positive scores above a random negative, ties counting 1/2 (the Mann-Whitney U statistic
    / (n_pos n_neg)). None when either class is empty. 0.5 = no ranking, 1 = perfect."""
    if len(scores) != len(labels):
        raise ValueError(f"ranking_auc: {len(scores)} scores but {len(labels)} labels")
    pos = sorted(float(s) for s, y in zip(scores, labels) if y)
    neg = sorted(float(s) for s, y in zip(scores, labels) if not y)
    if not pos or not neg:
        return None
    wins = sum(bisect.bisect_left(neg, p) + 0.5 * (bisect.bisect_right(neg, p) - bisect.bisect_left(neg, p))
               for p in pos)
    return wins / (len(pos) * len(neg))
