"""A user's first hour: resume safety and locking, one-line errors before any model build, the
judge probe, CLI ergonomics, judge counters and samples.jsonl — through the real `rise-nemo` commands."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "orchestration"))

import tiny_task  # noqa: E402

from rise_nemo.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FAST = ["eval.every=0", "eval.at_start=false", "eval.samples_per_prompt=2", "train.log_samples=3"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return tiny_task.build_tokenizer(tmp_path_factory.mktemp("safety_tok"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tokenizer_dir):
    """A finished 2-step RISE-RL run made by `rise-nemo train` (guidance still on: switch_step is 3)."""
    root = tmp_path_factory.mktemp("safety")
    recipe = tiny_task.write_recipe(root / "recipe", tokenizer_dir, root / "run", "rise")
    assert main(["train", "--config", str(recipe), "train.steps=2", *FAST]) == 0
    return recipe, root / "run"


@pytest.fixture
def run_copy(finished, tmp_path):
    recipe, run = finished
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return recipe, copy


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("[rise-nemo]")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_model_build(monkeypatch):
    """Fail the test if a backend is built: every check below must come before that."""
    import rise_nemo.backends

    def refuse(cfg):
        raise AssertionError("a model was built before the error was reported")

    monkeypatch.setattr(rise_nemo.backends, "build_backend", refuse)


# -- 1. resume under a changed config ---------------------------------------------------------------------

def test_resume_with_a_changed_config_is_refused_naming_each_key(run_copy, capsys, no_model_build):
    recipe, run = run_copy
    config_before = (run / "config.yaml").read_text()
    metrics_before = (run / "metrics.jsonl").read_text()
    rc = main(["train", "--config", str(recipe), "--run-dir", str(run), *FAST, "train.steps=3",
               "sampling.group_size=2", "local.lr=0.05"])
    assert rc == 2
    line = _one_line(capsys.readouterr().err)
    assert "sampling.group_size: 4 -> 2" in line and "local.lr: 0.001 -> 0.05" in line, line
    assert "train.steps" not in line.split("resuming with a changed config:")[1].split("(only")[0]
    assert "--allow-config-change" in line
    assert (run / "config.yaml").read_text() == config_before  # nothing written
    assert (run / "metrics.jsonl").read_text() == metrics_before


def test_a_resume_safe_change_continues_and_an_allowed_change_is_recorded(run_copy, capsys):
    recipe, run = run_copy
    assert main(["train", "--config", str(recipe), "--run-dir", str(run), *FAST, "train.steps=3"]) == 0
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["steps"] == 3
    assert (run / "config_history" / "config.0.yaml").is_file()  # the 2-step version is kept
    rc = main(["train", "--config", str(recipe), "--run-dir", str(run), *FAST, "train.steps=4", "local.lr=0.05",
               "--allow-config-change"])
    assert rc == 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["local"]["lr"] == 0.05 and cfg["train"]["steps"] == 4
    old = yaml.safe_load((run / "config_history" / "config.1.yaml").read_text())
    assert old["local"]["lr"] == 0.001
    changes = [json.loads(x) for x in (run / "config_history" / "changes.jsonl").read_text().splitlines()]
    assert {"from_step": 3, "key": "local.lr", "old": 0.001, "new": 0.05,
            "previous": "config_history/config.1.yaml"} in changes
    assert "config change from step 4: local.lr: 0.001 -> 0.05" in (run / "train.log").read_text()


def test_a_resumed_optimiser_uses_the_configured_learning_rate(tokenizer_dir, tmp_path):
    from rise_nemo.backends import build_backend
    from rise_nemo.config import config_from_dict

    def policy(lr):
        tree = tiny_task.recipe(tokenizer_dir, tmp_path)
        tree["local"]["lr"] = lr
        return build_backend(config_from_dict(tree))[0]

    state = policy(1e-3).state_dict()
    resumed = policy(0.05)
    resumed.load_state_dict(state)
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [0.05]


# -- 2. a refused method change writes nothing --------------------------------------------------------------

def test_a_method_change_is_refused_before_anything_is_written(run_copy, tokenizer_dir, tmp_path, capsys,
                                                              no_model_build):
    _, run = run_copy
    other = tiny_task.write_recipe(tmp_path / "other", tokenizer_dir, run, "rubric_rl")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    assert main(["train", "--config", str(other), *FAST, "train.steps=2"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "'rise'" in line and "'rubric_rl'" in line and "method" in line
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before


# -- 3. one trainer per run directory -----------------------------------------------------------------------

def test_a_second_training_on_a_locked_run_directory_is_refused(run_copy, capsys):
    import rise_nemo.backends

    recipe, run = run_copy
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from rise_nemo.loop.rundir import RunDirLock; "
         f"lock = RunDirLock({str(run)!r}).acquire(); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = (run / "metrics.jsonl").read_text()
        with pytest.MonkeyPatch.context() as mp:  # refused before any model is built
            mp.setattr(rise_nemo.backends, "build_backend", None)
            assert main(["train", "--config", str(recipe), "--run-dir", str(run), *FAST, "train.steps=3"]) == 2
        line = _one_line(capsys.readouterr().err)
        assert f"run directory {run} is in use by pid {holder.pid}" in line, line
        assert (run / "metrics.jsonl").read_text() == before
    finally:
        holder.communicate("", timeout=30)
    # The holder is gone: the kernel dropped its lock, so a requeue after a crash is never blocked.
    assert main(["train", "--config", str(recipe), "--run-dir", str(run), *FAST, "train.steps=3"]) == 0


# -- 4. every user error: one line, exit 2, before any model is built ----------------------------------------

def _jsonl_recipe(tmp_path, tokenizer_dir, train_file: Path | str) -> Path:
    recipe = tiny_task.write_recipe(tmp_path / "r", tokenizer_dir, tmp_path / "run")
    tree = yaml.safe_load(recipe.read_text())
    tree["data"]["train_path"] = str(train_file)
    recipe.write_text(yaml.safe_dump(tree))
    return recipe


def _good_lines(tmp_path) -> list[str]:
    return tiny_task.write_jsonl(tmp_path / "good.jsonl", tiny_task.make_prompts(3)).read_text().splitlines()


@pytest.mark.parametrize("case", ["truncated", "bad_points", "empty", "not_utf8"])
def test_data_errors_name_the_file_and_line(case, tmp_path, tokenizer_dir, capsys, no_model_build):
    lines = _good_lines(tmp_path)
    data = tmp_path / "train.jsonl"
    if case == "truncated":
        data.write_text("\n".join(lines[:2] + [lines[2][: len(lines[2]) // 2]]) + "\n")
        expect = f"{data}:3: malformed JSON"
    elif case == "bad_points":
        row = json.loads(lines[1])
        row["rubric"][0]["points"] = "five"
        data.write_text("\n".join([lines[0], json.dumps(row)]) + "\n")
        expect = f"{data}:2: key 'rubric[0].points'"
    elif case == "empty":
        data.write_text("")
        expect = f"{data}: no records (the file is empty)"
    else:
        data.write_bytes(lines[0].encode() + b"\n" + "caf\u00e9".encode("latin-1") + b"\n")
        expect = f"{data}:2: not UTF-8 text"
    rc = main(["train", "--config", str(_jsonl_recipe(tmp_path, tokenizer_dir, data))])
    assert rc == 2
    assert expect in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_missing_data_file_names_the_variable_that_sets_it(tmp_path, tokenizer_dir, capsys, no_model_build,
                                                             monkeypatch):
    monkeypatch.delenv("RISE_TEST_TRAIN_DATA", raising=False)
    recipe = _jsonl_recipe(tmp_path, tokenizer_dir, "${oc.env:RISE_TEST_TRAIN_DATA,data/train.jsonl}")
    assert main(["train", "--config", str(recipe)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "data.train_path" in line and "data/train.jsonl" in line and "$RISE_TEST_TRAIN_DATA" in line


def test_a_data_path_that_is_a_directory_says_so_naming_the_key_once(tmp_path, tokenizer_dir, capsys,
                                                                     no_model_build):
    """A folder was reported as "file not found", and the key twice ("(set data.train_path)")."""
    folder = tmp_path / "data_dir"
    folder.mkdir()
    recipe = _jsonl_recipe(tmp_path, tokenizer_dir, str(folder))
    assert main(["train", "--config", str(recipe)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"'data.train_path': {folder} is a directory, not a data file" in line, line
    assert line.count("data.train_path") == 1 and "not found" not in line
    assert main(["train", "--config", str(recipe), f"data.train_path={tmp_path / 'nope.jsonl'}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.count("data.train_path") == 1 and f"file not found: {tmp_path / 'nope.jsonl'}" in line, line


def test_train_prints_the_absolute_run_directory_at_the_end(finished, tmp_path, capsys, monkeypatch):
    recipe, _ = finished
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", str(recipe), "--run-dir", "rel_run", "train.steps=1", *FAST]) == 0
    assert f"run directory: {tmp_path / 'rel_run'}\n" in capsys.readouterr().out


JUDGE = ["judge.type=http", "++judge.base_urls=[http://127.0.0.1:9/v1]", "++judge.model=m", "++judge.ray_actor=false"]


@pytest.mark.parametrize("case", ["api_key", "unset_api_key_env", "run_dir_is_a_file", "opd"])
def test_config_errors_are_one_line_before_any_model_build(case, tmp_path, tokenizer_dir, capsys, no_model_build,
                                                           monkeypatch):
    recipe = tiny_task.write_recipe(tmp_path / "r", tokenizer_dir, tmp_path / "run")
    args = ["train", "--config", str(recipe)]
    if case == "api_key":
        args += [*JUDGE, "++judge.api_key=sk-secret-123"]
        expect = "api_key_env"
    elif case == "unset_api_key_env":
        monkeypatch.delenv("RISE_TEST_UNSET_KEY", raising=False)
        args += [*JUDGE, "++judge.api_key_env=RISE_TEST_UNSET_KEY"]
        expect = "RISE_TEST_UNSET_KEY"
    elif case == "run_dir_is_a_file":
        (tmp_path / "file").write_text("x")
        args += ["--run-dir", str(tmp_path / "file")]
        expect = f"run directory {tmp_path / 'file'} exists and is not a directory"
    else:
        args += ["method=opd"]
        expect = "'opd'"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert expect in _one_line(err) and "sk-secret-123" not in err
    assert not (tmp_path / "run").exists()


def test_eval_names_an_unknown_checkpoint_and_lists_the_real_ones(finished, capsys, no_model_build):
    _, run = finished
    assert main(["eval", str(run), "--checkpoint", "step_99"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "--checkpoint step_99" in line and "step_000002" in line


# -- 5. a judge that is down at start -----------------------------------------------------------------------

def test_a_judge_that_is_down_at_start_is_named_with_its_error(tmp_path, tokenizer_dir, capsys, no_model_build):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    recipe = tiny_task.write_recipe(tmp_path / "r", tokenizer_dir, tmp_path / "run")
    rc = main(["train", "--config", str(recipe), "judge.type=http", f"++judge.base_urls=[{url}]",
               "++judge.model=m", "++judge.ray_actor=false"])
    assert rc == 2
    line = _one_line(capsys.readouterr().err)
    assert url in line and "refused" in line.lower(), line
    assert not (tmp_path / "run").exists()  # no eval of nulls, no run directory


# -- 6. the CLI --------------------------------------------------------------------------------------------

def test_eval_takes_overrides_after_options(finished, tmp_path):
    _, run = finished
    out = tmp_path / "e.json"
    assert main(["eval", str(run), "--checkpoint", "step_2", "eval.samples_per_prompt=2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["step"] == 2 and result["num_responses"] == 2 * result["num_prompts"]


def test_stop_after_must_be_positive(finished, capsys):
    recipe, _ = finished
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(recipe), "--stop-after", "0"])
    assert exc.value.code == 2 and "must be >= 1" in capsys.readouterr().err


def test_help_describes_each_command_and_version(capsys):
    from rise_nemo import __version__
    from rise_nemo.cli import COMMANDS

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, module in COMMANDS.items():
        help_line = __import__(module, fromlist=["HELP"]).HELP
        assert f"  {name:<8} {help_line}" in out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rise-nemo {__version__}"


def test_a_closed_pipe_ends_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "rise_nemo.cli", "plan", "rise_14b"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "0"})
    proc.stdout.close()  # like `| head` exiting before the output is written
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# -- 8 / 9. what the run directory tells the user ------------------------------------------------------------

def test_metrics_carry_judge_counters_and_the_log_its_start_line(finished):
    _, run = finished
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for key in ("judge/calls", "judge/cache_hits", "judge/failures", "judge/unknown_verdicts"):
        assert key in metrics[-1], sorted(metrics[-1])
    assert metrics[-1]["judge/calls"] > metrics[0]["judge/calls"] > 0  # cumulative
    assert metrics[0]["guidance/switch_reason"] is None  # switch_step 3: step 1 is far from it
    summary = json.loads((run / "summary.json").read_text())
    assert summary["switch_reason"] is None and summary["switch_step"] is None  # step 3 never ran
    log = (run / "train.log").read_text()
    assert "start: method rise, backend local, seed 3, steps 0 -> 2, run directory" in log


def test_samples_jsonl_records_what_was_trained_on(finished):
    _, run = finished
    rows = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows} == {1, 2}
    for step in (1, 2):
        natural = [r for r in rows if r["step"] == step and not r["hinted"]]
        hinted = [r for r in rows if r["step"] == step and r["hinted"]]
        assert len(natural) == 3 and len(hinted) <= 3  # train.log_samples=3 per kind
    for r in rows:
        assert set(r) == {"step", "prompt_id", "hinted", "response", "verdicts", "reward", "advantage", "kind"}
        assert all(v in (True, False, None) for v in r["verdicts"])
        if r["hinted"]:
            assert r["kind"] in (1, None) and (r["advantage"] is None or r["advantage"] > 0)  # eq. 8
        else:
            assert r["kind"] == 0 and isinstance(r["advantage"], float)


# -- a trainer's eval is never overwritten; outputs and NeMo-RL checked first --------------------------------

def test_eval_with_overrides_never_replaces_the_trainers_eval(run_copy, capsys):
    _, run_copy = run_copy
    from rise_nemo.reports.runs import load_run

    trainer_eval = run_copy / "eval" / "step_000002.json"
    before = trainer_eval.read_bytes()
    for _ in range(2):
        assert main(["eval", str(run_copy), "eval.samples_per_prompt=3"]) == 0
    assert trainer_eval.read_bytes() == before
    cli = sorted(p.name for p in (run_copy / "eval" / "cli").iterdir())
    assert cli == ["step_000002.2.json", "step_000002.json"], cli
    assert f"written: {run_copy / 'eval' / 'cli' / 'step_000002.2.json'}" in capsys.readouterr().out
    smaller = json.loads((run_copy / "eval" / "cli" / "step_000002.json").read_text())
    assert smaller["num_responses"] == 3 * smaller["num_prompts"]
    # `report` keeps reading the trainer's evaluation (2 samples per prompt), not the later one with 3.
    evals = load_run(run_copy).evals
    assert [e["num_responses"] for e in evals] == [json.loads(before)["num_responses"]] == [2 * 3]


def test_eval_refuses_an_out_that_is_a_folder_or_the_trainers_eval_before_any_work(run_copy, tmp_path, capsys,
                                                                                    no_model_build):
    _, run_copy = run_copy
    folder = tmp_path / "results"
    folder.mkdir()
    assert main(["eval", str(run_copy), "--out", str(folder)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"--out {folder}: is a directory" in line, line
    assert main(["eval", str(run_copy), "--out", str(run_copy / "eval" / "step_000002.json")]) == 2
    assert "trainer's evaluation" in _one_line(capsys.readouterr().err)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["eval", str(run_copy), "--out", str(blocker / "e.json")]) == 2
    assert f"{blocker} is a file" in _one_line(capsys.readouterr().err)
    assert list(folder.iterdir()) == []


def test_report_refuses_an_out_that_is_a_file_before_plotting(finished, tmp_path, capsys, monkeypatch):
    _, finished = finished
    import rise_nemo.reports.report as report

    monkeypatch.setattr(report, "load_run", lambda p: pytest.fail("a run was read before --out was checked"))
    existing = tmp_path / "report.md"
    existing.write_text("mine")
    assert main(["report", str(finished), "--out", str(existing)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"--out {existing}: is a file; give a folder" in line, line
    assert existing.read_text() == "mine"


def test_nemo_recipe_without_nemo_rl_is_one_line_naming_nemo_rl_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "nemo_rl", None)  # NeMo-RL not importable, as on any machine without it
    monkeypatch.setenv("NEMO_RL_DIR", str(tmp_path / "nemo-rl"))
    data = tmp_path / "math.jsonl"
    data.write_text(json.dumps({"problem": "What is 1+1?", "solution": "\\boxed{2}"}) + "\n")
    monkeypatch.setenv("RISE_TRAIN_DATA", str(data))
    monkeypatch.setenv("RISE_EVAL_DATA", str(data))
    run_dir = tmp_path / "run"
    assert main(["train", "--config", "grpo_math_qwen3_4b", f"run.dir={run_dir}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "needs NeMo-RL v0.7.0" in line and f"NEMO_RL_DIR={tmp_path / 'nemo-rl'}" in line, line
    assert "pip install" in line and "rise-nemo plan" in line, line
    assert not run_dir.exists()


SIGNAL_CHILD = """
import os, signal, sys, time
import rise_nemo.loop.run as run
from rise_nemo.cli import main

def warm_start_interrupted(*args, **kwargs):  # the warm start is under way when the signal comes
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.01)
    raise SystemExit("the signal never arrived")

run.warm_start_policy = warm_start_interrupted
sys.exit(main(["train", "--config", sys.argv[2], "--run-dir", sys.argv[3]]))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_a_stop_signal_during_the_warm_start_leaves_no_run_directory(finished, tmp_path, sig):
    """SIGTERM (scancel, requeue) during the warm start left a run directory holding only .lock,
    Ctrl-C a KeyboardInterrupt traceback. Now: one line, exit 0 (as a stop during training), nothing left."""
    recipe, _ = finished
    run_dir = tmp_path / "run"
    res = subprocess.run([sys.executable, "-c", SIGNAL_CHILD, sig, str(recipe), str(run_dir)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    line = _one_line(res.stderr)
    assert f"stopped by {sig} before training started" in line and "run the same command again" in line, line
    assert not run_dir.exists()
