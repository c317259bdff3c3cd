"""ExpRL core (rise_nemo.core.exprl): exact segment token spans, the process advantage rule on hand-made
scores, score normalisations."""

from __future__ import annotations

import pytest
import torch

from rise_nemo.core.exprl import (
    normalise_score,
    process_advantages,
    segment_token_spans,
    token_process_advantages,
)


def _texts(pieces, spans):
    return ["".join(pieces[a:b]) for a, b in spans]


def test_word_level_rollout_is_cut_before_every_step_marker():
    pieces = "step a add 3 = 20 step b sub 5 = 15 step c add 4 = 19 answer 19".split() + [""]  # "" = EOS
    spans = segment_token_spans(pieces, "step")
    assert spans == [(0, 6), (6, 12), (12, 21)]
    assert _texts(pieces, spans) == ["stepaadd3=20", "stepbsub5=15", "stepcadd4=19answer19"]


def test_marker_inside_or_across_tokens_opens_the_segment_at_the_token_holding_its_first_character():
    pieces = ["Let me think.", "\n#", "## Step 1", " x = 2", "\n##", "# Step 2", " so 4", "###", " Done"]
    spans = segment_token_spans(pieces, "###")
    assert spans == [(0, 1), (1, 4), (4, 7), (7, 9)]  # preamble, 3 headed segments
    assert "".join(_texts(pieces, spans)) == "".join(pieces)  # contiguous cover, nothing lost or repeated


def test_single_segment_cases():
    assert segment_token_spans(["no", " marker", " here"], "###") == [(0, 3)]
    assert segment_token_spans(["### all", " one"], "###") == [(0, 2)]  # marker at token 0: no empty preamble
    assert segment_token_spans([], "###") == [(0, 0)]
    assert segment_token_spans(["#", "#", "#"], "###") == [(0, 3)]  # one marker spread over tokens 0-2
    with pytest.raises(ValueError, match="non-empty"):
        segment_token_spans(["x"], "")


def test_two_markers_in_one_token_give_one_boundary():
    assert segment_token_spans(["a", "### b ### c", "d"], "###") == [(0, 1), (1, 3)]


def test_process_advantages_first_segment_against_last_then_deltas():
    s = [0.25, 0.5, 1.0, 0.75]
    assert process_advantages(s) == [0.25 - 0.75, 0.5 - 0.25, 1.0 - 0.5, 0.75 - 1.0]
    assert process_advantages([0.7]) == [0.0]  # T = 1: A_1 = s_1 - s_1
    assert sum(process_advantages([0.0, 1.0, 0.5])) == pytest.approx(0.0)  # redistributes, never adds
    with pytest.raises(ValueError):
        process_advantages([])


def test_every_token_of_a_segment_gets_its_advantage():
    adv = token_process_advantages([(0, 2), (2, 5), (5, 6)], [0.25, 0.75, 0.5], 6)
    assert torch.equal(adv, torch.tensor([-0.25, -0.25, 0.5, 0.5, 0.5, -0.25]))
    with pytest.raises(ValueError, match="2 segments but 1 scores"):
        token_process_advantages([(0, 1), (1, 2)], [1.0], 2)
    with pytest.raises(ValueError, match="outside"):
        token_process_advantages([(0, 7)], [1.0], 6)


def test_normalisations():
    assert [normalise_score(s) for s in (1, 2, 3, 4, 5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [normalise_score(s, "extremes") for s in (1, 2, 3, 4, 5)] == [0.0, 0.5, 0.5, 0.5, 1.0]
    for bad in (0, 6, -1):
        with pytest.raises(ValueError, match="outside 1..5"):
            normalise_score(bad)
    with pytest.raises(ValueError, match="unknown score normalisation"):
        normalise_score(3, "linear")
