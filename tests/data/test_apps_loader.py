"""APPS loader (rise_nemo.data.apps through load_reasoning_problems): both layouts, prompts, file:line errors."""

from __future__ import annotations

import json

import pytest

from rise_nemo.core.rubric import RubricError
from rise_nemo.data.reasoning import load_reasoning_problems
from rise_nemo.data.samples import apps_mapcoder_path, apps_solutions_path
from rise_nemo.judges.code_verifier import parse_tests


def test_original_layout():
    problems = load_reasoning_problems(apps_solutions_path()).problems  # auto-detected
    assert [p.prompt_id for p in problems] == ["apps-1", "apps-111", "apps-2287", "apps-2404", "apps-4184"]
    assert [p.difficulty for p in problems] == [1, 1, 2, 0, 0]
    fns = [parse_tests(p.answer).fn_name for p in problems]
    assert fns == [None, None, None, "findKthPositive", "is_prime"]
    for p in problems:
        assert p.reference_solution.startswith("```python\n") and p.reference_solution.endswith("\n```")
    prompt = problems[3].messages[0]["content"]
    assert prompt.startswith("QUESTION:\n") and "class Solution:" in prompt and "Use Call-Based format" in prompt
    assert "Use Standard Input format" in problems[0].messages[0]["content"]


def test_mapcoder_layout():
    problems = load_reasoning_problems(apps_mapcoder_path(), "apps").problems
    assert len(problems) == 12 and sorted(p.difficulty for p in problems) == [0] * 4 + [1] * 4 + [2] * 4
    by_id = {p.prompt_id: parse_tests(p.answer) for p in problems}
    assert all(p.reference_solution == "" for p in problems)
    # call-based: one argument per line, literals parsed, bare strings kept, defaults allowed
    assert by_id["apps-1617"].fn_name == "converter" and by_id["apps-1617"].inputs[:3] == [[13], [10], [13, 3]]
    # a multi-line string first argument (more lines than parameters)
    assert by_id["apps-1613"].inputs[1] == ["a #b\nc\nd $e f g", ["#", "$"]]
    assert by_id["apps-1613"].outputs[1] == ["a\nc\nd"]
    stdin = [t for t in by_id.values() if t.fn_name is None]
    assert len(stdin) == 4 and all(isinstance(o, str) for t in stdin for o in t.outputs)


def _write(tmp_path, rows):
    path = tmp_path / "apps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = {"problem_id": 7, "question": "Add two numbers.", "input_output": json.dumps(
    {"inputs": ["1 2\n"], "outputs": ["3\n"]}), "solutions": json.dumps(["print(sum(map(int, input().split())))"]),
    "difficulty": "introductory", "starter_code": ""}


@pytest.mark.parametrize("change, message", [
    ({"input_output": "{oops"}, "apps.jsonl:2: key 'input_output': not valid JSON"),
    ({"input_output": json.dumps({"inputs": ["1"], "outputs": []})}, "apps.jsonl:2: key 'input_output': 1 inputs"),
    ({"question": ""}, "apps.jsonl:2: key 'question': expected a non-empty string"),
    ({"difficulty": "hard"}, "apps.jsonl:2: key 'difficulty': expected one of"),
    ({"solutions": "[1, 2]"}, "apps.jsonl:2: key 'solutions': expected a JSON list of program strings"),
    ({"input_output": json.dumps({"inputs": ["1"], "outputs": ["1"], "fn_name": "f"})},
     "apps.jsonl:2: key 'input_output': call-based inputs must be argument lists"),
])
def test_original_layout_errors_name_file_line_and_key(tmp_path, change, message):
    path = _write(tmp_path, [GOOD, {**GOOD, "problem_id": 8, **change}])
    with pytest.raises(RubricError) as err:
        load_reasoning_problems(path, "apps")
    assert message in str(err.value)
    loaded = load_reasoning_problems(path, "apps", skip_invalid=True)
    assert [p.prompt_id for p in loaded.problems] == ["apps-7"] and loaded.skipped[0].where.endswith("apps.jsonl:2")


def test_mapcoder_layout_errors(tmp_path):
    row = {"id": 1, "description": "d", "difficulty": "interview", "starter_code": "\nclass X:\n  pass\n",
           "test_list": [{"input": "1", "output": [1]}]}
    with pytest.raises(RubricError, match=r"apps.jsonl:1: key 'starter_code': call-based row .* no 'def name\('"):
        load_reasoning_problems(_write(tmp_path, [row]), "apps")
    row = {**row, "starter_code": "", "test_list": [{"input": "1"}]}
    with pytest.raises(RubricError, match=r"apps.jsonl:1: key 'test_list\[0\]': expected an object with"):
        load_reasoning_problems(_write(tmp_path, [row]), "apps")
