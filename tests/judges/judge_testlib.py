"""Helpers shared by the judge tests (imported by module name: pytest puts tests/judges on sys.path)."""

from __future__ import annotations

from rise_nemo.core.rubric import Criterion, Rubric
from rise_nemo.interfaces import Judge, JudgeRequest
from rise_nemo.judges.http import HttpJudge, build_http_judge
from rise_nemo.judges.rule_server import rule_verdict

MODES = ["per_criterion", "batched"]
SECRET = "sk-test-7f3a9c1e-DO-NOT-LEAK"


def make_judge(urls, mode="batched", **overrides) -> HttpJudge:
    cfg = {
        "type": "http",
        "mode": mode,
        "model": "rule-grader",
        "base_urls": urls if isinstance(urls, list) else [urls],
        "batch_size": 4,
        "max_concurrency": 16,
        "timeout_s": 300.0,  # generous: call counts must not depend on load; timeout tests set their own
        "max_attempts": 6,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.2,
    }
    cfg.update(overrides)
    judge = build_http_judge(cfg)
    assert isinstance(judge, HttpJudge) and isinstance(judge, Judge)
    return judge


def expected(requests) -> list[list[bool]]:
    """The rule grader's verdicts computed directly on the raw texts (the ground truth over HTTP)."""
    return [[rule_verdict(c.text, r.response) for c in r.rubric.criteria] for r in requests]


def small_requests() -> list[JudgeRequest]:
    rub = Rubric((
        Criterion('Mentions "potassium"', 5),
        Criterion('Recommends "surgery"', -3),  # negative: met = the undesirable behaviour occurred
        Criterion('Advises "hydration"', 2),
        Criterion('Says "see a doctor"', 1),
        Criterion('Uses "warm compress"', 2),
    ))
    conv = [{"role": "user", "content": "My daughter has leg cramps."}]
    responses = [
        "Check potassium, keep up hydration and see a doctor.",
        "She needs surgery. Use a warm compress.",
        "Nothing to add.",
    ]
    return [JudgeRequest(conv, r, rub, prompt_id=f"p{i}") for i, r in enumerate(responses)]
