"""Verifiable reasoning datasets -> ``ReasoningProblem``: one entry point, ``load_reasoning_problems``.

Formats (``fmt``; "auto" detects the format of every record from its keys):
  math       Hendrycks MATH rows: ``problem``, ``solution`` (the answer is the solution's last ``\\boxed{...}``,
             nested braces included), optional ``level`` ("Level 3" -> difficulty 3), ``type``, ``unique_id``;
             an explicit ``answer`` (MATH-500 rows carry one) wins over the boxed one.
  gsm8k      GSM8K rows: ``question``, ``answer`` (a worked solution whose last line is ``#### <number>``).
  reasoning  our own JSONL: ``prompt`` (a string or chat messages), ``reference_solution``, ``answer``,
             optional ``difficulty`` (int >= 0) and ``prompt_id``.
  apps       APPS code problems, original or MapCoder layout (rise_nemo.data.apps): ``answer`` is the
             tests' JSON, graded by rise_nemo.judges.code_verifier.CodeVerifier in a sandbox.
  hh_rlhf    Anthropic HH-RLHF pairs (``chosen``, ``rejected``; rise_nemo.data.hh_rlhf): the dialogue up to the
             last "Assistant:" is the problem, the CHOSEN reply its reference solution (RRL's canonical
             solution, whose states RRL replays), ``answer`` empty (no final answer: a reward model scores
             these, rise_nemo.steps.reward_model); the rejected reply is not used for training.

MATH and GSM8K questions are wrapped in ``MATH_PROMPT`` (NeMo-RL's examples/prompts/math.txt, so answers are
boxed the way ``MathVerifier`` reads them); our own rows are shown exactly as written. GSM8K reference
solutions lose their calculator annotations (``<<48/2=24>>``) and end with ``\\boxed{<answer>}`` instead of
``#### <answer>``, so a reference solution reads like a response the policy is asked to produce.

Files and errors are those of the rubric loaders (``rise_nemo.data.loaders.read_records``): JSONL or
parquet, every bad record raises ``RubricError`` naming ``file:line`` and the key, or with
``skip_invalid=True`` is skipped and listed in ``LoadedProblems.skipped``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.core.rubric import RubricError
from rise_nemo.data.apps import is_apps_record, parse_apps_record
from rise_nemo.data.hh_rlhf import parse_hh_record
from rise_nemo.data.loaders import Skipped, _err, _parse_messages, _prompt_id, _require, read_records
from rise_nemo.data.loaders import _require_text as _text

__all__ = [
    "REASONING_FORMATS",
    "MATH_PROMPT",
    "LoadedProblems",
    "extract_boxed",
    "gsm8k_final_answer",
    "load_reasoning_problems",
    "parse_reasoning_record",
]

REASONING_FORMATS = ("auto", "math", "gsm8k", "reasoning", "apps", "hh_rlhf")
MATH_PROMPT = "Solve the following math problem. Make sure to put the answer (and only answer) inside \\boxed{{}}.\n\n{}"

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed ([^\s$]+)")  # "\boxed 5" (no braces), as hendrycks' last_boxed_only_string
_CALCULATOR = re.compile(r"<<[^<>]*>>")
_LEVEL = re.compile(r"level\s*(\d+)", re.IGNORECASE)


class LoadedProblems(NamedTuple):
    problems: list[ReasoningProblem]
    skipped: list[Skipped]


def extract_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces matched to any depth.

    ``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``. None when there is no boxed answer; ValueError when the
    last one never closes (a truncated solution must not yield a half answer).
    """
    starts = list(_BOXED.finditer(text))
    if not starts:
        bare = _BOXED_BARE.findall(text)
        return bare[-1] if bare else None
    open_at = starts[-1].end()  # just after the "{"
    depth = 1
    i = open_at
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):  # \{ and \} are literal braces, not grouping
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at:i].strip()
        i += 1
    raise ValueError(f"unbalanced braces in {text[starts[-1].start():][:60]!r}")


_GSM8K_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")  # 18, -3, 1000 (after "1,000"), 2.5


def gsm8k_final_answer(solution: str) -> tuple[str, str]:
    """GSM8K ``answer`` field -> (worked steps without calculator annotations, final answer).

    The final answer is what follows the last ``####``, with thousands separators removed ("1,000" ->
    "1000"); ValueError when there is no ``####`` line, nothing after it, or not a number there (every GSM8K
    answer is one; ``#### seven`` would otherwise become a reference no verifier can match).
    """
    steps, sep, tail = solution.rpartition("####")
    if not sep:
        raise ValueError("no '#### <answer>' line")
    answer = tail.strip().replace(",", "")
    if not answer:
        raise ValueError("nothing after '####'")
    if not _GSM8K_NUMBER.fullmatch(answer):
        raise ValueError(f"the answer after '####' must be a number, got {answer[:40]!r}")
    return _CALCULATOR.sub("", steps).strip(), answer


