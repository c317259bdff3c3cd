"""healthbench: simple-evals' grader prompt and formula on the shipped rows, with the rule judge and the
HTTP judge (loopback rule server)."""

from __future__ import annotations

import json
import random
import statistics

import pytest
from suite_helpers import ScriptedJudge, run_cli, run_cli_with_rule_server, score_fields, write_responses

from rise_nemo.evals import get_suite
from rise_nemo.evals.base import ScoreContext
from rise_nemo.evals.healthbench import PROMPT_VERSION, grader_messages, grader_template, parse_grade
from rise_nemo.evals.judge import RuleEvalJudge
from rise_nemo.judges.grading import VerdictParseError
from rise_nemo.judges.rule_server import rule_verdict


def official_calculate_score(points, met):
    """simple-evals healthbench_eval.calculate_score, written out independently for the check."""
    total = sum(p for p in points if p > 0)
    if total == 0:
        return None
    return sum(p for p, m in zip(points, met) if m) / total


def responses_for(items, seed=0):
    """Per row: the key words of a random half of its criteria (verdicts vary, negatives met too)."""
    rng = random.Random(seed)
    out = []
    for it in items:
        words = [max((w for w in r["criterion"].split() if w.isalpha()), key=len, default="none")
                 for r in it.reference if rng.random() < 0.5]
        out.append((it.index, "Here is my answer. " + " ".join(words)))
    return out


def test_equals_the_official_formula_on_the_shipped_rows(tmp_path, capsys):
    suite = get_suite("healthbench")
    items = suite.load(None)
    assert len(items) == 60
    rows = responses_for(items)
    result = suite.score(items, {i: [r] for i, r in rows}, ScoreContext(judge=RuleEvalJudge()))
    expected, axis = [], {}
    for (i, response), it in zip(rows, items):
        points = [r["points"] for r in it.reference]
        met = [rule_verdict(r["criterion"], response) for r in it.reference]
        s = official_calculate_score(points, met)
        expected.append(s)
        assert result.per_item[i]["score"] == pytest.approx(s)
        for tag in {t for r in it.reference for t in r["tags"] if t.startswith("axis:")}:
            ks = [k for k, r in enumerate(it.reference) if tag in r["tags"]]
            t = official_calculate_score([points[k] for k in ks], [met[k] for k in ks])
            if t is not None:
                axis.setdefault(tag, []).append(t)
    assert result.score == pytest.approx(min(1.0, max(0.0, sum(expected) / len(expected))))
    assert 0.05 < result.score < 0.95 and any(s < 0 for s in expected)  # a real spread, negatives included
    for tag, values in axis.items():
        assert result.breakdown[tag]["score"] == pytest.approx(min(1, max(0, statistics.mean(values))))
        assert result.breakdown[tag]["n"] == len(values)
    # bootstrap standard error of the mean ~ population sd / sqrt(n)
    se = statistics.pstdev(expected) / len(expected) ** 0.5
    assert 0.75 * se < result.metrics["bootstrap_std"] < 1.25 * se
    assert result.judge == {"type": "rule", "model": "rule", "prompt_version": PROMPT_VERSION, "calls": 698}


def test_hand_computed_example_and_clipping(tmp_path, capsys):
    data = tmp_path / "hb.jsonl"
    rub = [{"criterion": f'Mentions "{w}".', "points": p, "tags": ["axis:accuracy"]}
           for w, p in (("alpha", 7), ("beta", 5), ("gamma", 10), ("delta", -6))]
    neg = [{"criterion": 'Says "delta".', "points": -3, "tags": []}, {"criterion": 'Says "omega".', "points": 1,
                                                                       "tags": []}]
    data.write_text(json.dumps({"prompt_id": "a", "prompt": [{"role": "user", "content": "hi"}], "rubrics": rub,
                                "example_tags": ["theme:test"]}) + "\n"
                    + json.dumps({"prompt_id": "b", "prompt": [{"role": "user", "content": "yo"}], "rubrics": neg}) + "\n")
    # README's example: points 7, 5, 10, -6 met T, F, T, T -> (7 + 10 - 6) / 22 = 0.5
    rows = write_responses(tmp_path / "r.jsonl", [(0, "alpha gamma delta"), (1, "delta delta")])
    rc, out, err = run_cli(["score", "--suite", "healthbench", "--data", data, "--responses", rows, "--out",
                            tmp_path / "o"], capsys)
    assert rc == 0, err
    saved = json.loads((tmp_path / "o" / "healthbench.json").read_text())
    assert [r["score"] for r in saved["per_item"]] == [pytest.approx(0.5), pytest.approx(-3.0)]
    assert saved["metrics"]["unclipped_mean"] == pytest.approx(-1.25)
    assert float(score_fields(out)["score"]) == 0.0  # clip(mean, 0, 1)
    assert saved["breakdown"]["theme:test"]["score"] == pytest.approx(0.5)
    assert saved["judge"]["prompt_version"] == PROMPT_VERSION and "judge_prompt=" + PROMPT_VERSION in out


