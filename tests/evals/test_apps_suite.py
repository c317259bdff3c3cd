"""apps: pass@1 by difficulty through the bubblewrap sandbox (skips only where bubblewrap is absent or
cannot start, except in CI, which installs it), and the one-line error without it."""

from __future__ import annotations

import json

import pytest
from suite_helpers import reference_rows, require_bwrap, run_cli, score_fields, write_responses

from rise_nemo.evals import get_suite


@pytest.fixture(scope="module")
def bwrap():
    require_bwrap()


def test_human_solutions_pass_and_wrong_programs_fail_by_difficulty(bwrap, tmp_path, capsys):
    suite = get_suite("apps")
    items = suite.load(None)
    assert [it.group for it in items] == ["interview", "interview", "competition", "introductory", "introductory"]
    rows = reference_rows(suite, items) + [(it.index, "```python\nprint(1)\n```") for it in items] + [
        (it.index, "```cpp\nint main() {}\n```") for it in items]  # no Python block: no_code
    path = write_responses(tmp_path / "r.jsonl", rows)
    rc, out, err = run_cli(["score", "--suite", "apps", "--responses", path, "--out", tmp_path], capsys)
    assert rc == 0, err
    fields = score_fields(out)
    assert fields["n"] == "5" and fields["score"] == "0.3333"
    assert json.loads((tmp_path / "apps.json").read_text())["score"] == pytest.approx(1 / 3)
    assert float(fields["pass@3"]) == 1.0 and fields["outcome_passed"] == "5" and fields["outcome_no_code"] == "5"
    saved = json.loads((tmp_path / "apps.json").read_text())
    assert saved["breakdown"] == {d: {"pass@1": pytest.approx(1 / 3), "n": n}
                                  for d, n in (("competition", 1), ("interview", 2), ("introductory", 2))}


def test_without_bubblewrap_the_suite_stops_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    import rise_nemo.judges.sandbox as sb

    monkeypatch.setattr(sb.shutil, "which", lambda name, *a, **k: None, raising=False)
    path = write_responses(tmp_path / "r.jsonl", [(i, "x") for i in range(5)])
    rc, out, err = run_cli(["score", "--suite", "apps", "--responses", path, "--out", tmp_path / "o"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "bubblewrap" in err.lower()