def _answer(value: Any, where: str, key: str) -> str:
    """An answer as text: strings as given (stripped), numbers in their shortest form (3.0 -> "3")."""
    if isinstance(value, bool) or value is None:
        raise _err(where, key, f"expected a string or a number, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise _err(where, key, f"expected a non-empty string or a number, got {value!r}"[:200])


def _difficulty(value: Any, where: str, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _err(where, key, f"expected an integer >= 0, got {value!r}")
    return value


def _math_level(value: Any) -> int | None:
    """MATH's ``level`` ("Level 1".."Level 5"; a few rows say "Level ?") -> 1..5 or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _LEVEL.search(str(value or ""))
    return int(match.group(1)) if match else None


def _user(question: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": MATH_PROMPT.format(question.strip())},)


def _math(row: Mapping, where: str, default_id: str) -> ReasoningProblem:
    problem = _text(row, "problem", where)
    solution = _text(row, "solution", where)
    try:
        boxed = extract_boxed(solution)
    except ValueError as exc:
        raise _err(where, "solution", str(exc)) from None
    if row.get("answer") is not None:
        answer = _answer(row["answer"], where, "answer")
    elif boxed:
        answer = boxed
    else:
        raise _err(where, "solution", "no \\boxed{...} answer found (and no 'answer' key)")
    pid = _prompt_id(row, ("prompt_id", "unique_id", "id"), default_id)
    return ReasoningProblem(pid, _user(problem), solution.strip(), answer, _math_level(row.get("level")))


def _gsm8k(row: Mapping, where: str, default_id: str) -> ReasoningProblem:
    question = _text(row, "question", where)
    try:
        steps, answer = gsm8k_final_answer(_text(row, "answer", where))
    except ValueError as exc:
        raise _err(where, "answer", str(exc)) from None
    reference = f"{steps}\nThe final answer is \\boxed{{{answer}}}."
    pid = _prompt_id(row, ("prompt_id", "id"), default_id)
    return ReasoningProblem(pid, _user(question), reference, answer, None)


def _reasoning(row: Mapping, where: str, default_id: str) -> ReasoningProblem:
    messages = _parse_messages(_require(row, "prompt", where), where, "prompt")
    reference = _text(row, "reference_solution", where)
    answer = _answer(_require(row, "answer", where), where, "answer")
    difficulty = _difficulty(row.get("difficulty"), where, "difficulty")
    pid = _prompt_id(row, ("prompt_id", "id"), default_id)
    return ReasoningProblem(pid, messages, reference, answer, difficulty)


def _hh(row: Mapping, where: str, default_id: str) -> ReasoningProblem:
    pair = parse_hh_record(row, where, default_id)
    return ReasoningProblem(pair.prompt_id, pair.messages, pair.chosen, "")


_PARSERS = {"math": _math, "gsm8k": _gsm8k, "reasoning": _reasoning, "apps": parse_apps_record, "hh_rlhf": _hh}


def _detect(row: Mapping, where: str) -> str:
    if is_apps_record(row):
        return "apps"
    if "chosen" in row and "rejected" in row:
        return "hh_rlhf"
    if "problem" in row and "solution" in row:
        return "math"
    if "question" in row and "answer" in row:
        return "gsm8k"
    if "prompt" in row and ("reference_solution" in row or "answer" in row):
        return "reasoning"
    raise RubricError(
        f"{where}: cannot tell the record's format from its keys {sorted(row)[:12]}; expected math "
        "(problem, solution), gsm8k (question, answer), reasoning (prompt, reference_solution, answer) or apps "
        "(question, input_output / description, test_list) or hh_rlhf (chosen, rejected)"
    )


def parse_reasoning_record(row: Any, where: str, fmt: str = "auto", default_id: str = "") -> ReasoningProblem:
    """One record -> ReasoningProblem, or RubricError naming ``where`` and the key."""
    if not isinstance(row, Mapping):
        raise RubricError(f"{where}: expected a JSON object per record, got {type(row).__name__}")
    kind = _detect(row, where) if fmt == "auto" else fmt
    return _PARSERS[kind](row, where, default_id or where)


def load_reasoning_problems(path: str | Path, fmt: str = "auto", skip_invalid: bool = False) -> LoadedProblems:
    """Load verifiable reasoning problems from a JSONL or parquet file (formats in the module docstring).

    Returns ``LoadedProblems(problems, skipped)``; records without an id get ``<file stem>-<line>``.
    """
    if fmt not in REASONING_FORMATS:
        raise ValueError(f"fmt must be one of {REASONING_FORMATS}, got {fmt!r}")

    def parse(row: Any, where: str, default_id: str) -> ReasoningProblem:
        return parse_reasoning_record(row, where, fmt, default_id=default_id)

    problems, skipped = read_records(path, parse, skip_invalid, "reasoning problems")
    return LoadedProblems(problems, skipped)
