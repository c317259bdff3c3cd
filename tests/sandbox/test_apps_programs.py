"""The shipped APPS problems under the sandboxed code reward: human solutions pass (the fifth only with the
harness preamble), and every problem's tests fail trivially wrong programs."""

from __future__ import annotations

import json

import pytest

from rise_nemo.data.reasoning import load_reasoning_problems
from rise_nemo.data.samples import apps_mapcoder_path, apps_solutions_path
from rise_nemo.judges.code_verifier import CodeVerifier, parse_tests


def _problems(path):
    return load_reasoning_problems(path, "apps").problems


def test_human_solutions_pass_with_the_preamble(verifier, sandbox):
    problems = _problems(apps_solutions_path())
    results = verifier.grade([p.reference_solution for p in problems], [parse_tests(p.answer) for p in problems])
    assert [(p.prompt_id, r.outcome) for p, r in zip(problems, results)] == [
        (p.prompt_id, "passed") for p in problems]
    bare = CodeVerifier(per_test_seconds=3.0, total_seconds=8.0, workers=2, preamble=False, sandbox=sandbox)
    try:
        results = bare.grade([p.reference_solution for p in problems], [parse_tests(p.answer) for p in problems])
    finally:
        bare.close()
    failing = {p.prompt_id: r for p, r in zip(problems, results) if r.outcome != "passed"}
    assert list(failing) == ["apps-2404"] and "List" in failing["apps-2404"].reason  # from typing import List


def _wrong_programs(fn_name: str | None) -> list[str]:
    if fn_name:
        return [f"def {fn_name}(*args):\n    return None",
                f"def {fn_name}(*args):\n    return 0",
                f"class Solution:\n    def {fn_name}(self, *args):\n        return ''"]
    return ["pass", "print(0)", "print(input())"]


@pytest.mark.parametrize("path", [apps_solutions_path(), apps_mapcoder_path()], ids=["original", "mapcoder"])
def test_every_problem_fails_trivially_wrong_programs(verifier, path):
    problems = _problems(path)
    responses, specs, owners = [], [], []
    for p in problems:
        tests = parse_tests(p.answer)
        for code in _wrong_programs(tests.fn_name):
            responses.append(f"```python\n{code}\n```")
            specs.append(tests)
            owners.append(p.prompt_id)
    results = verifier.grade(responses, specs)
    passed = [(pid, r.outcome) for pid, r in zip(owners, results) if r.reward != 0.0]
    assert passed == []
    assert all(r.outcome in ("wrong_answer", "runtime_error") for r in results)


def test_original_layout_rows_give_the_tests_verbatim():
    raw = [json.loads(line) for line in apps_solutions_path().read_text().splitlines()]
    for row, p in zip(raw, _problems(apps_solutions_path())):
        io = json.loads(row["input_output"])
        tests = parse_tests(p.answer)
        assert tests.inputs == io["inputs"] and tests.outputs == io["outputs"]
        assert tests.fn_name == io.get("fn_name")
