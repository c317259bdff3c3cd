"""What the miniature benches share (bench/_miniature.py): a seed's own problems, per-problem scoring of
answers and exact solutions, and resuming a seed's saved measurements."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._miniature import any_correct, counts, rate, resumable, score_texts, seed_problems  # noqa: E402
from rise_nemo.data.chain_task import make_chain_task, problem_chain  # noqa: E402


def test_seed_problems_are_the_seeds_own_and_disjoint():
    task = make_chain_task(train_levels=[6, 10], train_per_level=8)
    train, held = seed_problems(task, 3, [6, 10], 5, 10, 64)
    again, _ = seed_problems(task, 3, [6, 10], 5, 10, 64)
    other, other_held = seed_problems(task, 4, [6, 10], 5, 10, 64)
    assert [p.prompt_id for p in train] == [p.prompt_id for p in again] and len(train) == 10 and len(held) == 64
    assert not {problem_chain(p).key for p in train} & {problem_chain(p).key for p in held}
    assert not {problem_chain(p).key for p in held} & {problem_chain(p).key for p in other_held}
    assert [p.messages for p in train] != [p.messages for p in other]


def test_score_texts_counts_answers_and_exact_solutions():
    task = make_chain_task(train_levels=[3], train_per_level=2)
    p = task.train[0]
    wrong_path = p.reference_solution.replace(" = ", " = 1", 1)  # step a wrong, the answer still right
    scores = score_texts([p], [[p.reference_solution, wrong_path, "answer 999", ""]])
    assert scores == [{"n": 4, "answer": 2, "exact": 1}]
    per_seed = [scores, [{"n": 4, "answer": 0, "exact": 0}]]
    assert counts(per_seed, "exact") == [[1], [0]] and any_correct(per_seed, "answer") == [[1], [0]]
    assert rate(per_seed, "answer") == 2 / 8


def test_resumable_reuses_a_seed_only_with_the_same_settings(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"x": len(calls)}

    first = resumable(str(tmp_path), "s0", {"steps": 4}, compute)
    assert first["x"] == 1 and "reused" not in first and first["cpu_s"] >= 0
    assert resumable(str(tmp_path), "s0", {"steps": 4}, compute) == {**first, "reused": True}
    assert resumable(str(tmp_path), "s0", {"steps": 5}, compute)["x"] == 2  # other settings: measured again
    assert resumable(None, "s0", {"steps": 4}, compute)["x"] == 3 and len(calls) == 3


def test_workers_get_their_share_of_the_seeds_and_the_rest_of_the_command_line(monkeypatch):
    import subprocess

    from bench._miniature import run_workers

    started = []

    class Proc:
        def __init__(self, cmd):
            started.append(cmd[2:])

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Proc)
    run_workers("b.py", ["--seeds", "0", "1", "2", "--quick", "--workers", "3", "a=1", "--out", "F"], [0, 1, 2], 2,
                ["--resume"])
    assert started == [["--quick", "a=1", "--out", "F", "--seeds", "0", "2", "--workers", "1", "--measure-only",
                        "--resume"],
                       ["--quick", "a=1", "--out", "F", "--seeds", "1", "--workers", "1", "--measure-only", "--resume"]]
