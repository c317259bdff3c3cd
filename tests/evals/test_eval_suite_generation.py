"""`rise-nemo eval --suite NAME MODEL` end to end on CPU: a tiny random Qwen3 (tests/judges/tiny_qwen3.py)
generates with the local backend, then every suite scores it (rule judge; MC suites on our own rows; apps
in bubblewrap). Also: resume, and today's `rise-nemo eval` behaviour being untouched by the new options."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from suite_helpers import require_bwrap, run_cli, score_fields

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "judges"))

import tiny_qwen3  # noqa: E402
from test_mc_suites import gpqa_csv, medqa_jsonl  # noqa: E402

from rise_nemo.evals import SUITES  # noqa: E402

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return tiny_qwen3.build(tmp_path_factory.mktemp("tiny") / "tiny-qwen3", vocab_size=600)


def _data(name, tmp_path):
    if name == "gpqa_diamond":
        return ["--data", gpqa_csv(tmp_path / "g.csv", n=4)]
    if name == "medqa":
        return ["--data", medqa_jsonl(tmp_path / "m.jsonl", n=4)]
    return []


@pytest.mark.parametrize("name", list(SUITES))
def test_every_suite_end_to_end_with_the_tiny_model(name, tiny_model, tmp_path, capsys):
    if name == "apps":
        require_bwrap()
    out = tmp_path / "out"
    rc, stdout, err = run_cli(["eval", "--suite", name, tiny_model, "--samples", "2", "--max-new-tokens", "6",
                               "--limit", "2", "--out", out, "local.num_threads=1", *_data(name, tmp_path)], capsys)
    assert rc == 0, err
    fields = score_fields(stdout)
    assert fields["suite"] == name and fields["n"] == "2" and 0.0 <= float(fields["score"]) <= 1.0
    rows = [json.loads(line) for line in (out / f"{name}.responses.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == [0, 0, 1, 1]
    saved = json.loads((out / f"{name}.json").read_text())
    assert saved["info"]["generation"]["model"] == str(tiny_model) and saved["info"]["generation"]["samples"] == 2
    assert (out / f"{name}.md").is_file()
    # The responses file is the `score` input: scoring it again gives the same line.
    rc, again, err = run_cli(["score", "--suite", name, "--responses", out / f"{name}.responses.jsonl", "--partial",
                              "--out", tmp_path / "again", *_data(name, tmp_path)], capsys)
    assert rc == 0, err
    assert score_fields(again)["score"] == fields["score"]


def test_generation_resumes_and_samples_only_the_missing_problems(tiny_model, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["eval", "--suite", "aime", tiny_model, "--samples", "2", "--max-new-tokens", "4", "--out", out,
            "local.num_threads=1"]
    rc, _, err = run_cli([*args, "--limit", "2"], capsys)
    assert rc == 0, err
    responses = out / "aime.responses.jsonl"
    first = responses.read_text()
    with responses.open("a") as fh:  # an interrupted run: a partial problem at the end is sampled again
        fh.write(json.dumps({"index": 2, "response": "half"}) + "\n")  # 1 of 2 samples
    rc, stdout, err = run_cli([*args, "--limit", "3"], capsys)
    assert rc == 0, err
    assert "resuming: 2 of 3 problems already sampled" in err
    text = responses.read_text()
    assert text.startswith(first) and "half" not in text and score_fields(stdout)["n"] == "3"


def test_suite_option_errors_are_one_line(tiny_model, tmp_path, capsys):
    rc, _, err = run_cli(["eval", "--suite", "aime"], capsys)
    assert rc == 2 and "give MODEL" in err
    rc, _, err = run_cli(["eval", "--suite", "aime", tmp_path], capsys)
    assert rc == 2 and "neither a run directory" in err
    rc, _, err = run_cli(["eval", "--suite", "aime", tiny_model, "--out", tmp_path / "o", "model=x"], capsys)
    assert rc == 2 and "local.KEY=VALUE" in err
    rc, out, _ = run_cli(["eval", "--list-suites"], capsys)
    assert rc == 0 and "healthbench" in out
    rc, _, err = run_cli(["eval"], capsys)  # today's behaviour: a run directory or --config is needed
    assert rc == 2 and "give a RUN_DIR or --config" in err


@pytest.mark.slow
def test_a_run_directory_is_evaluated_at_its_checkpoint_and_reported(tiny_model, tmp_path, capsys):
    gsm8k = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "gsm8k_test_first8.jsonl"
    run = tmp_path / "run"
    rc, _, err = run_cli(["train", "--config", "grpo_gsm8k_local", f"local.model_path={tiny_model}",
                          f"data.train_path={gsm8k}", f"data.eval_path={gsm8k}", f"run.dir={run}", "train.steps=1",
                          "train.checkpoint_every=1", "train.progress=false", "sampling.prompts_per_step=2",
                          "sampling.group_size=2", "sampling.max_new_tokens=8", "eval.every=0", "eval.at_start=false",
                          "local.num_threads=1"], capsys)
    assert rc == 0, err
    rc, out, err = run_cli(["eval", "--suite", "gsm8k", run, "--limit", "2", "--max-new-tokens", "4"], capsys)
    assert rc == 0, err
    saved = json.loads((run / "eval" / "suites" / "gsm8k.json").read_text())
    gen = saved["info"]["generation"]
    assert gen["backend"] == "local" and gen["step"] == 1 and gen["checkpoint"].endswith("step_000001")
    rc, out, err = run_cli(["report", run], capsys)
    assert rc == 0, err
    report = (run / "report" / "report.md").read_text()
    assert "## Benchmark suites" in report
    assert re.search(r"\| run \| [0-9.]+ \(n=2\) \|", report)
