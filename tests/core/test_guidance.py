"""Our guidance extensions (core.guidance, docs/DESIGN.md §2) on hand-built verdict matrices: who is kept,
dropped, down-weighted, masked, gated."""

from __future__ import annotations

import pytest
import torch

from rise_nemo.core.guidance import (
    FailureGate,
    GuidanceOptions,
    PreviousFailures,
    budget_targets,
    length_ok,
    no_regression_retention,
    protected_criteria,
    quote_spans,
    satisfied_matrix,
    sentence_span,
    token_span_mask,
)
from rise_nemo.core.prompts import GUIDANCE_TEMPLATES, LENGTH_NEUTRAL_TEMPLATES, hint_templates

T, F = True, False
# criteria: 0 persistent (+3), 1 short answer (+1), 2 negative "guaranteed" (-2)
WEIGHTS = torch.tensor([3.0, 1.0, -2.0])
# natural group of 4: nobody meets the persistent criterion, 3 of 4 are short, 1 of 4 says "guaranteed"
NAT = torch.tensor([[F, T, F], [F, T, F], [F, T, T], [F, F, F]])
NAT_VALID = torch.tensor([T, T, T, T])
# privileged group of 4, all with A_ref > 0:
#   0 persistent + short + clean (the good one)
#   1 persistent, too long (regresses on "short", which 3/4 natural responses satisfy)
#   2 persistent + short but says "guaranteed" (regresses on the negative criterion, 3/4 avoid it)
#   3 persistent, too long AND "guaranteed"
PRIV = torch.tensor([[T, T, F], [T, F, F], [T, T, T], [T, F, T]])
PRIV_VALID = torch.tensor([T, T, T, T])
A_REF = torch.tensor([0.5, 0.3, 0.2, 0.1])


def test_satisfied_flips_negative_criteria():
    assert satisfied_matrix(NAT, WEIGHTS).tolist() == [[F, T, T], [F, T, T], [F, T, F], [F, F, T]]


def test_protected_criteria_are_those_most_natural_responses_satisfy():
    assert protected_criteria(NAT, WEIGHTS, NAT_VALID, 0.5).tolist() == [F, T, T]
    assert protected_criteria(NAT, WEIGHTS, NAT_VALID, 0.8).tolist() == [F, F, F]
    # invalid natural responses do not vote; none valid -> nothing protected
    only_long = torch.tensor([F, F, F, T])
    assert protected_criteria(NAT, WEIGHTS, only_long, 0.5).tolist() == [F, F, T]
    assert protected_criteria(NAT, WEIGHTS, torch.zeros(4, dtype=torch.bool), 0.5).tolist() == [F, F, F]


def test_none_mode_is_eq8():
    a_ref = torch.tensor([0.5, 0.0, -0.1, float("nan")])
    keep, scale, failed = no_regression_retention(a_ref, PRIV, PRIV_VALID, NAT, NAT_VALID, WEIGHTS, "none")
    assert keep.tolist() == [T, F, F, F]
    assert scale.tolist() == [1.0] * 4 and not failed.any()


def test_hard_mode_keeps_only_responses_without_regressions_and_says_why():
    keep, scale, failed = no_regression_retention(A_REF, PRIV, PRIV_VALID, NAT, NAT_VALID, WEIGHTS, "hard", 0.5)
    assert keep.tolist() == [T, F, F, F]
    assert scale.tolist() == [1.0] * 4
    assert failed.tolist() == [[F, F, F], [F, T, F], [F, F, T], [F, T, T]]  # per criterion reasons
    assert failed.sum(0).tolist() == [0, 2, 2]  # logged drops per criterion


def test_soft_mode_scales_the_guide_weight_by_the_share_of_protected_criteria_kept():
    keep, scale, _ = no_regression_retention(A_REF, PRIV, PRIV_VALID, NAT, NAT_VALID, WEIGHTS, "soft", 0.5)
    assert scale.tolist() == [1.0, 0.5, 0.5, 0.0]  # 2 protected criteria
    assert keep.tolist() == [T, T, T, F]  # weight 0 -> nothing to imitate


