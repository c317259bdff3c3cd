"""APPS code problems (Hendrycks et al. 2021) -> ``ReasoningProblem`` whose ``answer`` is the tests' JSON.

Read through ``rise_nemo.data.reasoning.load_reasoning_problems`` (format ``apps``; ``auto`` detects both
layouts), so files, ``file:line`` errors and ``skip_invalid`` are those of every other loader. Two layouts:
  original   the APPS / Hugging Face ``codeparrot/apps`` fields: ``question``, ``input_output`` (JSON text or
             object: ``inputs``, ``outputs``, optional ``fn_name`` for call-based problems), optional
             ``solutions`` (JSON list of human programs, text or list), ``starter_code``, ``difficulty``,
             ``problem_id``;
  mapcoder   MapCoder's re-formatting (data/APPS/selected150.jsonl): ``description``, ``test_list``
             [{input, output}], ``starter_code``, ``difficulty``, ``id``. Call-based rows (non-empty starter
             code) give each argument on its own input line as a Python literal, or as bare text for a string
             ("aacb\\naabc" -> ["aacb", "aabc"]); the function name is the starter code's ``def``. Where
             there are more lines than the function has parameters, the leading lines are one multi-line
             string argument (MapCoder's "a #b\\nc\\n['#']" for ``solution(string, markers)``).
The policy sees APPS's prompt (question, starter code, "Use Standard Input format" / "Use Call-Based
format") and is asked for one ```python block. ``reference_solution`` is the first human solution as such a
block ("" when the row has none); ``answer`` is ``CodeTests.to_json()`` (rise_nemo.core.code_tests);
``difficulty`` is 0 introductory, 1 interview, 2 competition.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from rise_nemo.core.code_tests import CodeTests, parse_tests
from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.data.loaders import _err, _prompt_id, _require
from rise_nemo.data.loaders import _require_text as _text

__all__ = ["APPS_DIFFICULTIES", "apps_prompt", "is_apps_record", "parse_apps_record"]

APPS_DIFFICULTIES = {"introductory": 0, "interview": 1, "competition": 2}
_DEF = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def apps_prompt(question: str, starter_code: str, call_based: bool) -> str:
    """APPS's generation prompt (QUESTION / starter code / format line / ANSWER), asking for a python block."""
    parts = ["QUESTION:", question.strip()]
    if starter_code.strip():
        parts.append(starter_code.rstrip())
    parts.append("Use Call-Based format" if call_based else "Use Standard Input format")
    parts.append("Write the complete solution in Python 3 in a single ```python code block.\nANSWER:")
    return "\n".join(parts)


def is_apps_record(row: Mapping) -> bool:
    return ("question" in row and "input_output" in row) or ("description" in row and "test_list" in row)


def parse_apps_record(row: Mapping, where: str, default_id: str) -> ReasoningProblem:
    if "input_output" in row:
        question = _text(row, "question", where)
        tests = _original_tests(row, where)
        solutions = _solutions(row.get("solutions"), where)
        pid = _prompt_id(row, ("problem_id", "prompt_id", "id"), default_id)
    else:
        question = _text(row, "description", where)
        tests = _mapcoder_tests(row, where)
        solutions = []
        pid = _prompt_id(row, ("id", "prompt_id", "name"), default_id)
    starter = row.get("starter_code") or ""
    if not isinstance(starter, str):
        raise _err(where, "starter_code", f"expected a string, got {type(starter).__name__}")
    difficulty = row.get("difficulty")
    if difficulty is not None and difficulty not in APPS_DIFFICULTIES:
        raise _err(where, "difficulty", f"expected one of {sorted(APPS_DIFFICULTIES)}, got {difficulty!r}")
    messages = ({"role": "user", "content": apps_prompt(question, starter, tests.fn_name is not None)},)
    reference = f"```python\n{solutions[0].strip()}\n```" if solutions else ""
    return ReasoningProblem(f"apps-{pid}", messages, reference, tests.to_json(),
                            APPS_DIFFICULTIES.get(difficulty) if difficulty else None)


def _json_field(row: Mapping, key: str, where: str) -> Any:
    value = _require(row, key, where)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise _err(where, key, f"not valid JSON ({exc.msg} at char {exc.pos})") from None
    return value


def _original_tests(row: Mapping, where: str) -> CodeTests:
    try:
        return parse_tests(_json_field(row, "input_output", where))
    except ValueError as exc:
        raise _err(where, "input_output", str(exc).removeprefix("input_output: ")) from None


def _solutions(raw: Any, where: str) -> list[str]:
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _err(where, "solutions", f"not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise _err(where, "solutions", "expected a JSON list of program strings")
    return [s for s in raw if s.strip()]


def _literal(line: str) -> Any:
    try:
        return ast.literal_eval(line)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return line  # MapCoder writes string arguments bare


def _param_count(starter: str) -> int | None:
    """Parameters of the starter code's first function (None when it does not parse)."""
    try:
        tree = ast.parse(starter.strip() + "\n    pass")
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            return len(node.args.args) + len(node.args.kwonlyargs)
    return None


def _mapcoder_tests(row: Mapping, where: str) -> CodeTests:
    tests = _require(row, "test_list", where)
    if not isinstance(tests, list) or not tests:
        raise _err(where, "test_list", "expected a non-empty list of {input, output} objects")
    starter = row.get("starter_code") or ""
    fn, n_params = None, None
    if isinstance(starter, str) and starter.strip():
        names = _DEF.findall(starter)
        if not names:
            raise _err(where, "starter_code", "call-based row (starter code given) but no 'def name(' in it")
        fn, n_params = names[0], _param_count(starter)
    inputs, outputs = [], []
    for i, test in enumerate(tests):
        key = f"test_list[{i}]"
        if not isinstance(test, Mapping) or "input" not in test or "output" not in test:
            raise _err(where, key, "expected an object with 'input' and 'output'")
        raw_in, raw_out = test["input"], test["output"]
        if not isinstance(raw_in, str):
            raise _err(where, f"{key}.input", f"expected a string, got {type(raw_in).__name__}")
        if fn:
            lines = raw_in.split("\n")
            if n_params and len(lines) > n_params:  # a multi-line string first argument
                head = len(lines) - n_params + 1
                lines = ["\n".join(lines[:head])] + lines[head:]
                inputs.append([lines[0]] + [_literal(line) for line in lines[1:]])
            else:
                inputs.append([_literal(line) for line in lines])
            outputs.append(raw_out)
        else:
            if isinstance(raw_out, list) and len(raw_out) == 1:
                raw_out = raw_out[0]
            if not isinstance(raw_out, str):
                raise _err(where, f"{key}.output", f"expected the expected stdout text, got {raw_out!r}"[:200])
            inputs.append(raw_in)
            outputs.append(raw_out)
    return CodeTests(inputs, outputs, fn)
