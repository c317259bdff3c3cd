"""Unit-test reward for code (``interfaces.Verifier``): a response's program against APPS-format tests.

The tests of a problem (``ReasoningProblem.answer``) are APPS's ``input_output`` JSON:
``{"inputs": [...], "outputs": [...], "fn_name": optional}`` (rise_nemo.data.apps writes it for every
layout it reads). Conventions are those of the APPS harness (Hendrycks et al. 2021, ``testing_util.py``):
- standard input/output problems (no ``fn_name``): the program reads the test's input on stdin; its stdout
  passes when it equals the expected output line by line with surrounding whitespace ignored, or token by
  token, numbers within ``np.allclose``'s tolerance (|a - b| <= 1e-8 + 1e-5 |b|);
- call-based problems (``fn_name``): the program defines ``fn_name`` (a function, or a method of
  LeetCode's ``class Solution``); it is called with the test's arguments and its return value passes when it
  equals the expected output, or the expected output's first element (APPS wraps many outputs in a list),
  tuples compared as lists, floats with the same tolerance;
- the standard import preamble (``APPS_PREAMBLE``: sys, math, itertools, collections, heapq, typing's
  List/Tuple, ...) is prepended to every program, as the APPS harness does.

Every test runs in its own sandbox process (rise_nemo.judges.sandbox) with a per-test time limit; a
rollout's tests run in order on one pool slot under a total time limit (tests not reached count as
``timeout``); rollouts run in parallel. Reward 1 iff every test passes. Each rollout's pass fraction and
outcome kind are logged and kept (``CodeResult``):
  passed, no_code, syntax_error, runtime_error, wrong_answer, timeout, memory, processes, output_limit
(the first failing test's kind; a syntax error stops the rollout's tests after the first); per step the
trainer logs their fractions and the mean pass fraction (``batch_metrics``). ``memory``: a MemoryError under
the per-process address-space limit, or the execution's cgroup memory cap hit; ``processes``: its cgroup's
cap on processes and threads hit (only with cgroups; without, a failed fork is the program's own error);
either cap kills the whole execution (rise_nemo.judges.sandbox).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rise_nemo.core.code_tests import CodeTests, parse_tests
from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.judges.sandbox import BubblewrapSandbox, ExecResult, SandboxLimits, SandboxPool

__all__ = ["APPS_PREAMBLE", "OUTCOMES", "CodeResult", "CodeTests", "CodeVerifier", "extract_code",
           "outputs_match", "parse_tests", "values_match"]

log = logging.getLogger(__name__)

OUTCOMES = ("passed", "no_code", "syntax_error", "runtime_error", "wrong_answer", "timeout", "memory",
            "processes", "output_limit")

# The APPS harness's import preamble (testing_util.py), numpy made optional (it is not always installed
# where the sandboxed interpreter lives).
APPS_PREAMBLE = """import sys
import time
import itertools
from itertools import accumulate, product, permutations, combinations
import collections
from collections import Counter, OrderedDict, deque, defaultdict, ChainMap
from functools import lru_cache
import math
from math import sqrt, sin, cos, tan, ceil, fabs, floor, gcd, exp, log, log2
import fractions
from typing import List, Tuple
try:
    import numpy as np
except ImportError:
    pass
import random
import heapq
from heapq import *
"""

# Runs a call-based solution: the candidate's prints are swallowed; the return value goes to the real
# stdout as one JSON line after the marker.
_CALL_HARNESS = """
import io as _io, json as _json, sys as _sys
_out = _sys.stdout
_args = _json.loads(_sys.stdin.read())
_sys.stdout = _io.StringIO()
_ns = {{"__name__": "__solution__"}}
exec(compile({source!r}, "<solution>", "exec"), _ns)
_fn = _ns.get({fn!r})
if _fn is None and isinstance(_ns.get("Solution"), type):
    _fn = getattr(_ns["Solution"](), {fn!r})
if _fn is None:
    raise NameError("the program defines no function named " + {fn!r})
