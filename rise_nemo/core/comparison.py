"""Deciding a comparison of two methods on a pooled interval over independent seeds (docs/results.md).

A method comparison on the embedded tasks is a paired design: for every seed both arms are trained on that
seed's own problems and evaluated on that seed's own held-out problems (the same problems for both arms),
several samples per problem. The unit that varies between seeds is the whole experiment (problems, training
stream, evaluation stream); within a seed, problems vary in difficulty. So the intervals here come from a
**hierarchical paired bootstrap** (Davison & Hinkley 1997, §3.8, two-stage resampling): resample the seeds
with replacement, then within each drawn seed resample its problems with replacement, using the same problem
indices for both arms (the pairing). Each resample gives one statistic; the interval is its percentile
interval, **expanded** for the small number of seeds (Hesterberg 2015, "What teachers should know about the
bootstrap", §5.2: the percentile interval of a mean is too narrow by about sqrt((n - 1) / n) and uses z
where t belongs; the expanded interval takes the quantiles at alpha' with
Phi^-1(alpha' / 2) = sqrt(n / (n - 1)) t_(alpha / 2, n - 1), n = the number of seeds). The two stages
count within-seed noise twice, which makes the interval slightly conservative;
tests/core/test_comparison.py measures the coverage on simulated data.

Statistics:
  ``pooled_ratio``       sum of arm A's successes / sum of arm B's, over every seed and problem (the ratio of
                         pooled pass@1 rates when both arms draw the same samples per problem)
  ``paired_difference``  mean over seeds of (mean over the seed's problems of a - b): AUC, reward
  ``pooled_rate``        one arm's pooled success rate (no comparison; for tables)

Verdicts (``verdict``), against the null value (1 for a ratio, 0 for a difference) and the target:
  effect               lo > null, hi >= target: an effect is shown and one as large as the target is not excluded
  effect_below_target  lo > null, hi < target: an effect is shown, but one as large as the target is excluded
  no_effect_at_target  lo <= null, hi < target: no effect shown, and an effect as large as the target is excluded
  underpowered         lo <= null, hi >= target: the interval cannot tell "no effect" from "the target"
A target is MET when the point estimate reaches it and the verdict is ``effect``. With fewer than MIN_SEEDS
seeds the verdict is ``underpowered`` whatever the interval: a bootstrap over 2-4 seeds cannot reach beyond
the seeds it has (with 2 seeds its interval is at most the two values), so it cannot show the spread of
seeds it never drew.
A target that is a ceiling (a cost ratio that must stay at or under a bound; ``ceiling_verdict``) has no null:
  met                  hi <= ceiling: the whole interval is at or under it
  not_met              lo > ceiling: the whole interval is above it
  undecided            the interval holds the ceiling
  underpowered         fewer than MIN_SEEDS seeds, as above
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

VERDICTS = ("effect", "effect_below_target", "no_effect_at_target", "underpowered")
MIN_SEEDS = 5


@dataclass(frozen=True)
class Interval:
    """A point estimate with its interval, the comparison's null value and target, and the verdict."""

    point: float
    lo: float
    hi: float
    null: float
    target: float
    seeds: int
    verdict: str

    @property
    def target_met(self) -> bool:
        return self.verdict == "effect" and self.point >= self.target

    def fields(self, name: str, digits: int = 4) -> list[str]:
        """RESULT fields ``<name>=point <name>_lo=.. <name>_hi=.. <name>_verdict=..``."""
        return [f"{name}={self.point:.{digits}f}", f"{name}_lo={self.lo:.{digits}f}",
                f"{name}_hi={self.hi:.{digits}f}", f"{name}_verdict={self.verdict}"]

    def text(self, digits: int = 3) -> str:
        return f"{self.point:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}] {self.verdict}"


def verdict(lo: float, hi: float, null: float, target: float) -> str:
    """The verdict of an interval [lo, hi] against ``null`` and ``target`` (module docstring); strict
    inequalities, so an interval touching the null shows no effect and one touching the target does not
    exclude it."""
    if not target > null:
        raise ValueError(f"verdict: the target ({target}) must lie above the null value ({null})")
    if math.isnan(lo) or math.isnan(hi):
        return "underpowered"
    shown, below = lo > null, hi < target
    if shown:
        return "effect_below_target" if below else "effect"
    return "no_effect_at_target" if below else "underpowered"


