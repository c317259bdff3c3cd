"""``apps``: APPS (Hendrycks et al. 2021) pass@1 by difficulty, the RRL paper's code table (on APPS+).

- Rows: APPS in the original / Hugging Face ``codeparrot/apps`` layout or MapCoder's, read by
  rise_nemo.data.apps (APPS's own generation prompt, asking for one ```python block).
- Every response's program runs against all of its problem's tests in the bubblewrap sandbox
  (rise_nemo.judges.code_verifier.CodeVerifier, APPS's import preamble included); a sample is correct when
  it passes every test ("strict accuracy"); a response without code fails.
- Headline: pass@1 = mean over problems of (passing samples / samples); also unbiased pass@k, APPS's
  "test case average" (mean fraction of tests passed) and the outcome counts; a breakdown by difficulty
  (introductory, interview, competition).
Needs bubblewrap (``bwrap``): without it the suite stops with one line saying so.
Data: the 5 APPS train problems with human solutions shipped in rise_nemo/data/samples (apps_solutions_5.jsonl).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rise_nemo.evals.base import EvalItem, ScoreContext, Suite, SuiteResult, pass_table

_NAMES = {0: "introductory", 1: "interview", 2: "competition"}


class APPS(Suite):
    name = "apps"
    headline = "pass@1"
    source = "APPS (Hendrycks et al. 2021, MIT); graded by rise_nemo.judges.code_verifier in bubblewrap"

    def load(self, path):
        if path is None:
            from rise_nemo.data.samples import apps_solutions_path

            path = apps_solutions_path()
        return super().load(path)

    def parse_row(self, row: Mapping[str, Any], where: str, index: int) -> EvalItem:
        from rise_nemo.data.apps import parse_apps_record

        p = parse_apps_record(row, where, f"apps-{index}")
        return EvalItem(index, p.prompt_id, tuple(p.messages), p.answer,
                        _NAMES.get(p.difficulty, "unknown") if p.difficulty is not None else "unknown",
                        {"solution": p.reference_solution})

    def reference_response(self, item: EvalItem) -> str:
        if not item.extra["solution"]:
            raise NotImplementedError(f"apps row {item.index} carries no human solution")
        return item.extra["solution"]

    def check(self, judge_urls: Sequence[str] | None) -> None:
        from rise_nemo.judges.sandbox import BubblewrapSandbox, SandboxLimits

        BubblewrapSandbox(SandboxLimits(memory_mb=1024)).check()  # SandboxUnavailable: a one-line UserError

    def score(self, items: Sequence[EvalItem], samples: Mapping[int, list[str]], ctx: ScoreContext) -> SuiteResult:
        from rise_nemo.core.code_tests import parse_tests
        from rise_nemo.judges.code_verifier import CodeVerifier

        verifier = CodeVerifier()  # SandboxUnavailable (a one-line UserError) without bubblewrap
        try:
            flat = [(it, r) for it in items for r in samples.get(it.index, [])]
            specs = {it.index: parse_tests(it.reference) for it in items}
            results = verifier.grade([r for _, r in flat], [specs[it.index] for it, _ in flat])
        finally:
            verifier.close()
        per: dict[int, list[Any]] = {}
        for (it, _), res in zip(flat, results):
            per.setdefault(it.index, []).append(res)
        counts, per_item, outcomes, fractions = [], [], Counter(), []
        groups: dict[str, list[tuple[int, int]]] = {}
        for it in items:
            if it.index not in per:
                continue
            rs = per[it.index]
            n, c = len(rs), sum(r.reward == 1.0 for r in rs)
            counts.append((n, c))
            groups.setdefault(it.group or "unknown", []).append((n, c))
            outcomes.update(r.outcome for r in rs)
            fractions += [r.pass_fraction for r in rs]
            per_item.append({"index": it.index, "id": it.item_id, "difficulty": it.group, "samples": n, "correct": c,
                             "outcomes": [r.outcome for r in rs], "tests_passed": [f"{r.passed}/{r.total}" for r in rs]})
        table = pass_table(counts)
        metrics: dict[str, Any] = {**table, "test_case_average": sum(fractions) / len(fractions),
                                   "samples": len(fractions), **{f"outcome_{k}": v for k, v in sorted(outcomes.items())}}
        breakdown = {g: {"pass@1": pass_table(c)["pass@1"], "n": len(c)} for g, c in sorted(groups.items())}
        return SuiteResult(self.name, len(counts), table["pass@1"], self.headline, metrics, breakdown,
                           per_item=per_item)
