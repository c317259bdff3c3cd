"""``healthbench``: HealthBench (Arora et al. 2025) graded as openai/simple-evals ``healthbench_eval.py`` does.

- Grader prompt: simple-evals' ``GRADER_TEMPLATE``, verbatim (rise_nemo/evals/data/healthbench_grader.txt,
  MIT, (c) 2024 OpenAI), one call per rubric item; the conversation is ``"role: content"`` turns joined by
  blank lines, the response appended as the last ``assistant`` turn, the rubric item ``"[points] criterion"``.
  The reply is a JSON object (optionally in a ```json fence) with a boolean ``criteria_met``.
- Per-example score: sum of the points of met items / sum of positive points
  (rise_nemo.core.rewards.rubric_reward, eq. 3 with HealthBench's negative-points convention; no clipping).
- Overall: clip(mean over examples (x samples), 0, 1) with its bootstrap standard error (1000 resamples,
  clipped means: simple-evals ``_compute_clipped_stats``; rise_nemo.core.metrics.bootstrap_mean).
- Breakdown: every example-level tag (``theme:...``) gets its example's score; every rubric-level tag
  (``axis:...``, ``cluster:...``, ``level:...``) gets the same formula over the items carrying it (skipped
  where they have no positive points); each tag's figure is the clipped mean over the examples it has.

A response with an item the judge could not grade (``None`` after retries) is left out and counted
(``unknown``); simple-evals retries forever instead. Data: the 60 rows shipped in the package
(rise_nemo/data/samples/healthbench_sample.jsonl); a full file (simple-evals' JSONL) by ``--data``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from rise_nemo.errors import UserError
from rise_nemo.evals.base import EvalItem, ScoreContext, Suite, SuiteResult, packaged_data, require
from rise_nemo.evals.judge import JudgeCall, run_batched

PROMPT_VERSION = "simple-evals-healthbench-9e2fafd"  # openai/simple-evals @ 9e2fafd122f0, GRADER_TEMPLATE


def grader_template() -> str:
    return packaged_data("healthbench_grader.txt").read_text(encoding="utf-8").strip()


def parse_grade(reply: str) -> bool:
    """``criteria_met`` of the grader's JSON reply; VerdictParseError (retried) otherwise."""
    from rise_nemo.judges.grading import VerdictParseError, load_single_object

    obj = load_single_object(reply)
    met = obj.get("criteria_met")
    if not isinstance(met, bool):
        raise VerdictParseError(f"'criteria_met' must be true or false, got {met!r}")
    return met


def grader_messages(conversation: Sequence[Mapping[str, str]], response: str, points: Any, criterion: str,
                    template: str) -> list[dict[str, str]]:
    convo = list(conversation) + [{"role": "assistant", "content": response}]
    convo_str = "\n\n".join(f"{m['role']}: {m['content']}" for m in convo)
    prompt = template.replace("<<conversation>>", convo_str).replace("<<rubric_item>>", f"[{points}] {criterion}")
    return [{"role": "user", "content": prompt}]


def example_score(points: Sequence[float], met: Sequence[bool]) -> float | None:
    """HealthBench's per-example (or per-tag) score; None when no item has positive points."""
    from rise_nemo.core.rewards import rubric_reward

    if not any(p > 0 for p in points):
        return None
    return float(rubric_reward([bool(m) for m in met], [float(p) for p in points]))


_RUBRIC_ITEM = re.compile(r"\n# Rubric item\n\[[^\]]*\] (.*?)\n\n# Instructions\n", re.DOTALL)


def rule_reply(prompt: str) -> str:
    """The rule judge's reply to a grader prompt (rise_nemo.evals.judge): the item is met when
    ``rise_nemo.judges.rule_server.rule_verdict`` finds it in the response (the last ``assistant:`` turn)."""
    import json

    from rise_nemo.errors import require_extra

    require_extra("judge", "aiohttp", what="the healthbench rule judge (rise_nemo.judges.rule_server)")
    from rise_nemo.judges.rule_server import rule_verdict

    item = _RUBRIC_ITEM.search(prompt)
    head = prompt[:item.start()] if item else ""
    turn = head.rfind("\n\nassistant: ")
    if item is None or turn < 0:
        raise ValueError("not a HealthBench grader prompt")
    met = rule_verdict(item.group(1), head[turn + len("\n\nassistant: "):])
    return "```json\n" + json.dumps({"explanation": "rule judge", "criteria_met": met}) + "\n```"