def test_regressions_only_apply_to_responses_eq8_keeps_and_invalid_ones_stay_out():
    a_ref = torch.tensor([0.5, -0.3, 0.2, 0.1])
    valid = torch.tensor([T, T, F, T])
    keep, _, failed = no_regression_retention(a_ref, PRIV, valid, NAT, NAT_VALID, WEIGHTS, "hard", 0.5)
    assert keep.tolist() == [T, F, F, F]
    assert failed.tolist() == [[F, F, F], [F, F, F], [F, F, F], [F, T, T]]


def test_located_and_masked_negative_text_is_excused():
    excused = torch.zeros(4, 3, dtype=torch.bool)
    excused[2, 2] = excused[3, 2] = True  # the judge located "guaranteed" in responses 2 and 3
    keep, _, failed = no_regression_retention(A_REF, PRIV, PRIV_VALID, NAT, NAT_VALID, WEIGHTS, "hard", 0.5,
                                              excused)
    assert keep.tolist() == [T, F, T, F]  # 2 is kept (its span is masked), 3 is still too long
    assert failed.sum(0).tolist() == [0, 2, 0]


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="no_regression"):
        no_regression_retention(A_REF, PRIV, PRIV_VALID, NAT, NAT_VALID, WEIGHTS, "strict")


def test_length_check_against_the_natural_mean():
    assert length_ok([10, 30, 31], [20, 20], 1.5) == [T, T, F]
    assert length_ok([100], [20], None) == [T]
    assert length_ok([100], [], 1.5) == [T]  # no natural length known


def test_gate_ema_passes_only_persistent_failures_and_round_trips():
    gate = FailureGate(ema=0.5, threshold=0.75)
    # criterion 0 always failed, 1 failed by half, 2 failed by all on this first visit
    ema = gate.update("p", [1.0, 0.5, 1.0])
    assert gate.passes(ema, [0, 1, 2]) == [0, 2]
    ema = gate.update("p", [1.0, 0.5, 0.0])  # criterion 2 was found on the second visit: 0.5 after EMA
    assert ema == [1.0, 0.5, 0.5]
    assert gate.passes(ema, [0, 2]) == [0]
    assert gate.passes(gate.update("q", [0.25, 0.0, 0.0]), [0]) == []  # another prompt has its own EMA
    other = FailureGate(ema=0.5, threshold=0.75)
    other.load_state_dict(gate.state_dict())
    assert other.update("p", [1.0, 1.0, 1.0]) == gate.update("p", [1.0, 1.0, 1.0])


def test_gate_with_zero_ema_is_the_current_group_rule():
    gate = FailureGate(ema=0.0, threshold=0.75)
    gate.update("p", [1.0])
    assert gate.passes(gate.update("p", [0.5]), [0]) == []
    assert gate.passes(gate.update("p", [0.875]), [0]) == [0]
    with pytest.raises(ValueError):
        FailureGate(ema=1.0)


def test_sentence_span_and_quotes():
    text = "here is advice . success is guaranteed . in short , tea ."
    start = text.index("guaranteed")
    a, b = sentence_span(text, start, start + len("guaranteed"))
    assert text[a:b] == "success is guaranteed ."
    assert quote_spans(text, "Success  is GUARANTEED") == [(text.index("success"), start + len("guaranteed"))]
    assert quote_spans(text, None) == [] and quote_spans(text, "  ") == [] and quote_spans(text, "never said") == []


