"""RuleJudge: every check kind, errors naming prompt and criterion, per-rubric caching, real rubric data."""

from __future__ import annotations

import json

import pytest

from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric
from rise_nemo.interfaces import Judge, JudgeRequest
from rise_nemo.judges.rule import RuleJudge, RuleJudgeError

CONV = [{"role": "user", "content": "how do i brew green tea ?"}]


def _rubric(*checks: tuple[str, str], weight: float = 1.0) -> Rubric:
    return Rubric(tuple(Criterion(f"criterion {k}:{v}", weight, check=MachineCheck(k, v)) for k, v in checks))


@pytest.mark.parametrize(
    ("kind", "value", "response", "met"),
    [
        ("regex", r"\b\d+ minutes\b", "Steep it for 3 minutes.", True),
        ("regex", r"\b\d+ minutes\b", "Steep it for three minutes.", False),
        ("regex", r"^STEP ONE", "step one : boil water", True),  # case-insensitive
        ("contains", "Ask An Expert", "if unsure, ask an expert today", True),
        ("contains", "ask an expert", "ask the expert", False),
        ("absent", "guaranteed", "results are not promised", True),
        ("absent", "guaranteed", "Results GUARANTEED!", False),
        ("min_words", "5", "one two three four five", True),
        ("min_words", "5", "one two three four", False),
        ("max_words", "3", "one two three", True),
        ("max_words", "3", "one  two\nthree four", False),
    ],
)
def test_each_check_kind(kind, value, response, met):
    judge = RuleJudge()
    assert isinstance(judge, Judge)
    assert judge.judge([JudgeRequest(CONV, response, _rubric((kind, value)), "p0")]) == [[met]]


def test_mixed_rubric_order_and_batch():
    rubric = _rubric(("contains", "tea"), ("min_words", "4"), ("absent", "coffee"), ("regex", r"\bstep one\b"))
    judge = RuleJudge()
    out = judge.judge(
        [
            JudgeRequest(CONV, "green tea : step one boil", rubric, "a"),
            JudgeRequest(CONV, "coffee please", rubric, "b"),
        ]
    )
    assert out == [[True, True, True, True], [False, False, False, False]]
    assert judge.stats.calls == 2 and judge.stats.cache_hits == 1  # compiled once, reused


def test_missing_check_names_prompt_and_criterion():
    rubric = Rubric((Criterion("mentions tea", 2.0, check=MachineCheck("contains", "tea")), Criterion("is kind", 1.0)))
    with pytest.raises(RuleJudgeError, match=r"prompt tea-7: criterion 1 \('is kind'\) has no machine check"):
        RuleJudge().judge([JudgeRequest(CONV, "tea", rubric, "tea-7")])


def test_invalid_regex_names_prompt_and_criterion():
    rubric = _rubric(("regex", "(unclosed"))
    with pytest.raises(RuleJudgeError, match=r"prompt q1: criterion 0 .*invalid regex"):
        RuleJudge().judge([JudgeRequest(CONV, "x", rubric, "q1")])


def _healthbench_rows(path, n):
    with open(path) as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def test_real_healthbench_rubric(healthbench_path):
    """Real criteria have no machine checks: the rule judge refuses them by name; with checks attached
    (a keyword from each criterion's own text) it scores them, negative points included."""
    row = _healthbench_rows(healthbench_path, 1)[0]
    plain = Rubric(tuple(Criterion(r["criterion"], float(r["points"])) for r in row["rubrics"])).validate(row["prompt_id"])
    with pytest.raises(RuleJudgeError, match=rf"prompt {row['prompt_id']}: criterion 0 .*no machine check"):
        RuleJudge().judge([JudgeRequest(row["prompt"], "some answer", plain, row["prompt_id"])])

    keyed = Rubric(
        tuple(
            Criterion(c.text, c.weight, check=MachineCheck("contains", max(c.text.split(), key=len).strip(".,()")))
            for c in plain.criteria
        )
    )
    words = [c.check.value for c in keyed.criteria]
    response = " ".join(words[::2])  # mention every other criterion's keyword
    verdicts = RuleJudge().judge([JudgeRequest(row["prompt"], response, keyed, row["prompt_id"])])[0]
    assert len(verdicts) == len(keyed)
    for k, w in enumerate(words):
        assert verdicts[k] == (w.lower() in response.lower())
    assert verdicts[0] is True


def test_locate_spans_finds_contains_and_regex_matches_and_nothing_for_word_counts():
    from rise_nemo.interfaces import SpanLocatingJudge

    judge = RuleJudge()
    assert isinstance(judge, SpanLocatingJudge)
    rubric = _rubric(("contains", "guaranteed"), ("regex", r"\b\d+ minutes\b"), ("max_words", "3"))
    text = "Success is GUARANTEED . spend 10 minutes a day . it is guaranteed"
    req = JudgeRequest(CONV, text, rubric, "p")
    assert [text[a:b] for a, b in judge.locate_spans(req, 0)] == ["GUARANTEED", "guaranteed"]
    assert [text[a:b] for a, b in judge.locate_spans(req, 1)] == ["10 minutes"]
    assert judge.locate_spans(req, 2) == []
