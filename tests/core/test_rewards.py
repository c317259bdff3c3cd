"""Eq. 3-5: rubric reward, failure matrix, priority, TopM — hand-computed examples."""

import pytest
import torch

from rise_nemo.core.rewards import criterion_priority, failure_matrix, rubric_reward, select_feedback


def test_healthbench_example_eleven_over_twentytwo():
    # HealthBench README: points 7, 5, 10, -6 met T, F, T, T -> (7 + 10 - 6) / 22
    r = rubric_reward(torch.tensor([True, False, True, True]), torch.tensor([7.0, 5.0, 10.0, -6.0]))
    assert r.item() == pytest.approx(11 / 22)


def test_reward_batched_and_clip():
    w = torch.tensor([2.0, -4.0])
    z = torch.tensor([[1, 0], [0, 1], [1, 1]])
    assert rubric_reward(z, w).tolist() == pytest.approx([1.0, -2.0, -1.0])
    assert rubric_reward(z, w, clip_min=0.0).tolist() == pytest.approx([1.0, 0.0, 0.0])


def test_reward_all_positive_equals_paper_form():
    w = torch.tensor([3.0, 1.0, 6.0])
    z = torch.tensor([1.0, 1.0, 0.0])
    assert rubric_reward(z, w).item() == pytest.approx((3 + 1) / (3 + 1 + 6))


def test_reward_rejects_no_positive_points_and_shape_mismatch():
    with pytest.raises(ValueError, match="positive points"):
        rubric_reward(torch.tensor([1.0]), torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="K=2"):
        rubric_reward(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([1.0, 2.0]))


def test_failure_matrix_signs():
    w = torch.tensor([5.0, -3.0, 0.0])
    z = torch.tensor([[True, True, True], [False, False, False]])
    f = failure_matrix(z, w)
    # positive fails when not met; negative fails when met; zero-weight never fails
    assert f.tolist() == [[False, True, False], [True, False, False]]


def test_priority_and_negative_criterion_selected():
    w = torch.tensor([2.0, -6.0, 5.0, 1.0])
    # 4 responses: crit0 missed by 1, negative crit1 met (= failed) by 3, crit2 always met, crit3 missed by 4
    z = torch.tensor(
        [
            [1, 1, 1, 0],
            [1, 1, 1, 0],
            [1, 1, 1, 0],
            [0, 0, 1, 0],
        ]
    ).bool()
    p = criterion_priority(z, w)
    assert p.tolist() == pytest.approx([2.0, 18.0, 0.0, 4.0])
    fails = failure_matrix(z, w).sum(0)
    assert select_feedback(p, fails, top_m=1) == [1]  # the negative criterion wins by priority
    assert select_feedback(p, fails, top_m=5) == [1, 3, 0]  # f_k = 0 criterion 2 never selected
    assert select_feedback(p, fails, top_m=None) == [1, 3, 0]


def test_select_feedback_ties_by_lower_index():
    p = torch.tensor([3.0, 5.0, 3.0, 5.0, 3.0])
    f = torch.tensor([1, 1, 1, 1, 0])
    assert select_feedback(p, f, top_m=3) == [1, 3, 0]
    assert select_feedback(p, f, top_m=0) == []
    with pytest.raises(ValueError):
        select_feedback(p, f, top_m=-1)
