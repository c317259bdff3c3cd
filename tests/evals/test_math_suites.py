"""Math suites (aime, math500, gsm8k) and the shared responses-file / SCORE-line machinery."""

from __future__ import annotations

import json

import pytest
from suite_helpers import reference_rows, run_cli, score_fields, write_responses

from rise_nemo.errors import UserError
from rise_nemo.evals import SUITES, get_suite
from rise_nemo.evals.base import ScoreContext, pass_table, read_responses
from rise_nemo.evals.math import aime_answer, aime_correct

MATH = ["aime", "math500", "gsm8k"]


@pytest.mark.parametrize("name", MATH)
def test_reference_answers_score_one_and_shuffled_answers_about_chance(name, tmp_path, capsys):
    suite = get_suite(name)
    items = suite.load(None)
    assert len(items) == 8
    right = write_responses(tmp_path / "right.jsonl", reference_rows(suite, items))
    rc, out, err = run_cli(["score", "--suite", name, "--responses", right, "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    fields = score_fields(out)
    assert fields["suite"] == name and fields["n"] == "8" and float(fields["score"]) == 1.0
    saved = json.loads((tmp_path / "o" / f"{name}.json").read_text())
    assert saved["score"] == 1.0 and saved["n"] == 8 and len(saved["per_item"]) == 8
    assert (tmp_path / "o" / f"{name}.md").read_text().startswith(f"# {name}")
    # Every problem answered with another problem's answer: free-form math has chance ~0.
    wrong = write_responses(tmp_path / "wrong.jsonl", reference_rows(suite, items, shift=3))
    rc, out, err = run_cli(["score", "--suite", name, "--responses", wrong, "--out", tmp_path / "w"], capsys)
    assert rc == 0, err
    assert float(score_fields(out)["score"]) <= 0.125


def test_pass_at_k_and_avg_at_k_by_hand():
    # problem 1: 4 samples, 1 right; problem 2: 4 samples, 0 right.
    table = pass_table([(4, 1), (4, 0)])
    assert table["pass@1"] == pytest.approx(0.125)
    assert table["pass@2"] == pytest.approx((1 - 3 / 6) / 2)  # 1 - C(3,2)/C(4,2)
    assert table["pass@4"] == pytest.approx(0.5)
    assert set(table) == {"pass@1", "pass@2", "pass@4"}
    assert set(pass_table([(3, 3)])) == {"pass@1", "pass@2", "pass@3"}  # the last k is n itself


def test_aime_integer_comparison_cases():
    assert aime_correct("025", "so the answer is \\boxed{25}")
    assert aime_correct("25", "\\boxed{025}")
    assert not aime_correct("25", "\\boxed{25.5}")  # not an integer: wrong, never rounded
    assert not aime_correct("25", "I do not know")  # no answer at all
    assert aime_correct("204", "... 3.4 hours, or 204 minutes")  # no box: the last integer
    assert not aime_correct("204", "\\boxed{204} no wait \\boxed{205}")  # the LAST box counts
    assert aime_answer("\\boxed{1,000}") == 1000


def test_math500_uses_math_verify_and_counts_samples(tmp_path):
    suite = get_suite("math500")
    items = suite.load(None)
    i = next(it.index for it in items if it.reference == "\\frac{14}{3}")
    samples = {it.index: [suite.reference_response(it)] for it in items}
    samples[i] = ["The answer is \\boxed{14/3}.", "$\\boxed{4.6667}$", "no answer here"]
    result = suite.score(items, samples, ScoreContext())
    row = next(r for r in result.per_item if r["index"] == i)
    assert row["verdicts"][0] is True and row["verdicts"][2] is False and row["samples"] == 3
    # avg over problems of c_i / n_i (not over samples)
    c_i = sum(v is True for v in row["verdicts"])
    assert result.score == pytest.approx((7 + c_i / 3) / 8)
    assert result.breakdown and all(k.startswith("level ") for k in result.breakdown)  # MATH levels


BAD_LINES = [
    ('{"index": 0, "response": "1"}\n{"index": 1, "response": \n', ":2: malformed JSON"),
    ('{"index": 0, "response": "1"}\n{"index": 8, "response": "2"}\n',
     r":2: key 'index': 8 is out of range \(the data has 8 rows, 0..7\)"),
    ('{"index": 0}\n', ":1: key 'response': missing"),
    ('{"response": "x"}\n', ":1: key 'index': missing"),
    ('{"index": "0", "response": "x"}\n', ":1: key 'index': expected int"),
    ('{"index": 0, "response": "x"}\n', ": 7 of 8 problems have no response"),
]


@pytest.mark.parametrize("text,message", BAD_LINES)
def test_bad_responses_files_are_one_line_errors(text, message, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    with pytest.raises(UserError, match=f"^{bad}{message}"):
        read_responses(bad, 8)


def test_bad_responses_through_the_cli(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"index": 0, "response": "x"}\n')
    assert read_responses(bad, 8, partial=True) == {0: ["x"]}
    # Through the CLI: exit 2 and exactly one line on stderr, no traceback.
    bad.write_text('{"index": 0, "response": "1"}\n{"index": 99, "response": "2"}\n')
    rc, out, err = run_cli(["score", "--suite", "gsm8k", "--responses", bad, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and f"{bad}:2: key 'index'" in err


def test_partial_scoring_and_bad_data_rows(tmp_path, capsys):
    rows = tmp_path / "r.jsonl"
    write_responses(rows, [(0, "\\boxed{18}"), (0, "\\boxed{17}")])
    rc, out, err = run_cli(["score", "--suite", "gsm8k", "--responses", rows, "--partial", "--out", tmp_path / "o"],
                           capsys)
    assert rc == 0, err
    assert score_fields(out)["n"] == "1" and float(score_fields(out)["score"]) == 0.5
    data = tmp_path / "gsm.jsonl"
    data.write_text('{"question": "q", "answer": "#### 3"}\n{"question": "q2"}\n')
    rc, out, err = run_cli(["score", "--suite", "gsm8k", "--data", data, "--responses", rows, "--out",
                            tmp_path / "o"], capsys)
    assert rc == 2 and f"{data}:2" in err and "'answer'" in err and len(err.strip().splitlines()) == 1


def test_list_suites_and_unknown_suite(capsys):
    rc, out, _ = run_cli(["score", "--list-suites"], capsys)
    assert rc == 0 and all(name in out for name in SUITES)
    rc, _, err = run_cli(["score", "--suite", "nope", "--responses", "x.jsonl"], capsys)
    assert rc == 2 and "unknown suite" in err


def test_answer_only_rows_for_other_aime_years(tmp_path, capsys):
    data = tmp_path / "aime25.jsonl"
    data.write_text(json.dumps({"id": "2025-I-1", "problem": "Find 7 * 3.", "answer": "021"}) + "\n"
                    + json.dumps({"question": "Find 2 + 2.", "answer": 4}) + "\n"
                    + json.dumps({"question": "No answer here."}) + "\n")
    rows = write_responses(tmp_path / "r.jsonl", [(0, "\\boxed{21}"), (1, "\\boxed{5}")])
    rc, _, err = run_cli(["score", "--suite", "aime", "--data", data, "--responses", rows], capsys)
    assert rc == 2 and f"{data}:3: key 'answer': missing" in err
    data.write_text("".join(data.read_text().splitlines(keepends=True)[:2]))
    rc, out, err = run_cli(["score", "--suite", "aime", "--data", data, "--responses", rows, "--out", tmp_path], capsys)
    assert rc == 0, err
    assert score_fields(out)["score"] == "0.5000"
    items = get_suite("aime").load(data)
    assert items[0].item_id == "2025-I-1" and "\\boxed{}" in items[0].messages[0]["content"]
