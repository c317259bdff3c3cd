"""Math suites: ``aime`` (integer answers), ``math500`` and ``gsm8k`` (math-verify), scored by avg@k and
unbiased pass@k (rise_nemo.core.metrics.pass_at_k, Chen et al. 2021, eq. 1).

Rows are read by the project's reasoning loaders (rise_nemo.data.reasoning: MATH rows ``problem``,
``solution``, ``answer``; GSM8K rows ``question``, ``answer`` ending ``#### N``), so the prompt is
``MATH_PROMPT`` (NeMo-RL's math prompt: the answer in ``\\boxed{}``). ``aime`` and ``math500`` also read
answer-only rows (``problem`` or ``question``, ``answer``: the AIME 2025/2026, HMMT and IMO-AnswerBench
releases).

- ``aime``: the response's last ``\\boxed{}`` (else its last integer) compared as an integer with the answer
  ("025" == 25); a non-integer or missing answer is wrong.
- ``math500`` / ``gsm8k``: ``rise_nemo.judges.verifiers.MathVerifier`` (math-verify, as NeMo-RL's math
  environment); an answer math-verify cannot decide counts as wrong and is reported as ``undecided``.

Headline: pass@1 = avg@k = mean over problems of c_i / n_i (n_i samples of problem i, c_i correct).
``pass@k`` for k = 1, 2, 4, ... up to the smallest n_i; a breakdown by MATH level where rows carry one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rise_nemo.evals.base import EvalItem, ScoreContext, Suite, SuiteResult, pass_table, require

_INT = re.compile(r"-?\d[\d,]*")


class MathSuite(Suite):
    fmt = "math"
    headline = "pass@1"

    def __init__(self) -> None:
        self._verifier: Any = None

    def parse_row(self, row: Mapping[str, Any], where: str, index: int) -> EvalItem:
        from rise_nemo.data.reasoning import MATH_PROMPT, parse_reasoning_record

        if self.fmt == "math" and "solution" not in row:
            # Answer-only rows (AIME 2025/2026, HMMT, IMO-AnswerBench releases): problem (or question) + answer.
            key = "problem" if "problem" in row else "question"
            problem = require(row, key, where)
            answer = require(row, "answer", where, (str, int))
            item_id = str(row.get("id") or row.get("unique_id") or f"{self.name}-{index}")
            return EvalItem(index, item_id, ({"role": "user", "content": MATH_PROMPT.format(problem.strip())},),
                            str(answer).strip(), None)
        p = parse_reasoning_record(row, where, self.fmt, default_id=f"{self.name}-{index}")
        group = f"level {p.difficulty}" if p.difficulty is not None else None
        return EvalItem(index, p.prompt_id, tuple(p.messages), p.answer, group)

    def reference_response(self, item: EvalItem) -> str:
        return f"The final answer is \\boxed{{{item.reference}}}."

    math_verify = True  # answers checked with MathVerifier (AIME: integer match)

    def check(self, judge_urls: Sequence[str] | None) -> None:
        if self.math_verify:
            from rise_nemo.errors import require_extra

            require_extra("math", "math_verify", what=f"suite {self.name} (MathVerifier checks its answers)")

    def correct(self, answer: str, response: str) -> bool | None:
        if self._verifier is None:
            from rise_nemo.errors import UserError
            from rise_nemo.judges.verifiers import MathVerifier

            try:
                self._verifier = MathVerifier()
            except ImportError as exc:
                raise UserError(f"suite {self.name}: {exc}") from None
        return self._verifier.verify_one(answer, response)

    def score(self, items: Sequence[EvalItem], samples: Mapping[int, list[str]], ctx: ScoreContext) -> SuiteResult:
        counts, per_item, undecided = [], [], 0
        groups: dict[str, list[tuple[int, int]]] = {}
        for item in items:
            if item.index not in samples:
                continue
            verdicts = [self.correct(item.reference, r) for r in samples[item.index]]
            undecided += sum(v is None for v in verdicts)
            n, c = len(verdicts), sum(v is True for v in verdicts)
            counts.append((n, c))
            if item.group is not None:
                groups.setdefault(item.group, []).append((n, c))
            per_item.append({"index": item.index, "id": item.item_id, "answer": item.reference, "samples": n,
                             "correct": c, "verdicts": verdicts})
        table = pass_table(counts)
        ns = {n for n, _ in counts}
        metrics: dict[str, Any] = {f"avg@{next(iter(ns))}" if len(ns) == 1 else "avg@n": table["pass@1"], **table,
                                   "samples": sum(n for n, _ in counts), "undecided": undecided}
        breakdown = {g: {**pass_table(c), "n": len(c)} for g, c in sorted(groups.items())}
        return SuiteResult(self.name, len(counts), table["pass@1"], self.headline, metrics, breakdown,
                           per_item=per_item)


class Math500(MathSuite):
    name = "math500"
    source = "MATH-500 (Lightman et al. 2023, 'Let's Verify Step by Step'; Hendrycks et al. 2021 MATH, MIT)"
    default_data = "math500_8.jsonl"


class GSM8K(MathSuite):
    name = "gsm8k"
    fmt = "gsm8k"
    source = "GSM8K test split (Cobbe et al. 2021, openai/grade-school-math, MIT)"
    default_data = "gsm8k_8.jsonl"


class AIME(MathSuite):
    name = "aime"
    source = "AIME 2024 I & II (MAA), rows of QwenLM/Qwen2.5-Math evaluation/data/aime24 (MIT)"
    default_data = "aime24_8.jsonl"
    math_verify = False

    def correct(self, answer: str, response: str) -> bool | None:
        return aime_correct(answer, response)


def aime_answer(response: str) -> int | None:
    """The integer a response states: its last ``\\boxed{}`` (must be an integer), else its last integer."""
    from rise_nemo.data.reasoning import extract_boxed

    try:
        boxed = extract_boxed(response)
    except ValueError:
        boxed = None
    if boxed is not None:
        text = boxed.strip().strip("$").replace(",", "").replace("{,}", "")
        return int(text) if re.fullmatch(r"-?\d+", text) else None
    found = _INT.findall(response)
    return int(found[-1].replace(",", "")) if found else None


def aime_correct(answer: str, response: str) -> bool:
    got = aime_answer(response)
    try:
        return got is not None and got == int(str(answer).strip())
    except ValueError:
        return False
