"""Code reward pieces that need no sandbox: code extraction, APPS output comparison, test parsing."""

from __future__ import annotations

import json

import pytest

from rise_nemo.judges.code_verifier import CodeTests, extract_code, outputs_match, parse_tests, values_match


@pytest.mark.parametrize("response, code", [
    ("Here:\n```python\nprint(1)\n```\n", "print(1)\n"),
    ("```py\na = 1\n```\nthen\n```python\nprint(2)\n```", "print(2)\n"),  # the last python block
    ("```\nprint(3)\n```", "print(3)\n"),  # untagged fence
    ("print(4)\n", "print(4)\n"),  # bare code
    ("Sure.\n```python\nprint(5)\n", "print(5)\n"),  # unclosed last fence (truncated generation)
    ("```cpp\nint main(){}\n```", None),  # fenced, but not Python
    ("   \n", None),
    ("```python\n\n```", None),
    ("``` python print ( input ()[::- 1 ]) ```", "print ( input ()[::- 1 ]) "),  # word-level decode
    ("```print(6)```", "print(6)"),
])
def test_extract_code(response, code):
    assert extract_code(response) == code


@pytest.mark.parametrize("got, expected, ok", [
    ("1 2 3\n", "1 2 3", True),
    ("  1 2 3  \n\n\n", "1 2 3\n", True),
    ("1\n2\n", "1 2", True),  # token by token
    ("0.3333333\n", "0.33333333333", True),  # allclose tolerance
    ("0.334\n", "0.333", False),
    ("1 2\n", "1 2 3", False),
    ("YES\n", "yes", False),
    ("", "0", False),
    ("nan", "nan", True),  # identical tokens
    ("inf", "1e308", False),
])
def test_outputs_match(got, expected, ok):
    assert outputs_match(got, expected) is ok


@pytest.mark.parametrize("got, expected, ok", [
    (9, 9, True), (9, [9], True), ([1, 2], [[1, 2]], True), ([1, 2], [1, 2], True),
    (0.1 + 0.2, [0.3], True), (True, [True], True), (1, [True], False), (True, 1, False),
    ("a", ["b"], False), (None, [""], False), ({"a": [1, 2]}, [{"a": [1, 2]}], True), ([1], [1, 2], False),
])
def test_values_match(got, expected, ok):
    assert values_match(got, expected) is ok


def test_parse_tests_roundtrip_and_errors():
    tests = parse_tests(json.dumps({"inputs": [[1, 2]], "outputs": [3], "fn_name": "add"}))
    assert tests == CodeTests([[1, 2]], [3], "add") and parse_tests(tests.to_json()) == tests
    assert parse_tests({"inputs": [["1", "2"]], "outputs": [["3"]]}) == CodeTests(["1\n2"], ["3"])  # line lists
    for bad, msg in [({"inputs": [1], "outputs": []}, "1 inputs vs 0 outputs"),
                     ({"inputs": [], "outputs": []}, "need >= 1"),
                     ({"inputs": ["x"], "outputs": ["y"], "fn_name": "a b"}, "fn_name"),
                     ({"inputs": ["x"], "outputs": ["y"], "fn_name": "f"}, "argument lists"),
                     ([1], "JSON object")]:
        with pytest.raises(ValueError, match=msg):
            parse_tests(bad)
