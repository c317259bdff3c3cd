"""`rise-nemo report` puts several models' suite results side by side (suites.md)."""

from __future__ import annotations

from suite_helpers import reference_rows, run_cli, write_responses

from rise_nemo.evals import get_suite


def _score(name, rows, out, capsys, *extra):
    rc, _, err = run_cli(["score", "--suite", name, "--responses", rows, "--out", out, *extra], capsys)
    assert rc == 0, err


def test_two_models_side_by_side_with_judges_recorded(tmp_path, capsys):
    gsm = get_suite("gsm8k")
    items = gsm.load(None)
    good = write_responses(tmp_path / "good.jsonl", reference_rows(gsm, items))
    bad = write_responses(tmp_path / "bad.jsonl", reference_rows(gsm, items, shift=1))
    hh = get_suite("hh_win_rate")
    hh_rows = write_responses(tmp_path / "hh.jsonl", [(it.index, "A much longer reply than the chosen one, surely "
                                                       "longer than most of them are.") for it in hh.load(None)])
    _score("gsm8k", good, tmp_path / "model_a", capsys)
    _score("hh_win_rate", hh_rows, tmp_path / "model_a", capsys)
    _score("gsm8k", bad, tmp_path / "runs" / "model_b" / "eval" / "suites", capsys)  # a run dir's layout
    rc, out, err = run_cli(["report", tmp_path / "model_a", tmp_path / "runs" / "model_b", "--out", tmp_path / "rep"],
                           capsys)
    assert rc == 0, err
    table = (tmp_path / "rep" / "suites.md").read_text()
    assert "| model | gsm8k | hh_win_rate |" in table
    assert "| model_a | 100.0 (n=8) |" in table and "| model_b | 0.0 (n=8) | - |" in table
    assert "hh_win_rate: judge rule `rule`, prompt `rise-hh-pair-v1`" in table


def test_a_folder_without_runs_or_results_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc, _, err = run_cli(["report", tmp_path / "empty", "--out", tmp_path / "rep"], capsys)
    assert rc == 2 and "not a run directory" in err