def ceiling_verdict(lo: float, hi: float, ceiling: float, seeds: int) -> str:
    """The verdict of an interval [lo, hi] over ``seeds`` independent units against a ceiling (module docstring)."""
    if seeds < MIN_SEEDS or math.isnan(lo) or math.isnan(hi):
        return "underpowered"
    if hi <= ceiling:
        return "met"
    return "not_met" if lo > ceiling else "undecided"


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (Simpson integration of the density and
    bisection; numpy has no t distribution and scipy is not a dependency). Accurate to ~1e-7."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"student_t_quantile: need 0 < p < 1 and df >= 1, got {p}, {df}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:  # 0.5 + integral of the density over [0, x] (Simpson, 4000 intervals)
        n = 4000
        t = np.linspace(0.0, x, n + 1)
        f = np.exp(log_c - (df + 1) / 2 * np.log1p(t * t / df))
        return 0.5 + float((x / n) / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def expanded_tail(seeds: int, level: float = 0.95) -> float:
    """The one-sided tail alpha' / 2 of Hesterberg's expanded percentile interval for ``seeds`` units; the
    plain (1 - level) / 2 with fewer than 2 units."""
    alpha = 1.0 - level
    if seeds < 2:
        return alpha / 2
    z = math.sqrt(seeds / (seeds - 1)) * student_t_quantile(1 - alpha / 2, seeds - 1)
    return NormalDist().cdf(-z)


def _padded(values: Sequence[Sequence[float]], name: str) -> tuple[np.ndarray, np.ndarray]:
    """[seeds][problems] (ragged) -> (values [S, J_max] zero-padded, problems per seed [S])."""
    rows = [np.asarray(list(v), dtype=np.float64).ravel() for v in values]
    if not rows:
        raise ValueError(f"{name}: needs at least one seed")
    if any(r.size == 0 for r in rows):
        raise ValueError(f"{name}: every seed needs at least one problem")
    out = np.zeros((len(rows), max(r.size for r in rows)))
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return out, np.array([r.size for r in rows])


def _same_shape(a: np.ndarray, na: np.ndarray, b: np.ndarray, nb: np.ndarray, name: str) -> None:
    if a.shape != b.shape or not np.array_equal(na, nb):
        raise ValueError(f"{name}: both arms need the same seeds and the same problems per seed (paired), got "
                         f"{na.tolist()} and {nb.tolist()} problems")


def _resample_sums(arrays: Sequence[np.ndarray], counts: np.ndarray, resamples: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """Two-stage resampling: per resample, ``S`` seeds drawn with replacement and, for each drawn seed, its
    problems drawn with replacement (the same indices for every array). Returns the drawn seeds [R, S] and,
    per array, the [R, S] within-seed sums over each drawn seed's drawn problems."""
    s_count, j_max = arrays[0].shape
    seeds = rng.integers(0, s_count, size=(resamples, s_count))  # [R, S]
    j = counts[seeds]  # problems of each drawn seed
    idx = np.floor(rng.random((resamples, s_count, j_max)) * j[..., None]).astype(np.int64)
    keep = np.arange(j_max)[None, None, :] < j[..., None]  # a seed with J problems draws J of them
    return seeds, [np.where(keep, arr[seeds[..., None], idx], 0.0).sum(axis=2) for arr in arrays]


def _interval(point: float, boot: np.ndarray, seeds: int, null: float, target: float, level: float) -> Interval:
    tail = expanded_tail(seeds, level)
    finite = boot[~np.isnan(boot)]
    lo, hi = _quantiles(finite, tail) if finite.size else (math.nan, math.nan)
    decided = verdict(lo, hi, null, target) if seeds >= MIN_SEEDS else "underpowered"
    return Interval(point, lo, hi, null, target, seeds, decided)


def pooled_ratio(successes_a: Sequence[Sequence[float]], successes_b: Sequence[Sequence[float]],
                 samples: Sequence[Sequence[float]] | None = None, *, target: float, resamples: int = 4000,
                 seed: int = 0, level: float = 0.95) -> Interval:
    """Ratio of pooled success rates of arm A over arm B, [seeds][problems] success counts each (the same
    ``samples`` per problem for both arms; only checked for shape, the counts cancel in the ratio). Null 1.
    Where a resample has no success in B: inf when A has some, 1 when neither has (no difference)."""
    a, ja = _padded(successes_a, "pooled_ratio")
    b, jb = _padded(successes_b, "pooled_ratio")
    _same_shape(a, ja, b, jb, "pooled_ratio")
    if samples is not None:
        n, jn = _padded(samples, "pooled_ratio")
        _same_shape(a, ja, n, jn, "pooled_ratio")
        if (a > n).any() or (b > n).any() or (a < 0).any() or (b < 0).any():
            raise ValueError("pooled_ratio: success counts must lie in [0, samples]")
    rng = np.random.default_rng(seed)
    _, sums = _resample_sums([a, b], ja, resamples, rng)
    sa, sb = (x.sum(axis=1) for x in sums)
    point = _safe_ratio(np.array([a.sum()]), np.array([b.sum()]))[0]
    return _interval(float(point), _safe_ratio(sa, sb), len(ja), 1.0, target, level)


def _safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / den
    out[(den == 0) & (num == 0)] = 1.0
    out[(den == 0) & (num > 0)] = math.inf
    return out


def paired_difference(values_a: Sequence[Sequence[float]] | Sequence[float],
                      values_b: Sequence[Sequence[float]] | Sequence[float], *, target: float,
                      resamples: int = 4000, seed: int = 0, level: float = 0.95) -> Interval:
    """Mean over seeds of the seed's mean over problems of (a - b). ``values_*`` are [seeds][problems] or one
    value per seed ([seeds]; then only seeds are resampled). Null 0."""
    a, ja = _padded(_nested(values_a), "paired_difference")
    b, jb = _padded(_nested(values_b), "paired_difference")
    _same_shape(a, ja, b, jb, "paired_difference")
    diff = a - b
    drawn, (sums,) = _resample_sums([diff], ja, resamples, np.random.default_rng(seed))
    boot = (sums / ja[drawn]).mean(axis=1)  # each drawn seed's problem mean, averaged over the drawn seeds
    point = float(np.mean([diff[i, : ja[i]].mean() for i in range(len(ja))]))
    return _interval(point, boot, len(ja), 0.0, target, level)


def pooled_rate(successes: Sequence[Sequence[float]], samples: Sequence[Sequence[float]], *, resamples: int = 4000,
                seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(rate, lo, hi): one arm's pooled success rate over seeds and problems with the same two-stage
    interval (no verdict: nothing is compared)."""
    a, ja = _padded(successes, "pooled_rate")
    n, jn = _padded(samples, "pooled_rate")
    _same_shape(a, ja, n, jn, "pooled_rate")
    rng = np.random.default_rng(seed)
    _, sums = _resample_sums([a, n], ja, resamples, rng)
    sa, sn = (x.sum(axis=1) for x in sums)
    tail = expanded_tail(len(ja), level)
    boot = sa / np.maximum(sn, 1)
    return (float(a.sum() / max(n.sum(), 1)), *_quantiles(boot, tail))


def _quantiles(boot: np.ndarray, tail: float) -> tuple[float, float]:
    """The ``tail`` and 1 - ``tail`` quantiles, read off the sorted resamples without interpolating (a
    resample may be inf, and inf - inf would make an interpolated bound nan)."""
    return (float(np.quantile(boot, tail, method="inverted_cdf")),
            float(np.quantile(boot, 1 - tail, method="inverted_cdf")))


def _nested(values) -> list:
    vals = list(values)
    if vals and not isinstance(vals[0], (Sequence, np.ndarray)):
        return [[v] for v in vals]
    return vals