_value = _fn(*_args)
_sys.stdout = _out
print({marker!r} + _json.dumps(_value, default=repr))
"""
_MARKER = "\x00rise-nemo-return:"

_FENCE = re.compile(r"```(.*?)(?:```|\Z)", re.DOTALL)
_TAG_LINE = re.compile(r"[ \t]*([A-Za-z][\w+#.-]*)?[ \t]*\n")  # a language tag alone on the fence's line
_TAG_INLINE = re.compile(r"[ \t]*(python3?|py)[ \t]+(?=\S)", re.IGNORECASE)  # "``` python print ( 1 ) ```"
_PYTHON_TAGS = {"", "python", "py", "python3"}


def _split_tag(body: str) -> tuple[str, str]:
    for pattern in (_TAG_LINE, _TAG_INLINE):
        m = pattern.match(body)
        if m:
            return (m.group(1) or "").lower(), body[m.end():]
    return "", body


def extract_code(response: str) -> str | None:
    """The program in a response: the last fenced Python block (```python / ```py / bare ```; an unclosed
    last fence, as in a truncated generation, runs to the end; the tag may share the line with the code,
    as word-level tokenizers decode it), else the whole response as bare code. None when there is nothing
    but whitespace. The one place code is taken out of responses."""
    blocks = [_split_tag(body) for body in _FENCE.findall(response)]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    if python:
        code = python[-1]
    elif blocks:
        return None  # fenced, but only in other languages
    else:
        code = response
    return code if code.strip() else None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-8 + 1e-5 * abs(b)  # numpy.allclose's default tolerance, as APPS uses


def _float(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def outputs_match(got: str, expected: str) -> bool:
    """stdout vs expected output with APPS's tolerance: lines with outer whitespace ignored, or tokens,
    numbers within tolerance."""
    lines = [ln.strip() for ln in got.strip().splitlines()]
    want = [ln.strip() for ln in expected.strip().splitlines()]
    if lines == want:
        return True
    tokens, want_tokens = got.split(), expected.split()
    if tokens == want_tokens:
        return True
    if len(tokens) != len(want_tokens):
        return False
    for a, b in zip(tokens, want_tokens):
        if a == b:
            continue
        fa, fb = _float(a), _float(b)
        if fa is None or fb is None or not _close(fa, fb):
            return False
    return True


def values_match(got: Any, expected: Any) -> bool:
    """A call-based return value vs the expected output (or its first element, APPS's wrapping)."""
    if _equal(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _equal(got, expected[0])


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (math.isfinite(a) and math.isfinite(b) and _close(float(a), float(b)))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


@dataclass(frozen=True)
class TestOutcome:
    kind: str  # one of OUTCOMES
    reason: str  # one line: what happened


@dataclass(frozen=True)
class CodeResult:
    reward: float  # 1.0 iff every test passed
    passed: int
    total: int
    outcome: str  # "passed" or the first failing test's kind
    reason: str
    tests: tuple[TestOutcome, ...] = field(default=())

    @property
    def pass_fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def _last_line(stderr: bytes) -> str:
    lines = [ln for ln in stderr.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


_SYNTAX = ("SyntaxError", "IndentationError", "TabError")


def classify(res: ExecResult) -> TestOutcome | None:
    """The failure kind of one execution, or None when it ran to a clean exit (then compare outputs)."""
    last = _last_line(res.stderr)
    if res.limit in ("memory", "processes"):  # its cgroup's cap: the whole execution was killed
        return TestOutcome(res.limit, res.reason)
    if res.timed_out:
        return TestOutcome("timeout", res.reason)
    if res.output_limited:
        return TestOutcome("output_limit", res.reason)
    if res.signal_name in ("SIGXCPU", "SIGKILL"):
        return TestOutcome("timeout", f"CPU time limit: {res.reason}")
    if res.signal_name == "SIGXFSZ":
        return TestOutcome("output_limit", f"file size limit: {res.reason}")
    if res.returncode == 0:
        return None
    if last.startswith(_SYNTAX):
        return TestOutcome("syntax_error", last)
    if last.startswith("MemoryError") or "Cannot allocate memory" in last:
        return TestOutcome("memory", last or res.reason)
    return TestOutcome("runtime_error", f"{res.reason}: {last}" if last else res.reason)


class CodeReward:
    """The unit-test reward's bookkeeping over a ``grade`` that runs the tests somewhere: ``verify`` (reward 1
    iff all tests pass; None only where a problem's tests cannot be read), the outcome counters and the
    step's ``batch_metrics``. ``CodeVerifier`` grades on a local sandbox pool; ``judges.ray_actor.
    RayCodeVerifier`` on a pool of Ray actors, each holding a CodeVerifier."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()  # over this verifier's lifetime
        self.last_results: list[CodeResult | None] = []
        self._lock = threading.Lock()

    def grade(self, responses: Sequence[str], tests: Sequence[CodeTests | None]) -> list[CodeResult | None]:
        raise NotImplementedError

    def close(self) -> None:
        return None

    def verify(self, problems: Sequence[ReasoningProblem], responses: Sequence[str]) -> list[bool | None]:
        if len(problems) != len(responses):
            raise ValueError(f"verify: {len(problems)} problems but {len(responses)} responses")
        specs: list[CodeTests | None] = []
        for p in problems:
            try:
                specs.append(parse_tests(p.answer))
            except (ValueError, json.JSONDecodeError) as exc:
                log.warning("CodeVerifier: problem %s: unreadable tests (%s)", p.prompt_id, exc)
                specs.append(None)
        results = self.grade(responses, specs)
        with self._lock:
            self.last_results = results
            for p, r in zip(problems, results):
                if r is None:
                    continue
                self.outcomes[r.outcome] += 1
                log.info("code reward %s: %s %d/%d tests (%s)", p.prompt_id, r.outcome, r.passed, r.total, r.reason)
        return [None if r is None else r.reward == 1.0 for r in results]

    def batch_metrics(self) -> dict[str, float]:
        """Of the last ``verify`` call's gradable rollouts: the mean pass fraction and the fraction of each
        outcome kind (``code/outcome/<kind>``, every kind, summing to 1); the step's metrics include them."""
        graded = [r for r in self.last_results if r is not None]
        if not graded:
            return {}
        out = {"code/pass_fraction": sum(r.pass_fraction for r in graded) / len(graded)}
        counts = Counter(r.outcome for r in graded)
        out.update({f"code/outcome/{kind}": counts[kind] / len(graded) for kind in OUTCOMES})
        return out


class CodeVerifier(CodeReward):
    """``interfaces.Verifier`` for code: reward 1 iff the response's program passes all its problem's tests.

    ``per_test_seconds`` / ``total_seconds``: wall-clock limits per test and per rollout; ``limits``: the
    sandbox's other limits (memory, processes, output; its wall/CPU seconds are set per test);
    ``workers``: parallel sandbox slots (bounded queue; default one per CPU, at most 32); ``preamble``:
    prepend ``APPS_PREAMBLE``.
    ``verify`` returns None (left out of rewards, like an undecided judge) only when a problem's tests
    cannot be read; every program failure is False with its outcome kind in ``last_results``/``outcomes``.
    """

    def __init__(self, per_test_seconds: float = 4.0, total_seconds: float = 30.0, workers: int | None = None,
                 limits: SandboxLimits | None = None, preamble: bool = True,
                 sandbox: BubblewrapSandbox | None = None):
        super().__init__()
        if per_test_seconds <= 0 or total_seconds <= 0:
            raise ValueError("per_test_seconds and total_seconds must be > 0")
        self.per_test_seconds = float(per_test_seconds)
        self.total_seconds = float(total_seconds)
        self.preamble = APPS_PREAMBLE if preamble else ""
        self._own_sandbox = sandbox is None
        self.sandbox = sandbox or BubblewrapSandbox(limits or SandboxLimits(memory_mb=1024))
        self.sandbox.check()
        self.pool = SandboxPool(self.sandbox, workers=workers or min(32, os.cpu_count() or 1))

    def close(self) -> None:
        self.pool.close()
        if self._own_sandbox:  # its launches prepared for next executions, with their cgroups
            self.sandbox.close()

    def programs(self, code: str, tests: CodeTests) -> list[tuple[str, str]]:
        """(program, stdin) per test: the stdin program itself, or the call harness with JSON arguments."""
        if tests.fn_name is None:
            source = self.preamble + code
            return [(source, text) for text in tests.inputs]
        harness = _CALL_HARNESS.format(source=self.preamble + code, fn=tests.fn_name, marker=_MARKER)
        return [(harness, json.dumps(args)) for args in tests.inputs]

    def _check(self, res: ExecResult, expected: Any, call_based: bool) -> TestOutcome:
        failed = classify(res)
        if failed is not None:
            return failed
        out = res.stdout.decode("utf-8", errors="replace")
        if call_based:
            _, sep, tail = out.rpartition(_MARKER)
            if not sep:
                return TestOutcome("wrong_answer", "no return value")
            try:
                value = json.loads(tail)
            except json.JSONDecodeError:
                return TestOutcome("wrong_answer", "return value is not JSON")
            ok = values_match(value, expected)
            return TestOutcome("passed" if ok else "wrong_answer", "" if ok else f"returned {tail.strip()[:80]}")
        ok = outputs_match(out, expected)
        return TestOutcome("passed" if ok else "wrong_answer", "" if ok else f"printed {out.strip()[:80]!r}")

    def run_tests(self, sandbox: BubblewrapSandbox, slot: int, code: str, tests: CodeTests) -> CodeResult:
        """All tests of one program, in order, on one sandbox slot, under the total time limit."""
        deadline = time.monotonic() + self.total_seconds
        outcomes: list[TestOutcome] = []
        for (program, stdin), expected in zip(self.programs(code, tests), tests.outputs):
            left = deadline - time.monotonic()
            if left <= 0:
                outcomes.append(TestOutcome("timeout", f"total time limit ({self.total_seconds:g}s) reached"))
                continue
            wall = min(self.per_test_seconds, left)
            limits = replace(sandbox.limits, wall_seconds=wall, cpu_seconds=max(1, math.ceil(wall)))
            outcome = self._check(sandbox.run_python(program, stdin, limits, slot=slot), expected,
                                  tests.fn_name is not None)
            outcomes.append(outcome)
            if outcome.kind == "syntax_error":  # every other test would fail the same way
                outcomes += [outcome] * (len(tests.outputs) - len(outcomes))
                break
        return _summary(outcomes)

    def grade(self, responses: Sequence[str], tests: Sequence[CodeTests | None]) -> list[CodeResult | None]:
        """Grade responses (in parallel on the pool); None where the tests are None."""
        futures: list[Any] = []
        for response, spec in zip(responses, tests):
            code = extract_code(response)
            if spec is None:
                futures.append(None)
            elif code is None:
                out = TestOutcome("no_code", "no Python code in the response")
                futures.append(_summary([out] * len(spec.outputs)))
            else:
                futures.append(self.pool.submit_task(
                    lambda sandbox, slot, c=code, s=spec: self.run_tests(sandbox, slot, c, s)))
        return [f if f is None or isinstance(f, CodeResult) else f.result() for f in futures]


def _summary(outcomes: list[TestOutcome]) -> CodeResult:
    passed = sum(o.kind == "passed" for o in outcomes)
    first = next((o for o in outcomes if o.kind != "passed"), None)
    if first is None:
        return CodeResult(1.0, passed, len(outcomes), "passed", "all tests passed", tuple(outcomes))
    return CodeResult(0.0, passed, len(outcomes), first.kind, first.reason, tuple(outcomes))
