"""APPS-format unit tests of a code problem (no I/O): the data model the APPS loader writes into
``ReasoningProblem.answer`` and the code reward (rise_nemo.judges.code_verifier) reads back.

APPS's ``input_output``: ``{"inputs": [...], "outputs": [...], "fn_name": optional}``. Without ``fn_name`` an
input is a program's stdin and an output its expected stdout (text; a list of lines is joined); with it an
input is the list of call arguments and an output the expected return value (APPS often wraps it in a
one-element list).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["CodeTests", "parse_tests"]


@dataclass(frozen=True)
class CodeTests:
    inputs: list[Any]
    outputs: list[Any]
    fn_name: str | None = None

    def to_json(self) -> str:
        spec: dict[str, Any] = {"inputs": self.inputs, "outputs": self.outputs}
        if self.fn_name:
            spec["fn_name"] = self.fn_name
        return json.dumps(spec)


def parse_tests(spec: str | dict) -> CodeTests:
    """APPS ``input_output`` (JSON text or dict) -> CodeTests; ValueError naming what is wrong."""
    data = json.loads(spec) if isinstance(spec, str) else spec
    if not isinstance(data, dict):
        raise ValueError(f"input_output: expected a JSON object, got {type(data).__name__}")
    inputs, outputs, fn = data.get("inputs"), data.get("outputs"), data.get("fn_name")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("input_output: 'inputs' and 'outputs' must be lists")
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"input_output: {len(inputs)} inputs vs {len(outputs)} outputs (need >= 1 of each, equal)")
    if fn is not None and (not isinstance(fn, str) or not fn.isidentifier()):
        raise ValueError(f"input_output: 'fn_name' must be a Python identifier, got {fn!r}")
    if fn:
        bad = [i for i, args in enumerate(inputs) if not isinstance(args, list)]
        if bad:
            raise ValueError(f"input_output: call-based inputs must be argument lists (test {bad[0]})")
    else:
        inputs = [_as_text(x) for x in inputs]
        outputs = [_as_text(x) for x in outputs]
    return CodeTests(inputs, outputs, fn)


def _as_text(value: Any) -> str:
    if isinstance(value, list):  # some APPS rows give stdin/stdout as a list of lines
        return "\n".join(str(v) for v in value)
    return str(value)
