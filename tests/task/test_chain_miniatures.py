"""What the decisive miniatures rely on in the chain task (bench/embedded_rrl.py, bench/embedded_exprl.py):
exact solutions, error modes that cannot cancel, a seed's own problems, and the hidden operation with the
judge that lacks the reference."""

from __future__ import annotations

import random

import pytest

from rise_nemo.backends.local.tokenizer import builtin_tokenizer
from rise_nemo.data.chain_task import (
    HIDDEN_OP,
    MIN_HELDOUT_SPACE,
    ExactSolutionVerifier,
    ReasoningTaskError,
    RuleArithmeticVerifier,
    exact_solution,
    fresh_problems,
    instance_space,
    make_chain_task,
    problem_chain,
    prompt_score,
    prompt_segment_scores,
    reference_score,
    reference_segment_scores,
    step_accuracy,
)
from rise_nemo.judges.reference import PromptOnlyRuleJudge, RuleReferenceJudge, ScoreRequest
from rise_nemo.tasks.reasoning import (
    ReasoningWarmStartConfig,
    error_combinations,
    error_shift_distance,
    noisy_solution,
)


def _segments(text: str) -> list[str]:
    return ["step" + part for part in text.split("step")[1:]]


# ---- exact solutions ------------------------------------------------------------------------------


def test_a_wrong_path_whose_errors_cancel_is_right_for_the_verifier_but_not_exact():
    task = make_chain_task(train_levels=[10], train_per_level=4)
    problem = task.train[0]
    chain = problem_chain(problem)
    assert exact_solution(problem, problem.reference_solution)
    # +18 on three steps and +7 on a fourth: 3 x 18 + 7 = 61, the answer is right again
    rng = random.Random(0)
    written, v = [], chain.start
    for i, (op, k) in enumerate(chain.ops):
        v = (v + (1 if op == "add" else -1) * k + (18 if i in (1, 3, 5) else 7 if i == 8 else 0)) % 61
        written.append(v)
    wrong = chain.solution_text(written)
    assert RuleArithmeticVerifier().verify([problem], [wrong]) == [True]
    assert ExactSolutionVerifier().verify([problem], [wrong]) == [False]
    assert not exact_solution(problem, problem.reference_solution.replace("answer", "step k add 1 = 3 answer"))
    assert noisy_solution(chain, 0.0, rng) == problem.reference_solution


def test_no_combination_of_ten_or_fewer_errors_cancels_with_the_miniatures_offsets():
    combos = error_combinations([18, 9], 10)
    assert len(combos) == 65  # (11 * 12 / 2) - 1: every (a, b) with 1 <= a + b <= 10
    assert all((18 * a + 9 * b) % 61 != 0 for a, b in combos)  # the enumeration itself
    assert error_shift_distance([18, 9], 61) == (2, [(0, 7), (1, 5), (2, 3), (3, 1)])
    # the premise recipe's late offset 7 cancels: 3 x 18 + 7 = 61 and 6 x 18 + 2 x 7 = 122
    distance, where = error_shift_distance([18, 7], 61)
    assert distance == 0 and {(3, 1), (6, 2)} <= set(where)
    wcfg = ReasoningWarmStartConfig.from_mapping({"noise_steps": 10, "noise_offset": 18, "late_noise": 0.3,
                                                  "late_noise_offset": 9})
    assert wcfg.error_offsets(8) == [18, 9] and wcfg.error_offsets(None) == [18]


# ---- a seed's own problems -------------------------------------------------------------------------


def test_fresh_problems_are_reproducible_distinct_and_never_the_tasks_own():
    task = make_chain_task(train_levels=[8, 9, 10], train_per_level=8)
    a = fresh_problems(task, "heldout-s3", 10, 64, heldout=True)
    assert [p.messages for p in a] == [p.messages for p in fresh_problems(task, "heldout-s3", 10, 64, heldout=True)]
    b = fresh_problems(task, "heldout-s4", 10, 64, heldout=True)
    keys = {problem_chain(p).key for p in a}
    assert len(keys) == 64 and not keys & {problem_chain(p).key for p in b}
    own = task.heldout_keys | {problem_chain(p).key for p in task.train}
    assert not keys & own
    train = fresh_problems(task, "train-s3", 10, 8, exclude=keys)
    assert not {problem_chain(p).key for p in train} & keys
    assert {p.difficulty for p in a} == {10} and a[0].prompt_id == "heldout-s3-L10-000"


