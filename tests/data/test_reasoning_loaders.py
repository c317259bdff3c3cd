"""Reasoning loaders (MATH, GSM8K, our JSONL) on shipped fixtures and on small broken files."""

import json
from pathlib import Path

import pytest

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.core.rubric import RubricError
from rise_nemo.data.reasoning import (
    MATH_PROMPT,
    extract_boxed,
    gsm8k_final_answer,
    load_reasoning_problems,
)

FIXTURES = Path(__file__).parent / "fixtures"


def _write(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


@pytest.mark.parametrize(
    "text, want",
    [
        ("so $x = \\boxed{3}$.", "3"),
        ("$\\boxed{\\frac{5}{6}}$", "\\frac{5}{6}"),
        ("\\boxed{\\dfrac{\\frac{1}{2}}{3}}", "\\dfrac{\\frac{1}{2}}{3}"),
        ("\\boxed{\\left\\{-2, 2\\right\\}}", "\\left\\{-2, 2\\right\\}"),
        ("a \\boxed{1} then \\boxed{ 2 }", "2"),  # the last box is the answer
        ("\\fbox{7}", "7"),
        ("The answer is \\boxed 5.", "5."),
        ("no box here", None),
    ],
)
def test_extract_boxed(text, want):
    assert extract_boxed(text) == want


def test_extract_boxed_unbalanced_is_an_error_not_half_an_answer():
    with pytest.raises(ValueError, match="unbalanced"):
        extract_boxed("\\boxed{\\frac{1}{2}")


def test_gsm8k_final_answer_strips_annotations_and_separators():
    steps, answer = gsm8k_final_answer("She pays 2*500=<<2*500=1000>>1,000 dollars.\n#### 1,000")
    assert answer == "1000" and steps == "She pays 2*500=1,000 dollars."
    with pytest.raises(ValueError, match="####"):
        gsm8k_final_answer("no final line")


@pytest.mark.parametrize("tail", ["seven", "1 2", "3/4", "18 dollars", "-"])
def test_gsm8k_answer_that_is_not_a_number_is_refused_naming_the_line(tmp_path, tail):
    """`#### seven` was accepted as a reference answer no verifier could ever match."""
    assert gsm8k_final_answer("x\n#### -12")[1] == "-12" and gsm8k_final_answer("x\n#### 2.5")[1] == "2.5"
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "ok\n#### 4"}) + "\n"
                    + json.dumps({"question": "q", "answer": f"steps\n#### {tail}"}) + "\n")
    with pytest.raises(RubricError, match=f"{path}:2.*answer.*must be a number"):
        load_reasoning_problems(path, fmt="gsm8k")


def test_gsm8k_fixture_all_rows():
    problems, skipped = load_reasoning_problems(FIXTURES / "gsm8k_test_first8.jsonl")
    raw = [json.loads(line) for line in (FIXTURES / "gsm8k_test_first8.jsonl").read_text().splitlines()]
    assert len(problems) == 8 and skipped == []
    assert [p.answer for p in problems] == [r["answer"].rpartition("####")[2].strip() for r in raw]
    assert problems[0].answer == "18" and problems[2].answer == "70000"
    first = problems[0]
    assert isinstance(first, ReasoningProblem)
    assert first.prompt_id == "gsm8k_test_first8-1"
    assert first.messages == ({"role": "user", "content": MATH_PROMPT.format(raw[0]["question"])},)
    assert "<<" not in first.reference_solution and first.reference_solution.endswith("\\boxed{18}.")
    assert extract_boxed(first.reference_solution) == first.answer


def test_math_fixture_answers_levels_and_ids():
    problems, skipped = load_reasoning_problems(FIXTURES / "math_sample.jsonl", fmt="math")
    assert skipped == []
    assert [p.answer for p in problems] == [
        "\\frac{5}{6}", "3", "5\\sqrt{2}", "\\left\\{-2, 2\\right\\}", "\\dfrac{2}{3}", "4"]
    assert [p.difficulty for p in problems] == [1, 2, 2, 3, None, 1]
    assert problems[5].prompt_id == "test/prealgebra/4.json"
    assert problems[0].messages[0]["content"].endswith("What is $\\frac{1}{2} + \\frac{1}{3}$?")
    assert "\\boxed{\\frac{5}{6}}" in problems[0].reference_solution


