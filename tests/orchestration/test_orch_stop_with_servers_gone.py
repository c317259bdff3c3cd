"""A stop signal that takes the judge servers down with it (a Slurm requeue, preemption or scancel: every
step of the job gets SIGTERM at once, srun SIGKILLs the server steps, the driver has KillWait seconds).

The step (or evaluation) in flight cannot finish, so it is abandoned at the judge's first failed call and
the checkpoint holds the state from before it; the resumed run reproduces the uninterrupted one exactly.
Here the "job end" is a real SIGTERM to this process plus the real HTTP judge client against a closed
port on 127.0.0.1 (where the server was). Without the early give-up the client would retry the dead
server with backoff, and the step would end with unknown verdicts (or, on a cluster, be SIGKILLed).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from rise_nemo.judges.http import build_http_judge
from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.trainer import read_metrics, reproducible_metrics
from rise_nemo.stopping import STOP_REQUESTED

OVER = ["train.steps=4", "train.checkpoint_every=0", "eval.every=2", "eval.at_start=false",
        "rise.schedule.switch_step=5"]


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # nothing listens once the socket closes


class JudgeDyingWithTheJob:
    """The real judge until ``arm()``; from then on, the next call is what a driver meets at the job's end:
    SIGTERM to this process, and the server gone (the real HTTP client against a closed port)."""

    def __init__(self, judge) -> None:
        self._judge = judge
        self.armed = False
        self.dead_calls = 0
        # Without the give-up on stop, 3 attempts with backoff, then unknown verdicts and a finished step.
        self._gone = build_http_judge({"type": "http", "model": "rule-grader", "base_urls": [_closed_port_url()],
                                       "max_attempts": 3, "backoff_base_s": 0.5, "backoff_max_s": 1.0,
                                       "timeout_s": 5.0})

    def arm(self) -> None:
        self.armed = True

    def judge(self, requests):
        if not self.armed:
            return self._judge.judge(requests)
        self.armed = False
        self.dead_calls += 1
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not STOP_REQUESTED.is_set() and time.monotonic() < deadline:  # the handler runs in this thread
            time.sleep(0.01)
        return self._gone.judge(requests)

    def __getattr__(self, name):
        return getattr(self._judge, name)


def _run_interrupted(make_trainer, run_dir: Path, arm_at: str, step: int):
    """One trainer whose judge dies with the job at the given step's training (``arm_at="step"``) or
    evaluation (``"eval"``)."""
    box = {}

    def wrap(policy, generator, judge):
        box["judge"] = JudgeDyingWithTheJob(judge)
        return policy, generator, box["judge"]

    trainer = make_trainer(run_dir, "rise", OVER, wrap=wrap)
    dying = box["judge"]
    if arm_at == "step":
        train_step = trainer._train_step

        def arming_step(ctx, prompts, n):
            if n == step:
                dying.arm()
            return train_step(ctx, prompts, n)

        trainer._train_step = arming_step
    else:
        run_eval = trainer.run_eval

        def arming_eval(n):
            if n == step:
                dying.arm()
            return run_eval(n)

        trainer.run_eval = arming_eval
    assert trainer.run() == 0
    return trainer, dying


def _evals(run_dir: Path):
    return {p.name: json.loads(p.read_text()) for p in sorted((run_dir / "eval").glob("*.json"))}


def test_step_abandoned_when_the_judge_dies_with_the_job_and_the_resumed_run_is_exact(tmp_path, make_trainer):
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert make_trainer(full, "rise", OVER).run() == 0
    trainer, dying = _run_interrupted(make_trainer, parts, "step", 3)
    assert dying.dead_calls == 1 and trainer.stopped_by == "SIGTERM"
    assert [m["step"] for m in read_metrics(parts)] == [1, 2]  # step 3 was abandoned, not logged
    assert ckpt.latest_checkpoint(parts).name == "step_000002"  # saved by the stop (checkpoint_every=0)
    log = (parts / "train.log").read_text()
    assert "step 3 abandoned: stop requested and a judge call failed" in log
    assert "received SIGTERM: stopped after step 2 with a complete checkpoint" in log
    assert not STOP_REQUESTED.is_set()  # cleared when the run ended

    assert make_trainer(parts, "rise", OVER).run() == 0
    assert [m["step"] for m in read_metrics(parts)] == [1, 2, 3, 4]
    assert [reproducible_metrics(m) for m in read_metrics(full)] == [reproducible_metrics(m) for m in read_metrics(parts)]
    assert _evals(full) == _evals(parts)
    assert any(m["guidance/retained"] for m in read_metrics(full)[2:])  # the abandoned step was a guided one


def test_evaluation_interrupted_by_the_job_end_runs_first_in_the_resumed_run(tmp_path, make_trainer):
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert make_trainer(full, "rise", OVER).run() == 0
    trainer, dying = _run_interrupted(make_trainer, parts, "eval", 2)
    assert dying.dead_calls == 1 and trainer.stopped_by == "SIGTERM"
    assert [m["step"] for m in read_metrics(parts)] == [1, 2]
    assert ckpt.latest_checkpoint(parts).name == "step_000002"
    assert "evaluation at step 2 interrupted, pending for the resumed run" in (parts / "train.log").read_text()
    assert not (parts / "eval" / "step_000002.json").exists()

    assert make_trainer(parts, "rise", OVER).run() == 0
    assert [reproducible_metrics(m) for m in read_metrics(full)] == [reproducible_metrics(m) for m in read_metrics(parts)]
    assert _evals(full) == _evals(parts) and "step_000002.json" in _evals(parts)
