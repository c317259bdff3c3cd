"""pass@k of an evaluation whose verifier leaves samples undecided: a problem with fewer than
k decided samples is left out of pass@k and counted, and the printed table says so."""

from __future__ import annotations

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.interfaces import Rollout, SamplingParams
from rise_nemo.steps.reasoning_eval import evaluate_reasoning, format_reasoning_eval


class EchoGenerator:
    """Responds to problem i with the texts in ``responses[i]`` (the generator protocol, no model)."""

    def __init__(self, responses):
        self.responses = responses

    def generate(self, prompts, n, params):
        return [[Rollout(list(p), [1], [2, 3], text, [-0.5, -0.5]) for text in self.responses[i][:n]]
                for i, p in enumerate(prompts)]


class WordVerifier:
    """'right' -> True, 'wrong' -> False, anything else undecided (None), as math-verify on unparseable text."""

    def verify(self, problems, responses):
        return [{"right": True, "wrong": False}.get(r) for r in responses]


def test_problems_with_fewer_than_k_decided_samples_are_counted_not_dropped_silently():
    problems = [ReasoningProblem(f"p{i}", ({"role": "user", "content": f"q{i}"},), "ref", "1", 2) for i in range(3)]
    generator = EchoGenerator([["right", "wrong", "wrong", "right"],   # 4 decided
                               ["right", "???", "???", "???"],         # 1 decided: no pass@2, no pass@4
                               ["wrong", "wrong", "???", "wrong"]])    # 3 decided: no pass@4
    result = evaluate_reasoning(generator, WordVerifier(), problems, 4, SamplingParams())
    level = result["levels"]["2"]
    assert level["undecided"] == 4
    assert level["pass_at_k_excluded"] == {"1": 0, "2": 1, "4": 2}
    assert level["pass_at_k"]["4"] == 1.0  # only the first problem has 4 decided samples
    text = format_reasoning_eval(result)
    assert "left out of pass@k" in text and "level 2 pass@2: 1 of 3" in text and "level 2 pass@4: 2 of 3" in text
    assert "pass@1:" not in text.splitlines()[-1]  # nothing left out of pass@1


def test_nothing_is_reported_when_every_sample_is_decided():
    problems = [ReasoningProblem("p", ({"role": "user", "content": "q"},), "ref", "1", 1)]
    result = evaluate_reasoning(EchoGenerator([["right", "wrong"]]), WordVerifier(), problems, 2, SamplingParams())
    assert result["levels"]["1"]["pass_at_k_excluded"] == {"1": 0, "2": 0}
    assert "left out" not in format_reasoning_eval(result)
