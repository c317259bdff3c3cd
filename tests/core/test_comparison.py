"""The comparison statistics (rise_nemo.core.comparison): verdict boundaries, the t quantile, the pairing,
and the intervals' coverage on simulated experiments whose true effect is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rise_nemo.core.comparison import (
    Interval,
    expanded_tail,
    paired_difference,
    pooled_rate,
    pooled_ratio,
    student_t_quantile,
    verdict,
)


@pytest.mark.parametrize("lo,hi,expected", [
    (1.01, 2.0, "effect"),                  # lower bound clears the null, the target is inside
    (1.01, 1.5, "effect"),                  # hi == target: the target is not excluded
    (1.01, 1.49, "effect_below_target"),    # an effect, but one as large as the target is excluded
    (1.0, 1.49, "no_effect_at_target"),     # lo == null: no effect shown
    (0.6, 1.2, "no_effect_at_target"),
    (1.0, 1.5, "underpowered"),             # touches both: neither decided
    (0.5, 3.0, "underpowered"),
    (math.nan, 2.0, "underpowered"),
])
def test_verdict_boundaries_for_a_ratio(lo, hi, expected):
    assert verdict(lo, hi, null=1.0, target=1.5) == expected


def test_verdict_for_a_difference_and_a_bad_target():
    assert verdict(0.001, 0.2, null=0.0, target=0.05) == "effect"
    assert verdict(-0.01, 0.04, null=0.0, target=0.05) == "no_effect_at_target"
    assert verdict(-0.01, 0.06, null=0.0, target=0.05) == "underpowered"
    with pytest.raises(ValueError, match="target"):
        verdict(0.0, 1.0, null=1.0, target=1.0)


def test_target_met_needs_the_point_at_the_target_and_an_effect():
    assert Interval(1.6, 1.1, 2.2, 1.0, 1.5, 10, "effect").target_met
    assert not Interval(1.4, 1.1, 2.2, 1.0, 1.5, 10, "effect").target_met
    assert not Interval(1.6, 0.9, 2.2, 1.0, 1.5, 10, "underpowered").target_met
    assert Interval(1.6, 1.1, 2.2, 1.0, 1.5, 10, "effect").fields("x") == [
        "x=1.6000", "x_lo=1.1000", "x_hi=2.2000", "x_verdict=effect"]


@pytest.mark.parametrize("p,df,expected", [(0.975, 9, 2.262157), (0.975, 1, 12.706205), (0.95, 30, 1.697261),
                                           (0.025, 9, -2.262157)])
def test_student_t_quantile_matches_tables(p, df, expected):
    assert student_t_quantile(p, df) == pytest.approx(expected, abs=2e-5)


def test_expanded_tail_is_narrower_than_the_plain_tail_for_few_seeds():
    assert expanded_tail(10) < 0.025 < expanded_tail(1000) + 1e-3
    assert expanded_tail(1) == pytest.approx(0.025)


def test_pooled_ratio_point_is_the_ratio_of_pooled_successes_and_pairing_is_checked():
    a, b = [[2, 0, 1], [1, 1]], [[1, 0, 1], [0, 1]]
    iv = pooled_ratio(a, b, [[16, 16, 16], [16, 16]], target=1.5, resamples=500)
    assert iv.point == pytest.approx(5 / 3)
    assert iv.lo <= iv.point <= iv.hi
    with pytest.raises(ValueError, match="paired"):
        pooled_ratio([[1, 2]], [[1, 2, 3]], target=1.5)
    with pytest.raises(ValueError, match=r"\[0, samples\]"):
        pooled_ratio([[17]], [[1]], [[16]], target=1.5)


def test_pooled_ratio_without_successes_in_either_arm_is_one():
    iv = pooled_ratio([[0, 0]] * 5, [[0, 0]] * 5, target=1.5, resamples=200)
    assert (iv.point, iv.lo, iv.hi, iv.verdict) == (1.0, 1.0, 1.0, "no_effect_at_target")


def test_fewer_than_five_seeds_are_underpowered_whatever_the_interval():
    # two seeds, both +0.05: the bootstrap interval is [0.05, 0.05], but two seeds show nothing of the spread
    assert paired_difference([0.35, 0.45], [0.3, 0.4], target=0.1, resamples=200).verdict == "underpowered"
    assert paired_difference([0.35, 0.45] * 3, [0.3, 0.4] * 3, target=0.1, resamples=200).verdict == (
        "effect_below_target")


def test_paired_difference_uses_the_pairing():
    # a large between-seed spread shared by both arms, a constant +0.05 gain: the paired interval is tight
    rng = np.random.default_rng(0)
    base = rng.normal(0.0, 1.0, 12)
    iv = paired_difference(list(base + 0.05), list(base), target=0.1, resamples=1000)
    assert iv.point == pytest.approx(0.05)
    assert iv.lo == pytest.approx(0.05) and iv.hi == pytest.approx(0.05)
    assert iv.verdict == "effect_below_target"


def test_pooled_rate_interval_contains_the_pooled_rate():
    rate, lo, hi = pooled_rate([[3, 1], [0, 2]], [[16, 16], [16, 16]], resamples=500)
    assert rate == pytest.approx(6 / 64) and lo <= rate <= hi


def _simulated_binomial(rng, ratio, seeds=10, problems=24, samples=16, base=0.04):
    """Seeds differ in their base rate and each arm's training run; problems differ in difficulty (shared by
    both arms: paired); every factor has mean 1, so the true pooled ratio is ``ratio``."""
    def lognormal(sigma, size):
        return np.exp(rng.normal(0.0, sigma, size) - sigma**2 / 2)
    rate = base * lognormal(0.4, seeds)[:, None] * lognormal(1.0, (seeds, problems))
    pa = np.clip(rate * ratio * lognormal(0.3, seeds)[:, None], 0, 1)
    pb = np.clip(rate * lognormal(0.3, seeds)[:, None], 0, 1)
    return rng.binomial(samples, pa), rng.binomial(samples, pb)


@pytest.mark.parametrize("ratio", [1.0, 1.5])
def test_pooled_ratio_interval_covers_the_true_ratio(ratio):
    rng = np.random.default_rng(11)
    reps, covered = 120, 0
    for r in range(reps):
        a, b = _simulated_binomial(rng, ratio)
        iv = pooled_ratio(a, b, target=1.5, resamples=800, seed=r)
        covered += iv.lo <= ratio <= iv.hi
    assert 0.90 <= covered / reps <= 1.0  # nominal 0.95; the two-stage bootstrap leans conservative


def test_paired_difference_interval_covers_the_true_difference():
    rng = np.random.default_rng(12)
    reps, covered, true = 200, 0, 0.05
    for r in range(reps):
        shared = rng.normal(0.3, 0.1, 10)  # seeds differ a lot, both arms alike
        a = shared + true + rng.normal(0.0, 0.05, 10)
        b = shared + rng.normal(0.0, 0.05, 10)
        iv = paired_difference(list(a), list(b), target=0.1, resamples=1000, seed=r)
        covered += iv.lo <= true <= iv.hi
    assert 0.91 <= covered / reps <= 0.99


def test_a_true_null_is_rarely_called_an_effect_and_a_large_effect_usually_is():
    rng = np.random.default_rng(13)
    null_effects = large_effects = 0
    for r in range(60):
        a, b = _simulated_binomial(rng, 1.0)
        null_effects += pooled_ratio(a, b, target=1.5, resamples=800, seed=r).verdict.startswith("effect")
        a, b = _simulated_binomial(rng, 2.5)
        large_effects += pooled_ratio(a, b, target=1.5, resamples=800, seed=r).verdict == "effect"
    assert null_effects <= 4  # ~2.5% expected one-sided
    assert large_effects >= 45
