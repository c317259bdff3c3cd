"""Every judge-reply parser is total: whatever text (or non-text) a judge sends back, the parser returns a
valid value or raises VerdictParseError, the one exception the HTTP client turns into a retry and, after
the last attempt, an unknown verdict (rise_nemo/judges/client.py). Any other exception would escape the
client and crash the training step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rise_nemo.judges.grading import VerdictParseError, parse_batched, parse_per_criterion
from rise_nemo.judges.reference import parse_scores

TAG = "G7"

# Replies that once escaped as a plain ValueError / RecursionError.
HOSTILE = [
    f"[{TAG}] Score: " + "9" * 5000,  # int() refuses more than 4,300 digits
    f"[{TAG}] Segment {'1' * 5000} Score: 3",
    '{"criteria_met": true, "explanation": "x", "n": ' + "7" * 5000 + "}",  # json.loads: same digit limit
    "[" * 100_000 + "]" * 100_000,  # json.loads: RecursionError
    '{"1": ' + "[" * 100_000 + "]" * 100_000 + "}",
]


def _parsers():
    return [
        ("per_criterion", parse_per_criterion),
        ("batched", lambda reply: parse_batched(reply, 3)),
        ("outcome", lambda reply: parse_scores(reply, TAG, None)),
        ("process", lambda reply: parse_scores(reply, TAG, 2)),
    ]


def _total(parse, reply) -> None:
    try:
        parse(reply)
    except VerdictParseError:
        pass


@pytest.mark.parametrize("name,parse", _parsers())
@pytest.mark.parametrize("reply", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_replies_are_parse_errors(name, parse, reply):
    with pytest.raises(VerdictParseError):
        parse(reply)


# Text near the grammar of each reply, so hypothesis explores the parsers' branches, not only noise.
_near = st.one_of(
    st.text(),
    st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.builds(lambda n, pad: f"{pad}[{TAG}] Score: {n}", st.integers(-10, 10**60).map(str) | st.text("0123456789", min_size=1), st.text()),
    st.builds(lambda k, n: f"[{TAG}] Segment 1 Score: 3\n[{TAG}] Segment {k} Score: {n}",
              st.text("0123456789", min_size=1), st.text("0123456789 ", min_size=1)),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
                 max_leaves=12).map(repr),
    st.dictionaries(st.sampled_from(["1", "2", "3", "explanation", "criteria_met"]),
                    st.sampled_from(['"PRESENT"', '"NOT_PRESENT"', "true", "false", "1e999", "-0", '""', "null"]),
                    max_size=5).map(lambda d: "{" + ",".join(f'"{k}": {v}' for k, v in d.items()) + "}"),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply=_near)
def test_any_text_is_a_value_or_a_parse_error(reply):
    for _, parse in _parsers():
        _total(parse, reply)


@settings(max_examples=100, deadline=None)
@given(reply=st.one_of(st.binary(), st.none(), st.integers(), st.lists(st.text(), max_size=3)))
def test_non_text_is_a_parse_error(reply):
    for _, parse in _parsers():
        with pytest.raises(VerdictParseError):
            parse(reply)