def test_fresh_heldout_problems_only_where_the_warm_start_cannot_have_met_them():
    task = make_chain_task()
    assert instance_space(task.cfg, 7) == 61 * 10**7 < MIN_HELDOUT_SPACE <= instance_space(task.cfg, 8)
    with pytest.raises(ReasoningTaskError, match="level 7 has only"):
        fresh_problems(task, "x", 7, 4, heldout=True)
    assert len(fresh_problems(task, "x", 2, 4)) == 4  # training problems may be anything
    with pytest.raises(ReasoningTaskError, match="only 610 instances"):
        fresh_problems(task, "x", 1, 400)


# ---- the hidden operation (ExpRL's premise) -------------------------------------------------------


def test_hidden_operation_is_one_step_of_every_problem_and_keeps_the_other_draws():
    plain = make_chain_task(train_levels=[6, 10], train_per_level=6)
    hidden = make_chain_task(train_levels=[6, 10], train_per_level=6, hidden_op=True)
    assert hidden.fingerprint() != plain.fingerprint()
    assert hidden.warm_start_fingerprint() != plain.warm_start_fingerprint()
    a, b = problem_chain(plain.heldout[0]), problem_chain(hidden.heldout[0])
    assert (a.start, [k for _, k in a.ops]) == (b.start, [k for _, k in b.ops])  # the one extra draw comes last
    for q in hidden.heldout + hidden.train:
        assert [op for op, _ in problem_chain(q).ops].count(HIDDEN_OP) == 1
        assert step_accuracy(q, q.reference_solution) == (q.difficulty, q.difficulty)
    chain = problem_chain(hidden.train[0])
    i = [op for op, _ in chain.ops].index(HIDDEN_OP)
    before = chain.values()[i - 1] if i else chain.start
    assert chain.values()[i] == (before - chain.ops[i][1]) % 61  # its meaning: subtract the operand
    assert HIDDEN_OP in builtin_tokenizer("reasoning_task_zap").get_vocab()
    assert HIDDEN_OP not in builtin_tokenizer("reasoning_task").get_vocab()


def test_warm_start_writes_the_hidden_step_right_at_its_rate_and_needs_the_rate():
    task = make_chain_task(train_levels=[6], train_per_level=50, hidden_op=True)
    rng, right = random.Random(0), 0
    for p in task.train * 8:
        chain = problem_chain(p)
        text = noisy_solution(chain, 0.0, rng, 18, hidden_true_rate=0.1)
        right += exact_solution(p, text)  # noise 0: only the hidden step can be wrong
    assert 0.06 < right / 400 < 0.14
    from rise_nemo.tasks.reasoning import warm_start_reasoning

    with pytest.raises(ReasoningTaskError, match="hidden_op_true_rate"):
        warm_start_reasoning(None, None, task, {})
    assert "hidden_op_true_rate" not in ReasoningWarmStartConfig.from_mapping({}).cache_spec()


def test_the_judge_without_the_reference_is_the_reference_judge_on_todays_task():
    task = make_chain_task(train_levels=[3, 6, 10], train_per_level=10)
    rng = random.Random(1)
    for p in task.train + task.heldout:
        for _ in range(4):
            text = noisy_solution(problem_chain(p), 0.3, rng, 18)
            if rng.random() < 0.3:
                text = text.replace("answer", "step c add 3 = 4 answer")
            assert prompt_score(p, text) == reference_score(p.reference_solution, text)
            for view in ("segment", "prefix"):
                assert (prompt_segment_scores(p, _segments(text), view)
                        == reference_segment_scores(p.reference_solution, _segments(text), view))


def test_only_the_reference_tells_a_right_hidden_step_from_the_misreading():
    task = make_chain_task(train_levels=[6], train_per_level=20, hidden_op=True)
    reference, prompt_only = RuleReferenceJudge(), PromptOnlyRuleJudge()
    for p in task.train:
        chain = problem_chain(p)
        right = noisy_solution(chain, 0.0, random.Random(0), 18, hidden_true_rate=1.0)
        misread = noisy_solution(chain, 0.0, random.Random(0), 18, hidden_true_rate=0.0)
        assert right == p.reference_solution != misread
        requests = [ScoreRequest(p, t) for t in (right, misread)]
        seg_requests = [ScoreRequest(p, t, tuple(_segments(t))) for t in (right, misread)]
        (r_right,), (r_misread,) = reference.score(requests)
        assert r_right == 5 > r_misread
        assert prompt_only.score(requests)[0] == prompt_only.score(requests)[1] == [4]
        assert reference.score(seg_requests)[0] != reference.score(seg_requests)[1]
        assert prompt_only.score(seg_requests)[0] == prompt_only.score(seg_requests)[1]
        # it never reads the reference: a garbage reference changes nothing
        blind = [ScoreRequest(type(p)(**{**p.__dict__, "reference_solution": "step a add 1 = 1 answer 1"}), t)
                 for t in (right, misread)]
        assert prompt_only.score(blind) == prompt_only.score(requests)