def test_token_span_mask_excludes_exactly_the_overlapping_tokens():
    words = ["here", "is", "advice", ".", "success", "is", "guaranteed", ".", "in", "short"]

    def prefix_chars(n):
        return len(" ".join(words[:n]))

    text = " ".join(words)
    start = text.index("success")
    mask = token_span_mask(len(words), prefix_chars, [sentence_span(text, start + 12, start + 22)])
    assert mask == [1, 1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert token_span_mask(3, lambda n: 4 * n, []) == [1, 1, 1]
    assert token_span_mask(3, lambda n: 4 * n, [(5, 6)]) == [1, 0, 1]


def test_paper_faithful_switches_everything_off_and_templates():
    on = GuidanceOptions(no_regression="hard", keep_threshold=0.5, mask_penalised_spans=True, span_unit="sentence",
                         max_length_ratio=1.2, gate=True, gate_ema=0.5, gate_threshold=0.75, privileged_budget=0.5,
                         one_pass=True)
    paper = on.with_paper(True)
    assert (paper.no_regression, paper.mask_penalised_spans, paper.max_length_ratio, paper.gate,
            paper.privileged_budget, paper.one_pass) == ("none", False, None, False, None, False)  # every rule off
    assert on.with_paper(False) == on
    assert hint_templates("paper") == GUIDANCE_TEMPLATES
    assert hint_templates("length_neutral") == LENGTH_NEUTRAL_TEMPLATES
    assert all(t.count("{hint}") == 1 for t in LENGTH_NEUTRAL_TEMPLATES)
    with pytest.raises(ValueError, match="rise.hints"):
        hint_templates("verbose")


def test_length_neutral_templates_use_only_the_demo_vocabulary():
    from rise_nemo.backends.local.tokenizer import corpus_words
    from rise_nemo.data.persistent_task import vocabulary_corpus

    known = set(corpus_words(vocabulary_corpus()))
    assert set(corpus_words(LENGTH_NEUTRAL_TEMPLATES)) <= known | {"system", "user", "assistant"}


def test_budget_keeps_the_most_failing_prompts_up_to_the_budget():
    """Rule 5 on hand-built priorities: 8 natural rollouts per prompt x 4 prompts = 32; G' = 8; budget 0.5
    -> 16 privileged rollouts = 2 prompts, the two with the highest failure share; ties to the earlier one."""
    priorities = [0.5, 1.0, 0.75, 1.0]
    assert budget_targets(priorities, 32, 8, 0.5) == [1, 3]
    assert budget_targets([1.0, 1.0, 1.0], 32, 8, 0.5) == [0, 1]  # ties: earlier candidates first
    assert budget_targets(priorities, 32, 8, None) == [0, 1, 2, 3]  # off: everyone (the paper)
    assert budget_targets(priorities, 32, 8, 2.0) == [0, 1, 2, 3]  # a budget larger than the need
    assert budget_targets(priorities, 32, 8, 0.01) == [1]  # never below one guided prompt
    assert budget_targets([], 32, 8, 0.5) == []
    with pytest.raises(ValueError, match="budget"):
        budget_targets(priorities, 32, 8, 0.0)


def test_previous_failures_hint_the_last_visits_criteria_and_mark_first_visits():
    """Rule 6: a recorded prompt is hinted with what its PREVIOUS visit recorded (the latest record wins);
    one recorded with no failures gets no hint; an unrecorded one is a first visit (two-pass fallback)."""
    mem = PreviousFailures()
    assert mem.plan(["a", "b"]) == ({}, [0, 1])
    mem.record("a", [3, 1])
    mem.record("b", [])
    mem.record("c", [2])
    mem.record("c", [0, 4])  # a later visit replaces the earlier one
    assert mem.plan(["b", "a", "d", "c"]) == ({1: [3, 1], 3: [0, 4]}, [2])
    again = PreviousFailures()
    again.load_state_dict(mem.state_dict())
    assert again.plan(["b", "a", "d", "c"]) == mem.plan(["b", "a", "d", "c"])
    assert again.state_dict() == {"hints": {"a": [3, 1], "b": [], "c": [0, 4]}}
