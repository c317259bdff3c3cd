"""Answer verifiers (``interfaces.Verifier``): sparse correctness of a response's final answer.

``MathVerifier`` checks math answers with Hugging Face's ``math-verify`` the way NeMo-RL's math environment
does (nemo_rl/environments/math_environment.py, ``HFVerifyWorker``): the reference answer is wrapped in
``\\boxed{...}`` and parsed as LaTeX; the response is parsed with both the plain-expression and the LaTeX
extractors (the last ``\\boxed{}``, "the final answer is ...", a trailing number, ...); the response is
correct when any extracted prediction equals the gold symbolically (fractions, decimals, sets, intervals,
LaTeX vs plain text: ``\\frac{1}{2}`` == ``0.5`` == ``1/2``).

Where NeMo-RL scores every failure 0, the Verifier protocol separates "wrong" from "could not decide":
- no answer can be extracted from the response          -> False (the response states no answer);
- the reference answer cannot be parsed                 -> None (a data problem, never a zero reward);
- math-verify times out or raises inside sympy          -> None.
``None`` responses are left out of rewards and pass@k, as unknown judge verdicts are.

Timeouts: math-verify bounds parsing and comparison with ``signal.alarm`` (whole seconds, main thread only),
as in NeMo-RL's verify workers, which run in the main thread of a Ray actor. Called from another thread the
verifier cannot use alarms; it then runs without them and says so once in the log.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from rise_nemo.core.problem import ReasoningProblem

__all__ = ["MathVerifier", "MATH_EXTRA"]

log = logging.getLogger(__name__)

MATH_EXTRA = "math"  # pip install 'rise_nemo[math]'


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:  # optional dependency
        raise ImportError(
            f"MathVerifier needs the math-verify package: pip install 'rise_nemo[{MATH_EXTRA}]'"
        ) from exc
    return math_verify


class MathVerifier:
    """``interfaces.Verifier`` on math-verify (NeMo-RL's ``hf_math_verify`` settings).

    ``timeout_seconds``: bound on each parse and each comparison (math-verify's default, 5; 0 disables).
    ``precision``: decimal places for numeric equality (math-verify's default, 6).
    """

    def __init__(self, timeout_seconds: int = 5, precision: int = 6):
        if int(timeout_seconds) != timeout_seconds or timeout_seconds < 0:
            raise ValueError(f"timeout_seconds must be a whole number >= 0 (signal.alarm), got {timeout_seconds!r}")
        mv = _math_verify()
        from math_verify.errors import TimeoutException

        self._mv = mv
        self._timeout_exc = TimeoutException
        self.timeout_seconds = int(timeout_seconds)
        self.precision = int(precision)
        # nemo_rl/environments/math_environment.py HFVerifyWorker: gold LaTeX; prediction expression + LaTeX.
        self._gold_targets = (mv.LatexExtractionConfig(),)
        self._pred_targets = (mv.ExprExtractionConfig(), mv.LatexExtractionConfig())
        self._warned_thread = False
        self.undecided = 0  # answers math-verify could not decide (None), over this verifier's lifetime
        logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it warns on every answer-less response

    def _timeout(self) -> int | None:
        if self.timeout_seconds == 0:
            return None
        if threading.current_thread() is not threading.main_thread():
            if not self._warned_thread:
                log.warning("MathVerifier called off the main thread: math-verify's signal.alarm timeouts are "
                            "unavailable there, verifying without a time limit")
                self._warned_thread = True
            return None
        return self.timeout_seconds

    def verify_one(self, answer: str, response: str) -> bool | None:
        """Does ``response`` state ``answer``? None when math-verify cannot decide."""
        mv, timeout = self._mv, self._timeout()
        try:
            gold = mv.parse("\\boxed{" + answer + "}", self._gold_targets, parsing_timeout=timeout)
            if not gold:
                log.warning("MathVerifier: cannot parse the reference answer %r", answer[:200])
                return None
            preds = mv.parse(response, self._pred_targets, parsing_timeout=timeout)
            if not preds:
                return False
            return bool(mv.verify(gold, preds, float_rounding=self.precision, timeout_seconds=timeout))
        except (Exception, self._timeout_exc) as exc:  # TimeoutException derives from BaseException
            log.debug("MathVerifier: undecided (%s: %s)", type(exc).__name__, exc)
            return None

    def verify(self, problems: Sequence[ReasoningProblem], responses: Sequence[str]) -> list[bool | None]:
        if len(problems) != len(responses):
            raise ValueError(f"verify: {len(problems)} problems but {len(responses)} responses")
        out = [self.verify_one(p.answer, r) for p, r in zip(problems, responses)]
        self.undecided += sum(v is None for v in out)
        return out
