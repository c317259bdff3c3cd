"""pass@k, criterion coverage (paper Tables 12-13) and mean token entropy."""

import math
from math import comb

import pytest
import torch

from rise_nemo.core.metrics import criterion_coverage, mean_token_entropy, pass_at_k


@pytest.mark.parametrize("n,c,k", [(10, 3, 1), (10, 3, 5), (20, 0, 4), (16, 15, 2), (8, 8, 8), (200, 7, 50)])
def test_pass_at_k_matches_binomial_form(n, c, k):
    expected = 1 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_pass_at_k_edge_cases_and_large_n():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 4, 2) == 1.0
    assert pass_at_k(5, 0, 5) == 0.0
    # n = 5000: the binomials overflow a float, the product form does not
    v = pass_at_k(5000, 10, 100)
    assert 0.0 < v < 1.0 and math.isfinite(v)
    with pytest.raises(ValueError, match="k=11"):
        pass_at_k(10, 2, 11)


def test_coverage_table_like_paper_tables_12_13():
    # Table 12, "Initial" column: failures among 8 responses for six criteria: 8, 8, 8, 2, 8, 8
    fails = [8, 8, 8, 2, 8, 8]
    verdicts = [[i >= f for f in fails] for i in range(8)]  # response i meets c_k iff i >= f_k
    table = criterion_coverage(verdicts, [10, 8, 8, 9, 9, 6], names=["R0", "R9", "R10", "R15", "R17", "R18"])
    assert [r.failed for r in table.rows] == fails
    # Table 13, "Initial": 6 / 48 = 12.5%
    assert (table.satisfied, table.total) == (6, 48)
    assert table.coverage == pytest.approx(0.125)
    md = table.to_markdown()
    assert "| R15 | 9 | 2 | 6 / 8 | 75.0% |" in md and "6 / 48" in md


def test_coverage_negative_criteria_unknown_verdicts_and_subset():
    verdicts = [[True, True], [False, None], [True, False]]
    table = criterion_coverage(verdicts, [3.0, -2.0])
    pos, neg = table.rows
    assert (pos.satisfied, pos.total) == (2, 3)
    assert (neg.satisfied, neg.total) == (1, 2)  # negative satisfied when NOT met; None left out
    sub = criterion_coverage(verdicts, [3.0, -2.0], indices=[1])
    assert [r.index for r in sub.rows] == [1]
    with pytest.raises(ValueError, match="row 1"):
        criterion_coverage([[True, True], [True]], [1.0, 1.0])


def test_mean_token_entropy_from_logprobs_and_logits():
    lp = torch.tensor([[0.0, -1.0, -3.0], [0.0, -2.0, -9.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    assert mean_token_entropy(lp, mask) == pytest.approx((1 + 3 + 2) / 3)
    logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens: entropy log 4 at every predicted position
    assert mean_token_entropy(logits, torch.tensor([[0, 1, 1]])) == pytest.approx(math.log(4), rel=1e-6)
    assert math.isnan(mean_token_entropy(lp, torch.zeros(2, 3)))
    with pytest.raises(ValueError, match="does not match"):
        mean_token_entropy(lp, torch.ones(2, 2))


def test_coverage_agrees_with_failure_matrix_on_zero_weight_criteria():
    """An unmet zero-weight criterion is never a failure in failure_matrix (eq. 4-5 feedback),
    so the coverage table must not count it as failed either; all three signs checked against the one rule."""
    from rise_nemo.core.rewards import failure_matrix

    verdicts = [[False, True, False], [False, False, True], [True, None, False]]
    weights = [0.0, 2.0, -1.0]
    table = criterion_coverage(verdicts, weights)
    assert [r.failed for r in table.rows] == [0, 1, 1]
    assert [r.satisfied for r in table.rows] == [3, 1, 2]
    for k, row in enumerate(table.rows):
        known = torch.tensor([[v[k]] for v in verdicts if v[k] is not None])
        assert row.failed == int(failure_matrix(known, [weights[k]]).sum())


def test_win_tie_lose_with_swapped_positions():
    from rise_nemo.core.metrics import win_tie_lose

    # pairs: both orders ours; ours + tie; both theirs; orders disagree; both ties; tie + theirs
    out = win_tie_lose([1, 1, -1, 1, 0, 0], [1, 0, -1, -1, 0, -1])
    assert out == {"win": 2 / 6, "tie": 2 / 6, "lose": 2 / 6, "n": 6}
    assert win_tie_lose([], []) == {"win": 0.0, "tie": 0.0, "lose": 0.0, "n": 0}
    with pytest.raises(ValueError, match="2 verdicts vs 1"):
        win_tie_lose([1, 1], [1])
    with pytest.raises(ValueError, match="-1, 0 or 1"):
        win_tie_lose([2], [1])


def test_ranking_auc_is_the_pairwise_win_rate_with_ties_half():
    import random

    from rise_nemo.core.metrics import ranking_auc

    rng = random.Random(0)
    for _ in range(20):
        scores = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(30)]
        labels = [rng.random() < 0.4 for _ in range(30)]
        pos = [s for s, y in zip(scores, labels) if y]
        neg = [s for s, y in zip(scores, labels) if not y]
        brute = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
        assert ranking_auc(scores, labels) == pytest.approx(brute)
    assert ranking_auc([1, 2, 3], [False, True, True]) == 1.0 and ranking_auc([3, 2, 1], [False, True, True]) == 0.0
    assert ranking_auc([5, 5], [True, False]) == 0.5 and ranking_auc([1, 2], [True, True]) is None
    with pytest.raises(ValueError):
        ranking_auc([1], [True, False])
