"""MathVerifier (math-verify, NeMo-RL's hf_math_verify settings) on real answers and on the loaders' data."""

import sys
import threading
from pathlib import Path

import pytest

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.data.reasoning import load_reasoning_problems
from rise_nemo.interfaces import Verifier

pytest.importorskip("math_verify")

from rise_nemo.judges.verifiers import MathVerifier  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"


def _problem(answer: str) -> ReasoningProblem:
    return ReasoningProblem("p", ({"role": "user", "content": "q"},), "ref", answer)


@pytest.fixture(scope="module")
def verifier():
    return MathVerifier()


@pytest.mark.parametrize(
    "answer, response, want",
    [
        ("\\frac{1}{2}", "So the probability is $\\boxed{\\frac{1}{2}}$.", True),
        ("\\frac{1}{2}", "The answer is \\boxed{0.5}", True),
        ("\\frac{1}{2}", "The answer is \\boxed{1/2}", True),
        ("\\frac{1}{2}", "The answer is \\boxed{\\dfrac{2}{4}}", True),
        ("\\frac{1}{2}", "The answer is \\boxed{\\frac{1}{3}}", False),
        ("0.5", "Final answer: $\\frac{1}{2}$", True),
        ("18", "She makes 9 * 2 = $18 every day.\nThe final answer is 18", True),
        ("18", "The final answer is \\boxed{18}.", True),
        ("18", "The final answer is \\boxed{17}.", False),
        ("70000", "So he made a profit of $70,000.\nThe final answer is \\boxed{70,000}", True),
        ("5\\sqrt{2}", "$\\sqrt{50} = \\boxed{\\sqrt{50}}$", True),
        ("5\\sqrt{2}", "\\boxed{5 \\sqrt 2}", True),
        ("5\\sqrt{2}", "\\boxed{7.07}", False),
        ("\\left\\{-2, 2\\right\\}", "The roots are \\boxed{\\{2, -2\\}}", True),
        ("(1, 3]", "x is in \\boxed{(1,3]}", True),
        ("(1, 3]", "x is in \\boxed{[1,3]}", False),
        ("x^2 + 2x + 1", "\\boxed{(x+1)^2}", True),
        ("3", "a first try $\\boxed{2}$, then the final $\\boxed{3}$.", True),  # the last box counts
        ("3", "I am not sure.", False),
    ],
)
def test_real_answers(verifier, answer, response, want):
    assert verifier.verify([_problem(answer)], [response]) == [want]


def test_implements_the_protocol_and_checks_lengths(verifier):
    assert isinstance(verifier, Verifier)
    with pytest.raises(ValueError, match="2 problems but 1 responses"):
        verifier.verify([_problem("1"), _problem("2")], ["1"])


def test_every_reference_solution_verifies_against_its_answer(verifier):
    """The loaders' answers are what the verifier reads back out of the reference solutions."""
    for name in ("gsm8k_test_first8.jsonl", "math_sample.jsonl", "reasoning_sample.jsonl"):
        problems, _ = load_reasoning_problems(FIXTURES / name)
        got = verifier.verify(problems, [p.reference_solution for p in problems])
        assert got == [True] * len(problems), name
        wrong = verifier.verify(problems, ["The final answer is \\boxed{123456789}."] * len(problems))
        assert wrong == [False] * len(problems), name


def test_unparseable_reference_is_undecided_not_wrong(verifier):
    before = verifier.undecided
    assert verifier.verify([_problem("")], ["\\boxed{1}"]) == [None]
    assert verifier.undecided == before + 1


def test_works_off_the_main_thread():
    v = MathVerifier()
    out = []
    t = threading.Thread(target=lambda: out.append(v.verify([_problem("\\frac{1}{2}")], ["\\boxed{0.5}"])))
    t.start()
    t.join()
    assert out == [[True]]


def test_bad_timeout():
    with pytest.raises(ValueError, match="whole number"):
        MathVerifier(timeout_seconds=0.5)


def test_missing_package_names_the_extra(monkeypatch):
    import rise_nemo.judges.verifiers as mod

    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ImportError, match=r"rise_nemo\[math\]"):
        mod.MathVerifier()
