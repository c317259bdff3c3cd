"""RuleJudge: exact, fast criterion verdicts from each Criterion's MachineCheck (the embedded judge).

Check kinds (rise_nemo.core.rubric.MachineCheck):
  regex      met when ``re.search(value, response, re.IGNORECASE)`` matches
  contains   met when the lower-cased phrase ``value`` occurs in the lower-cased response
  absent     met when it does not occur
  min_words  met when ``len(response.split()) >= int(value)``
  max_words  met when ``len(response.split()) <= int(value)``

The conversation is not consulted (checks look at the response only), so a hint can never leak into a
verdict. Regexes are compiled once per distinct rubric and cached (``stats.cache_hits`` counts reuse).
A criterion without a check, or a regex that does not compile, raises RuleJudgeError naming the prompt
and the criterion. Verdicts are never ``None``: a rule either matches or not.

``locate_spans(request, k)`` (interfaces.SpanLocatingJudge) returns where a ``regex`` / ``contains``
check matches in the response (every occurrence); the other kinds have no span ([]).

Usage::

    judge = RuleJudge()
    verdicts = judge.judge([JudgeRequest(conversation, response_text, rubric, prompt_id)])  # [[bool]*K]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from rise_nemo.core.rubric import Criterion, Rubric, RubricError
from rise_nemo.interfaces import JudgeRequest, JudgeStats, Verdict

Check = Callable[[str, str, int], bool]  # (response, lower-cased response, word count) -> met


class RuleJudgeError(RubricError):
    """A rubric the rule judge cannot decide; names the prompt and the criterion."""


def _compile(criterion: Criterion, k: int, prompt_id: str) -> Check:
    check = criterion.check
    where = f"prompt {prompt_id or '<unnamed>'}: criterion {k} ({criterion.text!r})"
    if check is None:
        raise RuleJudgeError(f"{where} has no machine check; the rule judge needs one on every criterion")
    if check.kind == "regex":
        try:
            pattern = re.compile(check.value, re.IGNORECASE)
        except re.error as exc:
            raise RuleJudgeError(f"{where}: invalid regex {check.value!r}: {exc}") from exc
        return lambda text, _low, _n: pattern.search(text) is not None
    if check.kind in ("contains", "absent"):
        phrase = check.value.lower()
        if check.kind == "contains":
            return lambda _text, low, _n: phrase in low
        return lambda _text, low, _n: phrase not in low
    bound = int(check.value)
    if check.kind == "min_words":
        return lambda _text, _low, n: n >= bound
    if check.kind == "max_words":
        return lambda _text, _low, n: n <= bound
    raise RuleJudgeError(f"{where}: unsupported check kind {check.kind!r}")  # MachineCheck rejects this first


class RuleJudge:
    """interfaces.Judge backed by machine checks."""

    def __init__(self) -> None:
        self.stats = JudgeStats()
        self._compiled: dict[Rubric, list[Check]] = {}

    def checks_for(self, rubric: Rubric, prompt_id: str = "") -> list[Check]:
        cached = self._compiled.get(rubric)
        if cached is not None:
            self.stats.cache_hits += 1
            return cached
        checks = [_compile(c, k, prompt_id) for k, c in enumerate(rubric.criteria)]
        self._compiled[rubric] = checks
        return checks

    def locate_spans(self, request: JudgeRequest, criterion: int) -> list[tuple[int, int]]:
        check = request.rubric.criteria[criterion].check
        if check is None or check.kind not in ("regex", "contains"):
            return []
        pattern = check.value if check.kind == "regex" else re.escape(check.value)
        try:
            found = re.finditer(pattern, request.response, re.IGNORECASE)
            return [(m.start(), m.end()) for m in found if m.end() > m.start()]
        except re.error as exc:
            raise RuleJudgeError(f"prompt {request.prompt_id or '<unnamed>'}: criterion {criterion}: "
                                 f"invalid regex {check.value!r}: {exc}") from exc

    def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
        out: list[list[Verdict]] = []
        for req in requests:
            checks = self.checks_for(req.rubric, req.prompt_id)
            text = req.response
            low, n_words = text.lower(), len(text.split())
            out.append([check(text, low, n_words) for check in checks])
            self.stats.calls += 1
        return out