class HealthBench(Suite):
    name = "healthbench"
    headline = "clipped mean score"
    source = "HealthBench (Arora et al. 2025), openai/simple-evals healthbench_eval.py (MIT)"
    judged = True

    def check(self, judge_urls: Sequence[str] | None) -> None:
        if not judge_urls:  # the rule judge's verdicts come from rise_nemo.judges.rule_server (aiohttp)
            from rise_nemo.errors import require_extra

            require_extra("judge", "aiohttp", what="the healthbench rule judge (rise_nemo.judges.rule_server)")

    def load(self, path):
        if path is None:
            from rise_nemo.data.samples import healthbench_sample_path

            path = healthbench_sample_path()
        return super().load(path)

    def parse_row(self, row: Mapping[str, Any], where: str, index: int) -> EvalItem:
        prompt = require(row, "prompt", where, list)
        for k, m in enumerate(prompt):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise UserError(f"{where}: key 'prompt': message {k} needs string 'role' and 'content'")
        rubrics = require(row, "rubrics", where, list)
        items = []
        for k, r in enumerate(rubrics):
            if not isinstance(r, Mapping):
                raise UserError(f"{where}: key 'rubrics': item {k} is not an object")
            crit = require(r, "criterion", f"{where}: rubrics[{k}]")
            pts = require(r, "points", f"{where}: rubrics[{k}]", (int, float))
            tags = r.get("tags") or []
            if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                raise UserError(f"{where}: rubrics[{k}]: key 'tags': expected a list of strings")
            items.append({"criterion": crit, "points": pts, "tags": tags})
        if not any(i["points"] > 0 for i in items):
            raise UserError(f"{where}: key 'rubrics': no item with positive points (the score is undefined)")
        tags = row.get("example_tags") or []
        return EvalItem(index, str(row.get("prompt_id") or f"healthbench-{index}"),
                        tuple({"role": m["role"], "content": m["content"]} for m in prompt), items, None,
                        {"example_tags": list(tags)})

    def reference_response(self, item: EvalItem) -> str:
        """For the rule judge: a response naming every positive item's key word and no negative one's is
        not constructible in general; the tests build their cases from verdicts instead."""
        raise NotImplementedError("healthbench has no reference answers")

    def score(self, items: Sequence[EvalItem], samples: Mapping[int, list[str]], ctx: ScoreContext) -> SuiteResult:
        from rise_nemo.core.metrics import bootstrap_mean

        template = grader_template()
        calls, where = [], []
        for item in items:
            for s, response in enumerate(samples.get(item.index, [])):
                for rub in item.reference:
                    calls.append(JudgeCall(
                        grader_messages(item.messages, response, rub["points"], rub["criterion"], template),
                        parse_grade))
                    where.append((item.index, s))
        verdicts = run_batched(ctx.judge, calls, ctx.progress, "healthbench")
        met: dict[tuple[int, int], list[Any]] = {}
        for key, v in zip(where, verdicts):
            met.setdefault(key, []).append(v)
        by_index = {it.index: it for it in items}
        scores, per_item, unknown = [], [], 0
        tag_scores: dict[str, list[float]] = {}
        for (i, s), vs in met.items():
            item = by_index[i]
            if any(v is None for v in vs):
                unknown += 1
                per_item.append({"index": i, "sample": s, "id": item.item_id, "score": None, "met": vs})
                continue
            points = [r["points"] for r in item.reference]
            sc = example_score(points, vs)
            scores.append(sc)
            per_item.append({"index": i, "sample": s, "id": item.item_id, "score": sc, "met": vs})
            for tag in item.extra["example_tags"]:
                tag_scores.setdefault(tag, []).append(sc)
            by_tag: dict[str, list[int]] = {}
            for k, r in enumerate(item.reference):
                for tag in r["tags"]:
                    by_tag.setdefault(tag, []).append(k)
            for tag, ks in by_tag.items():
                t = example_score([points[k] for k in ks], [vs[k] for k in ks])
                if t is not None:
                    tag_scores.setdefault(tag, []).append(t)
        if not scores:
            raise UserError("healthbench: no response could be graded (every one has an unknown verdict)")
        boot = bootstrap_mean(scores, resamples=ctx.bootstrap, seed=ctx.seed, clip=(0.0, 1.0))
        breakdown = {}
        for tag in sorted(tag_scores):
            if tag.split(":", 1)[0] in ("theme", "axis"):
                breakdown[tag] = {"score": float(min(1.0, max(0.0, sum(tag_scores[tag]) / len(tag_scores[tag])))),
                                  "n": len(tag_scores[tag])}
        metrics = {"clipped_mean": boot["mean"], "bootstrap_std": boot["std"], "unclipped_mean": sum(scores) / len(scores),
                   "samples": len(scores), "unknown": unknown}
        judge = ctx.judge.describe(PROMPT_VERSION)
        return SuiteResult(self.name, len({i for i, _ in met}), boot["mean"], self.headline, metrics, breakdown,
                           judge=judge, per_item=per_item,
                           info={"tag_scores": {t: sum(v) / len(v) for t, v in sorted(tag_scores.items())}})
