"""The benches' shared command line (bench/_cli.py): overrides may follow a nargs="+" option."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._cli import parse_with_overrides  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--variants", nargs="+", choices=["ppo", "rrl"], default=["ppo"])
    p.add_argument("--out", default=None)
    p.add_argument("overrides", nargs="*")
    return p


def test_overrides_after_a_greedy_option_are_overrides_not_choices():
    args = parse_with_overrides(_parser(), ["--variants", "ppo", "rrl", "ppo.critic_updates=4", "--out", "F", "a=1"])
    assert args.variants == ["ppo", "rrl"] and args.out == "F"
    assert args.overrides == ["ppo.critic_updates=4", "a=1"]


def test_a_bad_choice_is_still_an_argparse_error():
    with pytest.raises(SystemExit):
        parse_with_overrides(_parser(), ["--variants", "ppo", "nope"])


def test_trl_parity_cli_quick_and_bad_pairs():
    from bench.trl_parity import parse_args

    args = parse_args(["--quick", "sampling.temperature=1.0"])
    assert args.pairs == 1 and args.overrides == ["sampling.temperature=1.0"]
    assert parse_args(["--pairs", "3"]).pairs == 3
    with pytest.raises(SystemExit):
        parse_args(["--pairs", "0"])


BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")))
def test_every_bench_script_measures_this_checkouts_rise_nemo(tmp_path, script):
    """A bench run with a venv whose editable install points at another checkout (a worktree's venv) must still
    measure the code beside the script: a decoy rise_nemo ahead of site-packages is never the one imported."""
    decoy = tmp_path / "decoy" / "rise_nemo"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text('raise ImportError("the decoy rise_nemo of another checkout was imported")\n')
    check = (f"import runpy, sys; runpy.run_path({str(BENCH / script)!r}, run_name='bench_import_check'); "
             f"import rise_nemo; assert rise_nemo.__file__.startswith({str(BENCH.parent)!r}), rise_nemo.__file__")
    res = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(decoy.parent)})
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_pipelined_bench_warns_when_its_arms_miss_the_judge_setting():
    """A run whose calibration missed (one 1x run measured judging at 1.25x generation, ratio 1.088) must say so
    next to its figures; the usual spread (1x measures 0.96-1.02, 2x 1.81-1.86) must not."""
    from bench.pipelined_step import calibration_miss

    for setting, measured in ((1.0, 0.96), (1.0, 1.02), (2.0, 1.81), (2.0, 1.86), (1.0, 1.14), (1.0, 0.86)):
        assert calibration_miss(setting, measured) is None, (setting, measured)
    warning = calibration_miss(1.0, 1.25)
    assert warning is not None and "1x" in warning and "1.25" in warning and "+25%" in warning
    assert "-20%" in calibration_miss(2.0, 1.6)
    assert calibration_miss(0.0, 5.0) is None  # the instant judge has no setting to miss


def test_the_pipelined_bench_decides_its_ceiling_on_an_interval_over_its_pairs():
    """The ratio's target is a ceiling: met only when the whole interval over the pairs is under it, not met when
    the whole interval is above, undecided when it holds the ceiling; too few pairs decide nothing. The pooled
    point is the ratio of sums, whatever the interval."""
    from bench.pipelined_step import pooled_intervals
    from rise_nemo.core.comparison import ceiling_verdict

    assert ceiling_verdict(1.10, 1.14, 1.15, seeds=12) == "met"
    assert ceiling_verdict(1.16, 1.20, 1.15, seeds=12) == "not_met"
    assert ceiling_verdict(1.13, 1.17, 1.15, seeds=12) == "undecided"
    assert ceiling_verdict(1.10, 1.14, 1.15, seeds=3) == "underpowered"

    bound = [3.0, 3.2, 2.9, 3.1, 3.0, 3.3, 2.8, 3.0, 3.1, 2.9, 3.2, 3.0]
    tight = [b * 1.10 for b in bound]  # every pair at 1.10: the interval is the point
    ratio, speedup, decided = pooled_intervals(tight, bound, [b * 2.0 for b in bound])
    assert ratio.point == pytest.approx(1.10) and ratio.lo == pytest.approx(1.10) and ratio.hi == pytest.approx(1.10)
    assert decided == "met"
    assert speedup.point == pytest.approx(2.0 / 1.10) and speedup.verdict == "effect"

    spread = [b * r for b, r in zip(bound, (1.05, 1.25) * 6)]  # pooled about 1.15, pairs 1.05 and 1.25
    ratio, _, decided = pooled_intervals(spread, bound, [b * 2.0 for b in bound])
    assert ratio.point == pytest.approx(sum(spread) / sum(bound))
    assert ratio.lo < 1.15 < ratio.hi and decided == "undecided"
    ratio, _, decided = pooled_intervals([b * 1.2 for b in bound[:3]], bound[:3], bound[:3])
    assert decided == "underpowered"  # three pairs: the old default