# ---- one warm start for several reach rates (the late skill's position) ---------------------------


def test_a_late_from_mix_warm_start_is_shared_by_the_tasks_of_the_mix():
    tasks = {lf: make_chain_task(train_levels=[10], train_per_level=4, late_from=lf) for lf in (4, 6, 8)}
    shared = {t.warm_start_fingerprint([4, 6, 8]) for t in tasks.values()}
    assert len(shared) == 1 and shared != {tasks[8].warm_start_fingerprint()}
    assert len({t.warm_start_fingerprint() for t in tasks.values()}) == 3
    assert tasks[8].with_late_from(4).cfg.late_from == 4
    rng = random.Random(0)
    chain = tasks[8].sample_sft_chain(rng, 10, late_from=4)
    assert all(k >= 6 for _, k in chain.ops[3:]) and all(k <= 5 for _, k in chain.ops[:3])
    assert ReasoningWarmStartConfig.from_mapping({"late_from_mix": [8, 4, 6, 4]}).late_from_mix == [4, 6, 8]
    for bad in ([1], "4", [], [True]):
        with pytest.raises(ReasoningTaskError, match="late_from_mix"):
            ReasoningWarmStartConfig.from_mapping({"late_from_mix": bad})
    from rise_nemo.tasks.reasoning import warm_start_reasoning

    class Engine:
        def fingerprint(self):
            return "x"

    policy = type("P", (), {"engine": Engine()})()
    with pytest.raises(ReasoningTaskError, match="must hold the task's data.task.late_from"):
        warm_start_reasoning(policy, None, tasks[8], {"late_from_mix": [4, 6]})


def test_the_rrl_miniature_recipe_cannot_cancel_and_serves_three_reach_levels():
    from pathlib import Path

    from rise_nemo.config import load_config
    from rise_nemo.loop.data import _plain, chain_task

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "rrl_chain_late_exact_tiny_cpu.yaml"
    fingerprints = set()
    for late_from in (8, 6, 4):
        cfg = load_config(recipe, [f"data.task.late_from={late_from}"])
        wcfg = ReasoningWarmStartConfig.from_mapping(_plain(cfg.data.warm_start))
        task = chain_task(cfg)
        assert wcfg.error_offsets(task.cfg.late_from) == [18, 9]
        assert error_shift_distance(wcfg.error_offsets(task.cfg.late_from), task.cfg.modulus)[0] == 2
        fingerprints.add(task.warm_start_fingerprint(wcfg.late_from_mix))
    assert len(fingerprints) == 1  # one warm start for the three reach levels


def test_reach_profile_finds_where_responses_leave_the_clean_path():
    from rise_nemo.data.chain_task import reach_profile

    task = make_chain_task(train_levels=[10], train_per_level=4, late_from=8)
    p = task.train[0]
    chain = problem_chain(p)
    right = p.reference_solution

    def wrong_at(i: int) -> str:  # the clean path with one +18 error at step i (0-based), the rest continuing
        written, v = [], chain.start
        for j, (op, k) in enumerate(chain.ops):
            v = (v + (1 if op == "add" else -1) * k + (18 if j == i else 0)) % 61
            written.append(v)
        return chain.solution_text(written)

    texts = [right, wrong_at(0), wrong_at(0), wrong_at(3), wrong_at(7), "nonsense"]
    profile = reach_profile([p], [texts], late_from=8)
    # leading correct steps: 10, 0, 0, 3, 7, 0 -> 2 of 6 reach step 8 with steps 1-7 right
    assert profile["reach_rate"] == pytest.approx(2 / 6) and profile["responses"] == 6
    acc = profile["step_accuracy"]
    assert acc[0] == pytest.approx(3 / 6) and acc[3] == pytest.approx(2 / 3) and acc[7] == pytest.approx(1 / 2)
    assert acc[9] == 1.0