def test_own_format_fixture():
    problems, _ = load_reasoning_problems(FIXTURES / "reasoning_sample.jsonl")
    a, b = problems
    assert (a.prompt_id, a.answer, a.difficulty) == ("chain-1", "14", 2)
    assert a.messages == ({"role": "user", "content": "Compute (3 + 4) * 2 step by step. End with \\boxed{answer}."},)
    assert b.messages[0]["role"] == "system" and b.answer == "\\frac{9}{2}" and b.difficulty is None


def test_explicit_math_answer_wins_and_mixed_formats_auto_detect(tmp_path):
    path = _write(tmp_path / "mix.jsonl", [
        {"problem": "p", "solution": "so \\boxed{0.5}", "answer": "\\frac{1}{2}"},
        {"question": "q", "answer": "1+1=2\n#### 2"},
        {"prompt": "r", "reference_solution": "s", "answer": 2.0, "difficulty": 0},
    ])
    problems, _ = load_reasoning_problems(path)
    assert [p.answer for p in problems] == ["\\frac{1}{2}", "2", "2"]


@pytest.mark.parametrize(
    "row, key, msg",
    [
        ("{not json", None, "malformed JSON"),
        ({"problem": "p", "solution": "no box"}, "solution", "no \\\\boxed"),
        ({"problem": "p", "solution": "\\boxed{\\frac{1}{2}"}, "solution", "unbalanced"),
        ({"problem": "", "solution": "\\boxed{1}"}, "problem", "non-empty string"),
        ({"question": "q", "answer": "no hashes"}, "answer", "####"),
        ({"question": "q", "answer": "x\n####   "}, "answer", "nothing after"),
        ({"prompt": "p", "reference_solution": "s"}, "answer", "missing"),
        ({"prompt": "p", "answer": "1"}, "reference_solution", "missing"),
        ({"prompt": "p", "reference_solution": "s", "answer": True}, "answer", "string or a number"),
        ({"prompt": "p", "reference_solution": "s", "answer": "1", "difficulty": -1}, "difficulty", ">= 0"),
        ({"prompt": [{"role": "bot", "content": "x"}], "reference_solution": "s", "answer": "1"},
         "prompt[0].role", "expected one of"),
        ({"foo": 1}, None, "cannot tell the record's format"),
        ([1, 2], None, "JSON object"),
    ],
)
def test_bad_rows_name_file_line_and_key(tmp_path, row, key, msg):
    good = {"prompt": "ok", "reference_solution": "s", "answer": "1"}
    path = _write(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(RubricError, match=msg) as info:
        load_reasoning_problems(path)
    text = str(info.value)
    assert text.startswith(f"{path}:2:")
    if key is not None:
        assert f"key {key!r}" in text


def test_skip_invalid_skips_counts_and_keeps_the_rest(tmp_path):
    rows = [
        {"prompt_id": "a", "prompt": "ok", "reference_solution": "s", "answer": "1"},
        {"question": "q", "answer": "no hashes"},
        "{broken",
        {"prompt_id": "a", "prompt": "dup", "reference_solution": "s", "answer": "1"},
        {"problem": "p", "solution": "\\boxed{2}"},
    ]
    path = _write(tmp_path / "mixed.jsonl", rows)
    problems, skipped = load_reasoning_problems(path, skip_invalid=True)
    assert [p.prompt_id for p in problems] == ["a", "mixed-5"]
    assert [s.where for s in skipped] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "duplicate id 'a'" in skipped[2].reason


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="fmt must be one of"):
        load_reasoning_problems(tmp_path / "x.jsonl", fmt="aime")
    with pytest.raises(FileNotFoundError, match="x.jsonl"):
        load_reasoning_problems(tmp_path / "x.jsonl")


def test_parquet_math_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (FIXTURES / "math_sample.jsonl").read_text().splitlines()][:3]
    pq.write_table(pa.Table.from_pylist([{k: r[k] for k in ("problem", "solution", "level")} for r in rows]),
                   tmp_path / "math.parquet")
    problems, _ = load_reasoning_problems(tmp_path / "math.parquet")
    assert [p.answer for p in problems] == ["\\frac{5}{6}", "3", "5\\sqrt{2}"]
    assert problems[1].prompt_id == "math-2"
