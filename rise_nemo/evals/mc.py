"""Multiple-choice suites: ``gpqa_diamond`` and ``medqa``.

Protocol (as simple-evals' GPQA eval, with our own prompt wording):
- options are shuffled with a seeded RNG per row (``random.Random(f"{seed}:{suite}:{index}")``), so the
  correct letter is spread evenly over A, B, C, ...; the same seed always gives the same prompts, and
  ``score`` must be run with the seed the responses were generated under (``--seed``, default 0);
- the prompt asks for a last line ``Answer: X``; extraction is strict: the LAST ``Answer: X`` in the
  response (``X`` one of the offered letters, optionally in parentheses or bold) is the answer; a response
  without one is unparseable, counted as wrong and reported as ``unparseable``;
- headline: accuracy = mean over questions of (correct samples / samples), with a breakdown by domain.

Formats: GPQA's public CSV / JSONL columns ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``
(optional ``High-level domain``); GPQA is not redistributable in plain text, so no rows ship: give the file
with ``--data``. MedQA (jind11/MedQA JSONL): ``question``, ``options`` ({"A": ..., ...} or a list),
``answer_idx`` (the letter; else ``answer``, the correct option's text), optional ``meta_info``.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from rise_nemo.errors import UserError
from rise_nemo.evals.base import EvalItem, ScoreContext, Suite, SuiteResult, pass_table, require

PROMPT_VERSION = "rise-mc-v1"
_PROMPT = ("Answer the following multiple choice question. The last line of your response must be of the form "
           "'Answer: X' (without quotes) where X is one of {letters}. Think step by step before answering."
           "\n\n{question}\n\n{options}")
_ANSWER = re.compile(r"Answer\s*:\s*\**\s*\(?\s*([A-Z])\s*\)?(?![A-Za-z])", re.IGNORECASE)


def extract_letter(response: str, letters: str) -> str | None:
    """The letter of the response's last ``Answer: X`` (X in ``letters``); None when there is none."""
    found = [m.group(1).upper() for m in _ANSWER.finditer(response)]
    if not found or found[-1] not in letters:
        return None
    return found[-1]


def shuffled(options: Sequence[str], correct: int, seed: int, suite: str, index: int) -> tuple[list[str], int]:
    """(options in the seeded order of row ``index``, the new position of the correct one)."""
    order = list(range(len(options)))
    random.Random(f"{seed}:{suite}:{index}").shuffle(order)
    return [options[i] for i in order], order.index(correct)


class MultipleChoice(Suite):
    headline = "accuracy"

    def options(self, row: Mapping[str, Any], where: str) -> tuple[str, list[str], int, str | None]:
        """(question, options, index of the correct option, group) of one row."""
        raise NotImplementedError

    def parse_row(self, row: Mapping[str, Any], where: str, index: int) -> EvalItem:
        question, opts, correct, group = self.options(row, where)
        opts, correct = shuffled(opts, correct, self.seed, self.name, index)
        letters = string.ascii_uppercase[:len(opts)]
        text = _PROMPT.format(letters=", ".join(letters), question=question.strip(),
                              options="\n".join(f"{c}) {o.strip()}" for c, o in zip(letters, opts)))
        return EvalItem(index, str(row.get("Record ID") or row.get("id") or f"{self.name}-{index}"),
                        ({"role": "user", "content": text},), letters[correct], group,
                        {"letters": letters, "seed": self.seed})

    def reference_response(self, item: EvalItem) -> str:
        return f"Answer: {item.reference}"

    def score(self, items: Sequence[EvalItem], samples: Mapping[int, list[str]], ctx: ScoreContext) -> SuiteResult:
        counts, per_item, unparseable, total = [], [], 0, 0
        groups: dict[str, list[tuple[int, int]]] = {}
        for item in items:
            if item.index not in samples:
                continue
            got = [extract_letter(r, item.extra["letters"]) for r in samples[item.index]]
            unparseable += sum(g is None for g in got)
            total += len(got)
            n, c = len(got), sum(g == item.reference for g in got)
            counts.append((n, c))
            groups.setdefault(item.group or "all", []).append((n, c))
            per_item.append({"index": item.index, "id": item.item_id, "answer": item.reference, "extracted": got,
                             "correct": c, "samples": n})
        table = pass_table(counts)
        metrics: dict[str, Any] = {"accuracy": table["pass@1"], **table, "samples": total, "unparseable": unparseable,
                                   "unparseable_rate": unparseable / total, "chance": 1 / len(items[0].extra["letters"])}
        breakdown = {g: {"accuracy": pass_table(c)["pass@1"], "n": len(c)} for g, c in sorted(groups.items())}
        return SuiteResult(self.name, len(counts), table["pass@1"], self.headline, metrics, breakdown,
                           per_item=per_item, info={"shuffle_seed": self.seed, "prompt_version": PROMPT_VERSION})


class GPQADiamond(MultipleChoice):
    name = "gpqa_diamond"
    source = "GPQA Diamond (Rein et al. 2023), 198 questions; protocol of openai/simple-evals gpqa_eval.py"

    def options(self, row, where):
        question = require(row, "Question", where)
        opts = [require(row, "Correct Answer", where)] + [require(row, f"Incorrect Answer {k}", where)
                                                          for k in (1, 2, 3)]
        return question, [str(o) for o in opts], 0, row.get("High-level domain")


class MedQA(MultipleChoice):
    name = "medqa"
    source = "MedQA USMLE (Jin et al. 2021, jind11/MedQA), 4-option test split (1,273 questions)"

    def options(self, row, where):
        question = require(row, "question", where)
        raw = require(row, "options", where, (dict, list))
        if isinstance(raw, dict):
            keys = sorted(raw)
            opts = [raw[k] for k in keys]
        else:
            keys, opts = list(string.ascii_uppercase[:len(raw)]), list(raw)
        if len(opts) < 2 or not all(isinstance(o, str) and o.strip() for o in opts):
            raise UserError(f"{where}: key 'options': expected at least two non-empty option texts")
        if row.get("answer_idx") is not None:
            letter = str(row["answer_idx"]).strip().upper()
            if letter not in keys:
                raise UserError(f"{where}: key 'answer_idx': {letter!r} is not one of the options {keys}")
            correct = keys.index(letter)
        else:
            answer = require(row, "answer", where)
            if answer not in opts:
                raise UserError(f"{where}: key 'answer': not one of the options' texts")
            correct = opts.index(answer)
        return question, opts, correct, row.get("meta_info")
