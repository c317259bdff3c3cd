"""rise_nemo.core.metrics.bootstrap_mean: seeded, clipped, intervals around the mean."""

from __future__ import annotations

import statistics

import pytest

from rise_nemo.core.metrics import bootstrap_mean


def test_seeded_standard_error_and_interval():
    values = [0.0, 1.0] * 50
    a = bootstrap_mean(values, resamples=2000, seed=3)
    assert a == bootstrap_mean(values, resamples=2000, seed=3)  # the same seed, the same figures
    assert a["mean"] == 0.5
    se = statistics.pstdev(values) / len(values) ** 0.5  # 0.05
    assert a["std"] == pytest.approx(se, rel=0.1)
    assert a["lo"] < 0.5 < a["hi"] and a["hi"] - a["lo"] == pytest.approx(2 * 1.96 * se, rel=0.15)
    narrow = bootstrap_mean(values, resamples=2000, seed=3, level=0.5)
    assert narrow["hi"] - narrow["lo"] < a["hi"] - a["lo"]


def test_clipping_and_bad_input():
    assert bootstrap_mean([-1.0, -0.5], clip=(0.0, 1.0)) == {"mean": 0.0, "std": 0.0, "lo": 0.0, "hi": 0.0}
    assert bootstrap_mean([2.0], clip=(0.0, 1.0))["mean"] == 1.0
    for bad in ({"values": []}, {"values": [1.0], "resamples": 0}, {"values": [1.0], "level": 1.0}):
        with pytest.raises(ValueError):
            bootstrap_mean(**bad)
