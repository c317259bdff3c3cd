"""``writingbench``: WritingBench (Wu et al. 2025) scored as X-PLUG/WritingBench ``evaluate_benchmark.py`` and
``calculate_scores.py`` do.

- One judge call per checklist criterion (5 per query), with the repository's ``evaluate_system`` /
  ``evaluate_prompt`` verbatim (rise_nemo/evals/data/writingbench_{system,prompt}.txt, Apache-2.0); the
  criterion is inserted as the repository does (``str.format`` of the criterion's dict: its Python repr).
- The reply's first JSON object with ``score`` (an integer 1-10) and ``reason`` (text) is the grade
  (the repository's ``extract_score_json``; text before ``</think>`` is dropped); otherwise it is retried.
- Per query: the mean of its criteria's scores; overall: the mean over all criterion scores (1-10).
  The headline is that mean divided by 10 (in [0, 1]); a breakdown by ``domain1``.

Criteria the judge could not grade are left out and counted (``unknown``).
Data: 5 rows of the length-requirement subset ship in the package; the full ``benchmark_all.jsonl`` (or
any subset in the same format: ``index``, ``domain1``, ``query``, ``checklist``) by ``--data``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rise_nemo.errors import UserError
from rise_nemo.evals.base import EvalItem, ScoreContext, Suite, SuiteResult, packaged_data, require
from rise_nemo.evals.judge import JudgeCall, run_batched

PROMPT_VERSION = "writingbench-ae2d517"  # X-PLUG/WritingBench @ ae2d5176449b, prompt.py
BANDS = ("1-2", "3-4", "5-6", "7-8", "9-10")


def _templates() -> tuple[str, str]:
    return (packaged_data("writingbench_system.txt").read_text(encoding="utf-8"),
            packaged_data("writingbench_prompt.txt").read_text(encoding="utf-8"))


def strip_think(text: str) -> str:
    """The repository's ``process_gen_field`` for responses: drop a reasoning block ending "</think>\\n\\n"."""
    marker = "</think>\n\n"
    at = text.find(marker)
    return text[at + len(marker):] if at != -1 else text


def parse_score(reply: str) -> int:
    """The first JSON object with an integer ``score`` in 1..10 and a text ``reason``."""
    from rise_nemo.judges.grading import VerdictParseError

    if "</think>" in reply:
        reply = reply.split("</think>", 1)[1]
    decoder = json.JSONDecoder()
    at = reply.find("{")
    while at != -1:
        try:
            obj, _ = decoder.raw_decode(reply, at)
        except (json.JSONDecodeError, RecursionError):
            obj = None
        if isinstance(obj, dict) and "score" in obj and "reason" in obj:
            score = obj["score"]
            if isinstance(score, int) and not isinstance(score, bool) and 1 <= score <= 10 and isinstance(obj["reason"], str):
                return score
            raise VerdictParseError(f"score must be an integer 1-10 with a text reason, got {score!r}")
        at = reply.find("{", at + 1)
    raise VerdictParseError("no JSON object with 'score' and 'reason' in the reply")


_FIELD = re.compile(r"\*\* Criteria \*\*\n```(.*?)```\n\n\*\* Query \*\*\n```.*?```\n\n\*\* Response \*\*\n```(.*)```\n\n"
                    r"Provide your evaluation", re.DOTALL)


def rule_score(criterion_name: str, response: str) -> int:
    """The rule judge: 1 + 9 x the fraction of the criterion name's parts (split at spaces, '_', '-', '/',
    '&', ',') that occur in the response (case-insensitive), rounded half up."""
    parts = [p for p in re.split(r"[\s_\-/,&]+", criterion_name) if len(p) >= 2]
    if not parts:
        return 1
    low = response.lower()
    return 1 + int(9 * sum(p.lower() in low for p in parts) / len(parts) + 0.5)


def rule_reply(prompt: str) -> str:
    import ast

    m = _FIELD.search(prompt)
    if m is None:
        raise ValueError("not a WritingBench scoring prompt")
    try:
        name = ast.literal_eval(m.group(1)).get("name", "")
    except (ValueError, SyntaxError, AttributeError):
        raise ValueError("WritingBench prompt: the criteria field is not a criterion dict") from None
    return "```json\n" + json.dumps({"score": rule_score(str(name), m.group(2)), "reason": "rule judge"}) + "\n```"


class WritingBench(Suite):
    name = "writingbench"
    headline = "mean score / 10"
    source = "WritingBench (Wu et al. 2025), X-PLUG/WritingBench evaluate_benchmark.py + calculate_scores.py (Apache-2.0)"
    default_data = "writingbench_5.jsonl"
    judged = True

    def parse_row(self, row: Mapping[str, Any], where: str, index: int) -> EvalItem:
        query = require(row, "query", where)
        checklist = require(row, "checklist", where, list)
        if not checklist:
            raise UserError(f"{where}: key 'checklist': empty")
        for k, c in enumerate(checklist):
            if not isinstance(c, Mapping):
                raise UserError(f"{where}: key 'checklist': criterion {k} is not an object")
            for key in ("name", "criteria_description", *BANDS):
                require(c, key, f"{where}: checklist[{k}]")
        return EvalItem(index, str(row.get("index", index)), ({"role": "user", "content": query},),
                        list(checklist), str(row.get("domain1") or "all"))

    def reference_response(self, item: EvalItem) -> str:
        raise NotImplementedError("writingbench has no reference answers")

    def score(self, items: Sequence[EvalItem], samples: Mapping[int, list[str]], ctx: ScoreContext) -> SuiteResult:
        system, template = _templates()
        calls, where = [], []
        for item in items:
            query = item.messages[0]["content"]
            for s, response in enumerate(samples.get(item.index, [])):
                for c in item.reference:
                    user = template.format(query=query, response=strip_think(response), criteria=c)
                    calls.append(JudgeCall([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                           parse_score))
                    where.append((item.index, s, c["name"]))
        grades = run_batched(ctx.judge, calls, ctx.progress, "writingbench")
        per: dict[tuple[int, int], dict[str, Any]] = {}
        for (i, s, name), g in zip(where, grades):
            per.setdefault((i, s), {})[name] = g
        by_index = {it.index: it for it in items}
        all_scores: list[int] = []
        groups: dict[str, list[int]] = {}
        per_item, unknown = [], 0
        for (i, s), crit in per.items():
            known = [g for g in crit.values() if g is not None]
            unknown += len(crit) - len(known)
            all_scores += known
            groups.setdefault(by_index[i].group or "all", []).extend(known)
            per_item.append({"index": i, "sample": s, "id": by_index[i].item_id, "scores": crit,
                             "mean": sum(known) / len(known) if known else None})
        if not all_scores:
            raise UserError("writingbench: no criterion could be graded (every judge reply was unusable)")
        mean = sum(all_scores) / len(all_scores)
        metrics = {"mean_score": mean, "criteria_scored": len(all_scores), "unknown": unknown}
        breakdown = {g: {"mean_score": sum(v) / len(v), "criteria": len(v)} for g, v in sorted(groups.items()) if v}
        return SuiteResult(self.name, len({i for i, _ in per}), mean / 10, self.headline, metrics, breakdown,
                           judge=ctx.judge.describe(PROMPT_VERSION), per_item=per_item)
