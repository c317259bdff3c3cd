"""Checkpoint/resume: exact reproduction on CPU, signals, hard kills, crash-safe checkpoint files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny_task

from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.trainer import read_metrics, reproducible_metrics

REPO = Path(__file__).resolve().parents[2]


def _reproducible(metrics):
    return [reproducible_metrics(m) for m in metrics]  # no wall-clock times, no process-level judge counters


def _evals(run_dir: Path):
    return {p.name: json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("*.json"))}


@pytest.mark.parametrize("method", ["rise", "ruscarl"])
def test_resumed_run_reproduces_the_uninterrupted_run_exactly(tmp_path, make_trainer, method):
    over = ["train.steps=6", "rise.schedule.switch_step=4", "eval.every=3"]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert make_trainer(full, method, over).run() == 0
    first = make_trainer(parts, method, over, stop_after=2)  # stops inside the guided phase
    assert first.run() == 0 and first.stopped_by == "stop_after=2"
    assert ckpt.latest_checkpoint(parts).name == "step_000002"
    assert make_trainer(parts, method, over).run() == 0  # fresh model, optimiser, RNGs: all from the checkpoint
    a, b = read_metrics(full), read_metrics(parts)
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    assert _reproducible(a) == _reproducible(b)
    assert _evals(full) == _evals(parts)
    if method == "rise":
        assert any(m["guidance/retained"] for m in a[:3])  # the compared steps include guided training


def test_resume_drops_metrics_after_the_checkpoint(tmp_path, make_trainer):
    over = ["train.steps=4", "eval.every=0", "eval.at_start=false"]
    make_trainer(tmp_path, "rise", over, stop_after=2).run()
    with open(tmp_path / "metrics.jsonl", "a") as fh:  # a hard kill after step 3 and half of step 4
        fh.write(json.dumps({"step": 3, "reward/natural_mean": 0.0}) + "\n" + '{"step": 4, "rew')
    make_trainer(tmp_path, "rise", over).run()
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert "resumed from" in (tmp_path / "train.log").read_text()


def test_incomplete_checkpoints_are_never_loaded(tmp_path, make_trainer):
    over = ["train.steps=2", "eval.every=0", "eval.at_start=false", "train.checkpoint_every=1"]
    make_trainer(tmp_path, "rubric_rl", over).run()
    root = tmp_path / "checkpoints"
    assert ckpt.latest_checkpoint(tmp_path) == root / "step_000002"
    # A kill mid-save leaves a temp dir, or (older layouts) a step dir without COMPLETE; neither counts.
    (root / ".tmp-step_000003-999").mkdir()
    (root / "step_000003").mkdir()
    (root / "step_000003" / "trainer.pt").write_bytes(b"partial")
    assert ckpt.latest_checkpoint(tmp_path) == root / "step_000002"
    (root / "latest").write_text("step_000003\n")  # even if latest were wrong, fall back to a complete one
    assert ckpt.latest_checkpoint(tmp_path) == root / "step_000002"
    ckpt.prune_checkpoints(tmp_path, keep=1)
    assert not (root / ".tmp-step_000003-999").exists() and not (root / "step_000001").exists()
    assert (root / "step_000002").exists()


def _train_cmd(recipe: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "rise_nemo.cli", "train", "--config", str(recipe), *overrides]


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return env


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and len([x for x in path.read_text().splitlines() if x.strip()]) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"trainer exited early with {proc.returncode}: {proc.stderr.read()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"timed out waiting for {n} lines in {path}")


@pytest.mark.slow
def test_sigterm_mid_run_checkpoints_and_the_next_train_resumes(tmp_path, tiny_tokenizer):
    run_dir = tmp_path / "run"
    recipe = tiny_task.write_recipe(tmp_path, tiny_tokenizer, run_dir)
    long = ["train.steps=100000", "train.checkpoint_every=0", "eval.every=0", "eval.at_start=false"]
    proc = subprocess.Popen(_train_cmd(recipe, *long), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_lines(run_dir / "metrics.jsonl", 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    steps = [m["step"] for m in read_metrics(run_dir)]
    latest = ckpt.latest_checkpoint(run_dir)
    assert latest is not None and latest.name == f"step_{steps[-1]:06d}"  # the step it was in, then saved
    assert "received SIGTERM" in (run_dir / "train.log").read_text()

    s = steps[-1]
    resumed = subprocess.run(_train_cmd(recipe, f"train.steps={s + 2}", "eval.every=0", "eval.at_start=false"),
                             cwd=tmp_path, env=dict(_env(), SLURM_RESTART_COUNT="1"), capture_output=True,
                             text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    log = (run_dir / "train.log").read_text()
    assert f"at step {s}" in log and "SLURM_RESTART_COUNT=1" in log
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(1, s + 3))


@pytest.mark.slow
def test_hard_kill_after_a_checkpoint_loses_no_step_and_repeats_none(tmp_path, tiny_tokenizer):
    run_dir = tmp_path / "run"
    recipe = tiny_task.write_recipe(tmp_path, tiny_tokenizer, run_dir)
    long = ["train.steps=100000", "train.checkpoint_every=2", "eval.every=0", "eval.at_start=false"]
    proc = subprocess.Popen(_train_cmd(recipe, *long), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_lines(run_dir / "metrics.jsonl", 5, proc)
    proc.kill()  # SIGKILL: no handler, no save
    proc.communicate(timeout=60)
    latest = ckpt.latest_checkpoint(run_dir)
    assert latest is not None
    s = int(latest.name.split("_")[1])
    target = max(s, len(read_metrics(run_dir))) + 1
    resumed = subprocess.run(_train_cmd(recipe, f"train.steps={target}", "train.checkpoint_every=2",
                                        "eval.every=0", "eval.at_start=false"),
                             cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(1, target + 1))
