"""writingbench, arena_hard, hh_win_rate: hand-computed cases with scripted judges, position-bias
cancellation by swapped games, the rule judge end to end, and the HTTP judge (loopback rule server)
agreeing with it."""

from __future__ import annotations

import json

import pytest
from suite_helpers import ScriptedJudge, run_cli, run_cli_with_rule_server, score_fields, write_responses

from rise_nemo.evals import get_suite
from rise_nemo.evals.arena_hard import battles, parse_label
from rise_nemo.evals.base import ScoreContext, packaged_data
from rise_nemo.evals.hh_win_rate import ours, parse_verdict
from rise_nemo.evals.writingbench import parse_score, rule_score
from rise_nemo.judges.grading import VerdictParseError

JUDGED = ["writingbench", "arena_hard", "hh_win_rate"]


def two_samples(items):
    return {it.index: ["short answer", " ".join(["word"] * 200) + " structure logic Analysis"] for it in items}


# -- writingbench -------------------------------------------------------------------------------------


def test_writingbench_prompt_is_the_repository_template_and_means_by_hand():
    suite = get_suite("writingbench")
    items = suite.load(None)[:2]
    scripted = iter([3, 7, 10, 1, 9, 2, 2, 2, 2, 2])  # item 0's five criteria, then item 1's
    judge = ScriptedJudge(lambda prompt: json.dumps({"score": next(scripted), "reason": "r"}))
    result = suite.score(items, {0: ["my essay"], 1: ["another essay"]}, ScoreContext(judge=judge))
    assert result.metrics["mean_score"] == pytest.approx((3 + 7 + 10 + 1 + 9 + 2 * 5) / 10)
    assert result.score == pytest.approx(result.metrics["mean_score"] / 10)
    assert [r["mean"] for r in result.per_item] == [pytest.approx(6.0), pytest.approx(2.0)]
    system = packaged_data("writingbench_system.txt").read_text()
    template = packaged_data("writingbench_prompt.txt").read_text()
    crit = items[0].reference[0]
    assert judge.prompts[0] == [{"role": "system", "content": system}, {"role": "user", "content": template.format(
        query=items[0].messages[0]["content"], response="my essay", criteria=crit)}]
    assert result.judge["prompt_version"].startswith("writingbench-")


def test_writingbench_reply_parsing_and_rule():
    assert parse_score('```json\n{"score": 7, "reason": "ok"}\n```') == 7
    assert parse_score('<think>{"score": 1, "reason": "x"}</think> {"score": 9, "reason": "y"}') == 9
    for bad in ('{"score": 11, "reason": "x"}', '{"score": true, "reason": "x"}', '{"score": 5}', "score 5"):
        with pytest.raises(VerdictParseError):
            parse_score(bad)
    assert rule_score("Data_Accuracy", "the DATA accuracy") == 10
    assert rule_score("Data_Accuracy", "The data is accurate") == 6  # 1 of 2 parts: 1 + 4.5 rounded up
    assert rule_score("Logical Structure", "no match") == 1
    assert rule_score("数据_准确性", "数据很好") == 6  # Chinese names: parts are matched as substrings


def test_writingbench_unknown_criteria_are_left_out_and_counted():
    suite = get_suite("writingbench")
    items = suite.load(None)[:1]
    replies = iter(['{"score": 4, "reason": "r"}', None, '{"score": 8, "reason": "r"}', None, None])
    result = suite.score(items, {0: ["x"]}, ScoreContext(judge=ScriptedJudge(lambda p: next(replies))))
    assert result.metrics["mean_score"] == 6.0 and result.metrics["unknown"] == 3


# -- arena_hard ---------------------------------------------------------------------------------------


def test_arena_hard_battles_and_labels_by_hand():
    assert battles("B>>A", "A=B") == [1, 1, 1, 0.5]  # game 1: we are B and win big; game 2: tie
    assert battles("A>B", "A>B") == [0, 1]  # a judge that always prefers A: one loss, one win
    assert battles("A>>B", "B>>A") == [0] * 6
    assert parse_label("My final verdict is tie: [[a=b]]") == "A=B"
    assert parse_label("[[A>B]] ... on reflection [[B>A]]") == "B>A"  # the last label
    assert parse_label("final: [B>>A]") == "B>>A"  # the single-bracket fallback
    for bad in ("[[A>>>B]]", "no verdict"):
        with pytest.raises(VerdictParseError):
            parse_label(bad)


def test_arena_hard_swapped_games_cancel_position_bias(tmp_path):
    suite = get_suite("arena_hard")
    items = suite.load(None)
    ctx = ScoreContext(judge=ScriptedJudge(lambda p: "[[A>>B]]"), baseline=suite.default_baseline(items))
    result = suite.score(items, {it.index: ["mine"] for it in items}, ctx)
    assert result.score == 0.5 and result.metrics["battles"] == 8 * 6
    # One unusable game drops its pair.
    replies = iter(["[[B>A]]", None] + ["[[B>A]]", "[[A>B]]"] * 7)
    ctx.judge = ScriptedJudge(lambda p: next(replies))
    result = suite.score(items, {it.index: ["mine"] for it in items}, ctx)
    assert result.metrics["dropped_pairs"] == 1 and result.score == 1.0 and result.metrics["pairs"] == 7
    assert result.metrics["ci90_lo"] <= result.score <= result.metrics["ci90_hi"]


