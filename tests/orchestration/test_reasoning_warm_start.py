"""The warm-start property check (rise_nemo/loop/warm_start.py) and the pooled
pass@k the reasoning demo prints (rise_nemo/steps/reasoning_eval.py), on hand-made evaluation results."""

from __future__ import annotations

import pytest

from rise_nemo.loop.warm_start import format_warm_start_properties, warm_start_properties
from rise_nemo.steps.reasoning_eval import pooled_pass_at_k


def _result(levels: dict[int, tuple[float, float | None, float | None, int]]) -> dict:
    """levels: level -> (pass@1, pass@8 or None, step accuracy, problems)."""
    out = {}
    for level, (p1, p8, acc, problems) in levels.items():
        pk = {"1": p1, **({"8": p8} if p8 is not None else {})}
        out[str(level)] = {"problems": problems, "pass_at_k": pk, "step_accuracy": acc}
    return {"levels": out}


def test_properties_met_at_the_boundaries():
    props = warm_start_properties(_result({1: (0.50, 0.9, 0.9, 16), 5: (0.1, 0.4, 0.6, 16), 10: (0.03, 0.20, 0.5, 16)}))
    assert (props["short_level"], props["long_level"]) == (1, 10)
    assert props["met"] == {"short_pass1": True, "long_pass1": True, "long_pass8": True, "min_step_accuracy": True}
    assert props["all_met"]
    line = format_warm_start_properties(props)
    assert line == ("warm-start properties: L1 pass@1 50.0% >= 50% met; L10 pass@1 3.0% <= 3% met; "
                    "L10 pass@8 20.0% <= 20% met; step accuracy (every level) 50.0% >= 50% met -> all met")


@pytest.mark.parametrize("levels, failed", [
    ({1: (0.49, 0.9, 0.9, 4), 10: (0.0, 0.0, 0.9, 4)}, "short_pass1"),
    ({1: (0.6, 0.9, 0.9, 4), 10: (0.031, 0.1, 0.9, 4)}, "long_pass1"),
    ({1: (0.6, 0.9, 0.9, 4), 10: (0.01, 0.21, 0.9, 4)}, "long_pass8"),
    ({1: (0.6, 0.9, 0.9, 4), 4: (0.2, 0.5, 0.49, 4), 10: (0.01, 0.1, 0.9, 4)}, "min_step_accuracy"),
])
def test_each_property_can_fail(levels, failed):
    props = warm_start_properties(_result(levels))
    assert [k for k, v in props["met"].items() if v is not True] == [failed]
    assert not props["all_met"]
    assert "NOT MET" in format_warm_start_properties(props) and "NOT all met" in format_warm_start_properties(props)


def test_unmeasurable_pass8_is_not_counted_as_met():
    props = warm_start_properties(_result({1: (0.6, None, 0.9, 4), 10: (0.0, None, 0.9, 4)}))
    assert props["long_pass8"] is None and props["met"]["long_pass8"] is None and not props["all_met"]
    assert "L10 pass@8 n/a <= 20% not measured" in format_warm_start_properties(props)


def test_pooled_pass_at_k_weights_levels_by_problems():
    result = _result({6: (0.1, 0.5, 0.6, 10), 7: (0.4, 0.8, 0.6, 30), 10: (0.0, None, 0.6, 5)})
    assert pooled_pass_at_k(result, [6, 7], 1) == pytest.approx((0.1 * 10 + 0.4 * 30) / 40)
    assert pooled_pass_at_k(result, [6, 7], 8) == pytest.approx((0.5 * 10 + 0.8 * 30) / 40)
    assert pooled_pass_at_k(result, [10], 8) is None  # fewer than 8 samples
    assert pooled_pass_at_k(result, [9], 1) is None  # level not evaluated
