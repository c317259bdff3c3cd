"""``arena_hard``: Arena-Hard-Auto v0.1 (Li et al. 2024) as lmarena/arena-hard-auto ``gen_judgment.py`` and
``show_result.py`` score it.

- Every answer is compared with the baseline model's answer to the same question, twice: game 1 shows
  the baseline as assistant A, game 2 shows ours as A. Judge prompt: the repository's v0.1 system prompt
  and ``prompt_template`` verbatim (rise_nemo/evals/data/arena_hard_{system,template}.txt, Apache-2.0).
- The verdict is the last ``[[X]]`` (else ``[X]``) label of the upper-cased reply, X in A>>B, A>B, A=B,
  B>A, B>>A (``get_score``); a reply without one is retried, then unknown and the pair is dropped (as
  ``show_result.py`` drops null games).
- Each game is turned into "battles" from our side: a slight win 1, a tie 0.5, a slight loss 0, and a
  significant win / loss counts three times (``weight=3``). Win rate = mean over all battles; its 90%
  bootstrap interval (5th / 95th percentiles of resampled battles, as ``show_result.py``) and std.
- The shipped fixture (8 v0.1 questions) carries the v0.1 baseline, gpt-4-0314's answers from the
  repository; a full ``question.jsonl`` needs ``--baseline`` (a responses JSONL, or the repository's
  ``model_answer/<model>.jsonl``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rise_nemo.errors import UserError
from rise_nemo.evals.base import (
    EvalItem,
    PairwiseSuite,
    ScoreContext,
    SuiteResult,
    packaged_data,
    read_jsonl_rows,
    require,
)
from rise_nemo.evals.judge import field_between, judge_pairs, length_preference

PROMPT_VERSION = "arena-hard-v0.1-196f6b8"  # lmarena/arena-hard-auto @ 196f6b826783, judge_utils + config
WEIGHT = 3
# from our side in the game where we are assistant B (game 1); game 2 (we are A) mirrors the labels
_OURS_AS_B = {"A>>B": [0] * WEIGHT, "A>B": [0], "A=B": [0.5], "B=A": [0.5], "B>A": [1], "B>>A": [1] * WEIGHT,
              "A<<B": [1] * WEIGHT, "A<B": [1], "B<A": [0], "B<<A": [0] * WEIGHT}
_PATTERNS = (re.compile(r"\[\[([AB<>=]+)\]\]"), re.compile(r"\[([AB<>=]+)\]"))


def parse_label(reply: str) -> str:
    from rise_nemo.judges.grading import VerdictParseError

    for pattern in _PATTERNS:
        found = [m for m in pattern.findall(reply.upper()) if m]
        if found:
            if found[-1] not in _OURS_AS_B:
                raise VerdictParseError(f"verdict label {found[-1]!r} is not one of {sorted(_OURS_AS_B)}")
            return found[-1]
    raise VerdictParseError("no [[A>B]]-style verdict label in the reply")


def battles(game1: str, game2: str) -> list[float]:
    """Our battle scores from the two games (game 1: we are B; game 2: we are A)."""
    return _OURS_AS_B[game1] + [1 - s for s in _OURS_AS_B[game2]]


_RULE_LABEL = {2: "A>>B", 1: "A>B", 0: "A=B", -1: "B>A", -2: "B>>A"}


def rule_reply(prompt: str) -> str:
    a = field_between(prompt, "<|The Start of Assistant A's Answer|>\n", "\n<|The End of Assistant A's Answer|>")
    b = field_between(prompt, "<|The Start of Assistant B's Answer|>\n", "\n<|The End of Assistant B's Answer|>")
    return f"Rule judge (longer answer preferred). My final verdict is: [[{_RULE_LABEL[length_preference(a, b)]}]]"


def _model_answers(path) -> dict[str, str]:
    """uid -> answer text of an Arena-Hard-Auto ``model_answer`` file (``messages[-1].content.answer``)."""
    out = {}
    for where, row in read_jsonl_rows(path):
        try:
            content = row["messages"][-1]["content"]
            out[str(row["uid"])] = content["answer"] if isinstance(content, Mapping) else content
        except (KeyError, IndexError, TypeError):
            raise UserError(f"{where}: key 'messages': expected [..., {{'content': {{'answer': TEXT}}}}] "
                            "(an Arena-Hard-Auto model_answer row)") from None
    return out


class ArenaHard(PairwiseSuite):
    name = "arena_hard"
    headline = "win rate vs baseline"
    source = "Arena-Hard-Auto v0.1 (Li et al. 2024), lmarena/arena-hard-auto gen_judgment.py + show_result.py (Apache-2.0)"
    default_data = "arena_hard_v0.1_8.jsonl"

    def parse_row(self, row: Mapping[str, Any], where: str, index: int) -> EvalItem:
        prompt = require(row, "prompt", where)
        return EvalItem(index, str(require(row, "uid", where)), ({"role": "user", "content": prompt},), None,
                        str(row.get("cluster") or row.get("category") or "all"))

    def default_baseline(self, items: Sequence[EvalItem]) -> dict[int, list[str]] | None:
        """gpt-4-0314's answers (the v0.1 baseline) when every question is one of the shipped ones."""
        answers = _model_answers(packaged_data("arena_hard_v0.1_8_gpt-4-0314.jsonl"))
        if not all(it.item_id in answers for it in items):
            return None
        return {it.index: [answers[it.item_id]] for it in items}

    def read_baseline(self, path: str, items: Sequence[EvalItem], partial: bool) -> dict[int, list[str]]:
        """A responses JSONL, or the repository's ``model_answer/<model>.jsonl`` (rows with ``uid``)."""
        from pathlib import Path

        rows = read_jsonl_rows(Path(path))
        if rows and isinstance(rows[0][1], Mapping) and "uid" in rows[0][1]:
            answers = _model_answers(Path(path))
            missing = [it.item_id for it in items if it.item_id not in answers]
            if missing:
                raise UserError(f"{path}: no baseline answer for uid {missing[0]} ({len(missing)} questions missing)")
            return {it.index: [answers[it.item_id]] for it in items}
        return super().read_baseline(path, items, partial)

    def reference_response(self, item: EvalItem) -> str:
        raise NotImplementedError("arena_hard has no reference answers")

    def score(self, items: Sequence[EvalItem], samples: Mapping[int, list[str]], ctx: ScoreContext) -> SuiteResult:
        from rise_nemo.core.metrics import bootstrap_mean

        system = packaged_data("arena_hard_system.txt").read_text(encoding="utf-8")
        template = packaged_data("arena_hard_template.txt").read_text(encoding="utf-8")

        def messages(item: EvalItem, a: str, b: str) -> list[dict[str, str]]:
            user = template.format(QUESTION=item.messages[0]["content"], ANSWER_A=a, ANSWER_B=b)
            return [{"role": "system", "content": system}, {"role": "user", "content": user}]

        games = judge_pairs(ctx.judge, items, samples, ctx.baseline or {}, messages, parse_label, ctx.progress,
                            self.name)
        scores, per_item, dropped = [], [], 0
        for i, s, g1, g2 in games:
            if g1 is None or g2 is None:
                dropped += 1
                per_item.append({"index": i, "sample": s, "games": [g1, g2], "battles": None})
                continue
            b = battles(g1, g2)
            scores += b
            per_item.append({"index": i, "sample": s, "games": [g1, g2], "battles": b})
        if not scores:
            raise UserError("arena_hard: no pair could be judged (every judge reply was unusable)")
        boot = bootstrap_mean(scores, resamples=ctx.bootstrap, seed=ctx.seed, level=0.90)
        metrics = {"win_rate": boot["mean"], "ci90_lo": boot["lo"], "ci90_hi": boot["hi"], "bootstrap_std": boot["std"],
                   "battles": len(scores), "pairs": len(games) - dropped, "dropped_pairs": dropped}
        return SuiteResult(self.name, len({i for i, *_ in games}), boot["mean"], self.headline, metrics,
                           judge=ctx.judge.describe(PROMPT_VERSION), per_item=per_item)