def test_arena_hard_baselines(tmp_path, capsys):
    suite = get_suite("arena_hard")
    items = suite.load(None)
    base = suite.default_baseline(items)
    assert len(base) == 8 and all(len(v[0]) > 50 for v in base.values())  # gpt-4-0314's real answers
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"uid": "u1", "prompt": "Say hi."}) + "\n")
    rows = write_responses(tmp_path / "r.jsonl", [(0, "hi")])
    rc, _, err = run_cli(["score", "--suite", "arena_hard", "--data", data, "--responses", rows], capsys)
    assert rc == 2 and "give --baseline" in err
    answers = tmp_path / "model_answer.jsonl"
    answers.write_text(json.dumps({"uid": "u1", "messages": [{"role": "user", "content": "Say hi."}, {
        "role": "assistant", "content": {"answer": "Hello there, how can I help you today?"}}]}) + "\n")
    rc, out, err = run_cli(["score", "--suite", "arena_hard", "--data", data, "--responses", rows, "--baseline",
                            answers, "--out", tmp_path / "o"], capsys)
    assert rc == 0, err
    assert float(score_fields(out)["score"]) == 0.0  # the rule judge prefers the (much) longer baseline


# -- hh_win_rate --------------------------------------------------------------------------------------


def test_hh_verdicts_from_our_side_and_position_bias():
    assert ours("A", True) == 1 and ours("A", False) == -1 and ours("B", False) == 1 and ours("C", True) == 0
    assert parse_verdict("thinking [[A]] ... [[C]]") == "C"
    with pytest.raises(VerdictParseError):
        parse_verdict("A is better")
    suite = get_suite("hh_win_rate")
    items = suite.load(None)
    samples = {it.index: ["mine"] for it in items}
    biased = suite.score(items, samples, ScoreContext(judge=ScriptedJudge(lambda p: "[[A]]"),
                                                      baseline=suite.default_baseline(items)))
    assert (biased.metrics["win"], biased.metrics["tie"], biased.metrics["lose"]) == (0.0, 1.0, 0.0)

    def prefers_mine(prompt):
        return "[[A]]" if prompt.split("<|Reply A|>\n", 1)[1].startswith("mine") else "[[B]]"

    fair = suite.score(items, samples, ScoreContext(judge=ScriptedJudge(prefers_mine),
                                                    baseline=suite.default_baseline(items)))
    assert fair.score == 1.0 and fair.metrics["lose"] == 0.0


def test_hh_baseline_defaults_to_chosen_and_bad_rows(tmp_path, capsys):
    suite = get_suite("hh_win_rate")
    items = suite.load(None)
    same = write_responses(tmp_path / "same.jsonl", [(it.index, suite.reference_response(it)) for it in items])
    rc, out, err = run_cli(["score", "--suite", "hh_win_rate", "--responses", same, "--out", tmp_path], capsys)
    assert rc == 0, err
    assert score_fields(out)["tie"] == "1.0000"  # the chosen reply against itself
    data = tmp_path / "hh.jsonl"
    data.write_text(json.dumps({"chosen": "\n\nHuman: hi\n\nAssistant: hello"}) + "\n")
    rc, _, err = run_cli(["score", "--suite", "hh_win_rate", "--data", data, "--responses", same], capsys)
    assert rc == 2 and f"{data}:1" in err and "'rejected'" in err


# -- all judged suites --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", JUDGED)
def test_rule_and_http_judges_agree_end_to_end(name, tmp_path, capsys):
    suite = get_suite(name)
    items = suite.load(None)
    rows = write_responses(tmp_path / "r.jsonl", [(i, r) for i, rs in two_samples(items).items() for r in rs])
    rc, out, err = run_cli(["score", "--suite", name, "--responses", rows, "--out", tmp_path / "rule"], capsys)
    assert rc == 0, err
    rule = score_fields(out)
    assert 0.0 <= float(rule["score"]) <= 1.0 and rule["judge"] == "rule" and rule["n"] == str(len(items))
    rc, out, err = run_cli_with_rule_server(["score", "--suite", name, "--responses", rows, "--out", tmp_path / "http"],
                                            capsys)
    assert rc == 0, err
    http = score_fields(out)
    assert http["score"] == rule["score"] and http["judge"] == "rule-grader"
    saved = json.loads((tmp_path / "http" / f"{name}.json").read_text())
    assert saved["judge"]["type"] == "http" and saved["judge"]["prompt_version"] == rule["judge_prompt"]
    assert (tmp_path / "http" / f"{name}.md").is_file()
