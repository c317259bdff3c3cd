"""Multiple-choice suites (gpqa_diamond, medqa) on rows written for these tests (GPQA is not
redistributable; the real files are read by path with --data)."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest
from suite_helpers import reference_rows, run_cli, score_fields, write_responses

from rise_nemo.evals import get_suite
from rise_nemo.evals.base import ScoreContext
from rise_nemo.evals.mc import extract_letter


def gpqa_csv(path, n=40):
    """GPQA's public CSV layout, our own trivial questions."""
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                                "Incorrect Answer 3", "High-level domain"])
        w.writeheader()
        for i in range(n):
            w.writerow({"Record ID": f"q{i}", "Question": f"What is {i} + 1?", "Correct Answer": str(i + 1),
                        "Incorrect Answer 1": str(i + 2), "Incorrect Answer 2": str(i + 3),
                        "Incorrect Answer 3": str(i - 1), "High-level domain": "Physics" if i % 2 else "Chemistry"})
    return path


def medqa_jsonl(path, n=40):
    """jind11/MedQA's layout (options dict, answer_idx), our own questions."""
    rows = [{"question": f"Which number follows {i}?", "answer": str(i + 1), "answer_idx": "B",
             "options": {"A": str(i), "B": str(i + 1), "C": str(i + 2), "D": str(i + 3)}, "meta_info": "step1"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name,make", [("gpqa_diamond", gpqa_csv), ("medqa", medqa_jsonl)])
def test_reference_letters_score_one_shuffled_about_chance(name, make, tmp_path, capsys):
    data = make(tmp_path / ("d.csv" if name == "gpqa_diamond" else "d.jsonl"))
    suite = get_suite(name)
    items = suite.load(data)
    # Seeded shuffling spreads the correct letter (MedQA's rows all say B before shuffling).
    spread = Counter(it.reference for it in items)
    assert len(spread) == 4 and max(spread.values()) <= 20
    right = write_responses(tmp_path / "right.jsonl", reference_rows(suite, items))
    rc, out, err = run_cli(["score", "--suite", name, "--data", data, "--responses", right, "--out", tmp_path], capsys)
    assert rc == 0, err
    assert float(score_fields(out)["score"]) == 1.0 and score_fields(out)["n"] == "40"
    wrong = write_responses(tmp_path / "wrong.jsonl", reference_rows(suite, items, shift=1))
    rc, out, err = run_cli(["score", "--suite", name, "--data", data, "--responses", wrong, "--out", tmp_path], capsys)
    assert rc == 0, err
    assert 0.05 <= float(score_fields(out)["score"]) <= 0.5  # chance is 0.25
    # Another seed shows other letters: responses are tied to the seed they were generated under.
    rc, out, err = run_cli(["score", "--suite", name, "--data", data, "--responses", right, "--seed", "1", "--out",
                            tmp_path], capsys)
    assert rc == 0 and float(score_fields(out)["score"]) < 0.6


def test_prompt_lists_the_shuffled_options_and_the_answer_format(tmp_path):
    suite = get_suite("gpqa_diamond")
    item = suite.load(gpqa_csv(tmp_path / "d.csv", n=3))[2]
    text = item.messages[0]["content"]
    assert "What is 2 + 1?" in text and "'Answer: X'" in text and "A, B, C, D" in text
    assert f"{item.reference}) 3" in text  # the correct option sits at the reference letter
    assert item.group == "Chemistry"


def test_strict_letter_extraction_cases():
    assert extract_letter("Reasoning...\nAnswer: C", "ABCD") == "C"
    assert extract_letter("answer: (b)", "ABCD") == "B"
    assert extract_letter("**Answer:** D", "ABCD") == "D"
    assert extract_letter("Answer: A\nWait, no.\nAnswer: B", "ABCD") == "B"  # the last one
    assert extract_letter("The answer is C", "ABCD") is None  # no 'Answer: X' line
    assert extract_letter("C", "ABCD") is None
    assert extract_letter("Answer: E", "ABCD") is None  # not an offered letter
    assert extract_letter("Answer: Because", "ABCD") is None  # a word, not a letter


def test_unparseable_counts_as_wrong_and_is_reported(tmp_path):
    suite = get_suite("medqa")
    items = suite.load(medqa_jsonl(tmp_path / "d.jsonl", n=2))
    samples = {0: [f"Answer: {items[0].reference}", "I am not sure"], 1: ["blah"]}
    r = suite.score(items, samples, ScoreContext())
    assert r.score == pytest.approx((1 / 2 + 0) / 2)
    assert r.metrics["unparseable"] == 2 and r.metrics["samples"] == 3
    assert r.metrics["unparseable_rate"] == pytest.approx(2 / 3)


def test_bad_mc_rows_name_file_line_and_key(tmp_path, capsys):
    data = tmp_path / "m.jsonl"
    data.write_text(json.dumps({"question": "q", "options": {"A": "x", "B": "y"}, "answer_idx": "C"}) + "\n")
    rows = write_responses(tmp_path / "r.jsonl", [(0, "Answer: A")])
    rc, _, err = run_cli(["score", "--suite", "medqa", "--data", data, "--responses", rows, "--out", tmp_path], capsys)
    assert rc == 2 and f"{data}:1: key 'answer_idx'" in err
    data = tmp_path / "g.csv"
    data.write_text("Question,Correct Answer\nq,a\n")
    rc, _, err = run_cli(["score", "--suite", "gpqa_diamond", "--data", data, "--responses", rows, "--out", tmp_path],
                         capsys)
    assert rc == 2 and f"{data}:2: key 'Incorrect Answer 1': missing" in err
    rc, _, err = run_cli(["score", "--suite", "gpqa_diamond", "--responses", rows], capsys)
    assert rc == 2 and "give --data" in err
