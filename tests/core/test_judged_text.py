"""One function (core.rubric.judged_text) decides what a judge sees, and every path that
builds a judge request uses it: the orchestration (any backend's rollouts), NeMo-RL's rubric environment
(which receives NeMo-RL's raw decoded message, nemo_rl/experience/rollouts.py) and direct JudgeRequests."""

from __future__ import annotations

from rise_nemo.backends.nemo.environment import RubricEnvironmentCore, rubric_to_metadata
from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric, RubricPrompt, judged_text
from rise_nemo.interfaces import JudgeRequest, Rollout
from rise_nemo.steps.rubric_eval import judge_groups

RAW = "<think>\nI should mention alpha.\n</think>\n\nbeta only"
RUBRIC = Rubric((Criterion("Mentions alpha", 2.0, (), MachineCheck("contains", "alpha")),))
PROMPT = RubricPrompt("p0", ({"role": "user", "content": "say something"},), RUBRIC)


class RecordingJudge:
    def __init__(self):
        self.seen: list[str] = []

    def judge(self, requests):
        self.seen += [r.response for r in requests]
        return [[("alpha" in r.response)] * len(r.rubric) for r in requests]


def test_judged_text_drops_reasoning_and_unfinished_reasoning():
    assert judged_text(RAW) == "beta only"
    assert judged_text("<think>a</think>x<think>b</think> final") == "final"
    assert judged_text("  <think>cut mid-thought") == ""
    assert judged_text("plain answer") == "plain answer"


def test_every_judge_path_sees_the_same_text():
    judge = RecordingJudge()
    # Orchestration, with a rollout as the embedded backend returns it (raw decoded text, reasoning included).
    rollout = Rollout(list(PROMPT.messages), [1, 2], [3, 4], RAW, [0.0, 0.0])
    verdicts = judge_groups(judge, [PROMPT], [[rollout]])
    # NeMo-RL's environment: the final assistant message as NeMo-RL's rollout loop decoded it.
    meta = {**rubric_to_metadata(PROMPT), "conversation": list(PROMPT.messages)}
    log = [{"role": "user", "content": "say something"}, {"role": "assistant", "content": RAW}]
    rewards, unknown = RubricEnvironmentCore(judge).score([log], [meta])
    # Any other caller (persistent task, rule helper) builds JudgeRequest directly.
    direct = JudgeRequest(list(PROMPT.messages), RAW, RUBRIC)
    assert judge.seen == ["beta only", "beta only"] and direct.response == "beta only"
    assert verdicts == [[[False]]] and float(rewards[0]) == 0.0 and not bool(unknown[0])  # reasoning never scores