def test_grader_prompt_is_the_official_template():
    t = grader_template()
    assert t.startswith("Your job is to look at a conversation and a rubric item")
    assert t.endswith("Do not include any other text in the response.")
    msgs = grader_messages([{"role": "user", "content": "Q?"}], "A.", -6, "Is rude.", t)
    assert msgs == [{"role": "user", "content": t.replace("<<conversation>>", "user: Q?\n\nassistant: A.")
                     .replace("<<rubric_item>>", "[-6] Is rude.")}]
    assert parse_grade('```json\n{"explanation": "x", "criteria_met": true}\n```') is True
    assert parse_grade('{"criteria_met": false}') is False
    for bad in ('{"criteria_met": "yes"}', "criteria_met: true", '{"explanation": "x"}'):
        with pytest.raises(VerdictParseError):
            parse_grade(bad)


def test_http_judge_agrees_with_the_rule_judge(tmp_path, capsys):
    suite = get_suite("healthbench")
    items = suite.load(None)[:6]
    rows = write_responses(tmp_path / "r.jsonl", responses_for(items, seed=1))
    rc, out, err = run_cli(["score", "--suite", "healthbench", "--responses", rows, "--partial", "--out",
                            tmp_path / "rule"], capsys)
    assert rc == 0, err
    rule = score_fields(out)
    rc, out, err = run_cli_with_rule_server(["score", "--suite", "healthbench", "--responses", rows, "--partial",
                                             "--out", tmp_path / "http"], capsys)
    assert rc == 0, err
    http = score_fields(out)
    assert http["score"] == rule["score"] and http["n"] == "6" and http["judge"] == "rule-grader"
    saved = json.loads((tmp_path / "http" / "healthbench.json").read_text())
    assert saved["judge"]["type"] == "http" and saved["judge"]["unknown"] == 0
    assert saved["judge"]["calls"] == sum(len(it.reference) for it in items)
    # Scoring again into the same folder (an interrupted run resumed) asks the judge nothing new.
    cache = tmp_path / "http" / "healthbench.judge_cache.jsonl"
    assert len(cache.read_text().splitlines()) == saved["judge"]["calls"]
    rc, out, err = run_cli_with_rule_server(["score", "--suite", "healthbench", "--responses", rows, "--partial",
                                             "--out", tmp_path / "http"], capsys)
    assert rc == 0, err
    again = json.loads((tmp_path / "http" / "healthbench.json").read_text())
    assert again["judge"]["calls"] == 0 and again["judge"]["cache_hits"] == saved["judge"]["calls"]
    assert score_fields(out)["score"] == http["score"]


def test_an_unknown_item_verdict_leaves_the_response_out_and_is_counted():
    suite = get_suite("healthbench")
    items = suite.load(None)[:2]
    n0 = len(items[0].reference)
    calls = iter(range(10_000))

    def reply(prompt):  # the first item of row 0 is unknown; every other item met
        return None if next(calls) == 0 else '{"explanation": "x", "criteria_met": true}'

    result = suite.score(items, {0: ["a"], 1: ["b"]}, ScoreContext(judge=ScriptedJudge(reply)))
    assert result.metrics["unknown"] == 1 and result.metrics["samples"] == 1 and result.n == 2
    points = [r["points"] for r in items[1].reference]
    assert result.metrics["unclipped_mean"] == pytest.approx(sum(points) / sum(p for p in points if p > 0))
    assert result.per_item[0]["score"] is None and len(result.per_item[0]["met"]) == n0


def test_http_judge_retries_bad_replies_and_counts_unknowns(tmp_path, capsys):
    suite = get_suite("healthbench")
    items = suite.load(None)[:1]
    rows = write_responses(tmp_path / "r.jsonl", responses_for(items, seed=2))
    n = len(items[0].reference)
    fast = ["--judge-option", "backoff_base_s=0.001", "--judge-option", "backoff_max_s=0.01"]
    # two bad replies, then all good: retried
    rc, out, err = run_cli_with_rule_server(["score", "--suite", "healthbench", "--responses", rows, "--partial",
                                             "--out", tmp_path / "a", *fast], capsys, script=["malformed", "500"])
    assert rc == 0, err
    saved = json.loads((tmp_path / "a" / "healthbench.json").read_text())
    assert saved["judge"]["calls"] == n + 2 and saved["judge"]["unknown"] == 0 and saved["metrics"]["unknown"] == 0
    # never a usable reply: unknown, never a guess
    rc, out, err = run_cli_with_rule_server(["score", "--suite", "healthbench", "--responses", rows, "--partial",
                                             "--out", tmp_path / "b", *fast, "--judge-option", "max_attempts=2"],
                                            capsys, rates={"malformed": 1.0})
    assert rc == 2 and "no response could be graded" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli(["score", "--suite", "healthbench", "--responses", rows, "--partial", "--judge-url",
                          "http://127.0.0.1:9/v1", "--judge-model", "m", "--judge-option", "bogus=1"], capsys)
    assert rc == 2 and "bogus" in err
