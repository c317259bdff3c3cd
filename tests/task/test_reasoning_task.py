"""The embedded chained-arithmetic reasoning task: generation, references, verifier, step checks."""

from __future__ import annotations

import random

import pytest

from rise_nemo.data.chain_task import (
    ReasoningTaskError,
    RuleArithmeticVerifier,
    make_chain_task,
    parse_chain,
    problem_chain,
    step_accuracy,
    step_prefixes,
)
from rise_nemo.tasks.reasoning import ReasoningWarmStartConfig, noisy_solution


def test_task_is_seeded_covers_every_level_and_holds_out_instances():
    a, b = make_chain_task(seed=3, max_steps=10, train_per_level=5, heldout_per_level=4), make_chain_task(
        seed=3, max_steps=10, train_per_level=5, heldout_per_level=4)
    assert [p.messages for p in a.heldout] == [p.messages for p in b.heldout]
    assert sorted({p.difficulty for p in a.heldout}) == list(range(1, 11))
    assert sorted({p.difficulty for p in a.train}) == list(range(1, 11))
    held = {problem_chain(p).key for p in a.heldout}
    assert not held & {problem_chain(p).key for p in a.train}
    rng = random.Random(0)
    for _ in range(2000):  # the warm start never draws a held-out instance (level 1 has few instances)
        assert a.sample_sft_chain(rng, 1).key not in held
    c = make_chain_task(seed=4, max_steps=10, train_per_level=5, heldout_per_level=4)
    assert [p.messages for p in c.heldout] != [p.messages for p in a.heldout]


def test_train_levels_restrict_the_training_set_only():
    task = make_chain_task(max_steps=12, train_levels=[10, 12], train_per_level=3)
    assert sorted({p.difficulty for p in task.train}) == [10, 12]
    assert sorted({p.difficulty for p in task.heldout}) == list(range(1, 13))


def test_reference_is_step_by_step_checkable_and_verified():
    task = make_chain_task(max_steps=6, heldout_per_level=3)
    verifier = RuleArithmeticVerifier()
    for p in task.heldout:
        chain = problem_chain(p)
        assert parse_chain(chain.prompt_text()) == chain
        assert step_accuracy(p, p.reference_solution) == (p.difficulty, p.difficulty)
        assert p.reference_solution.count("step") == p.difficulty
        assert p.reference_solution.endswith(f"answer {p.answer}")
        assert int(p.answer) == chain.values()[-1]
    probs = task.heldout[:3]
    wrong = [p.reference_solution.rsplit(" ", 1)[0] + f" {(int(p.answer) + 1) % 97}" for p in probs]
    assert verifier.verify(probs, [p.reference_solution for p in probs]) == [True] * 3
    assert verifier.verify(probs, wrong) == [False] * 3
    assert verifier.verify(probs[:1], ["no answer here"]) == [False]


def test_known_example():
    chain = parse_chain("mod 97 start 95 a add 3 b sub 5 c add 9")
    assert chain.values() == [1, 93, 5]
    assert chain.solution_text() == "step a add 3 = 1 step b sub 5 = 93 step c add 9 = 5 answer 5"
    with pytest.raises(ValueError, match="labels"):
        parse_chain("mod 97 start 95 a add 3 c sub 5")


def test_noisy_references_err_once_per_corrupted_step():
    task = make_chain_task(max_steps=12, heldout_per_level=2)
    p = [q for q in task.heldout if q.difficulty == 12][0]
    rng = random.Random(0)
    wrong = total = 0
    for _ in range(300):
        ok, n = step_accuracy(p, noisy_solution(problem_chain(p), 0.3, rng))
        wrong += n - ok
        total += n
    assert 0.25 < wrong / total < 0.35  # the noise rate, each corruption counted once
    assert step_accuracy(p, noisy_solution(problem_chain(p), 0.0, rng)) == (12, 12)


def test_noise_offset_writes_the_right_value_plus_the_offset():
    chain = parse_chain("mod 61 start 60 a add 1 b sub 5 c add 2")
    assert noisy_solution(chain, 0.999, random.Random(0), offset=3) == (
        "step a add 1 = 3 step b sub 5 = 1 step c add 2 = 6 answer 6")  # each step: previous written + op + 3
    rng = random.Random(1)
    firsts = [noisy_solution(chain, 0.999, rng).split()[5] for _ in range(3000)]
    assert set(firsts) - {"0"} == {str(v) for v in range(1, 61)}  # uniform over the wrong residues
    assert firsts.count("0") < 15  # the right value (0) only when not corrupted (0.1%)


def test_step_prefixes_are_the_clean_reference_cut_at_step_boundaries():
    task = make_chain_task(max_steps=4, heldout_per_level=1)
    p = task.heldout[-1]
    prefixes = step_prefixes(p)
    assert len(prefixes) == 4 and prefixes[0] == ""
    assert all(p.reference_solution.startswith(x) for x in prefixes)


def test_bad_task_keys_name_the_key():
    with pytest.raises(ReasoningTaskError, match="data.task.modulus"):
        make_chain_task(modulus=60)
    with pytest.raises(ReasoningTaskError, match="data.task.modulus"):
        make_chain_task(modulus=31)
    with pytest.raises(ReasoningTaskError, match="data.task.colour"):
        make_chain_task(colour=1)
    with pytest.raises(ReasoningTaskError, match="max_steps"):
        make_chain_task(max_steps=13)
    with pytest.raises(ReasoningTaskError, match="train_levels"):
        make_chain_task(max_steps=5, train_levels=[6])


def test_warm_start_phases_and_their_keys():
    cfg = ReasoningWarmStartConfig.from_mapping({"steps": 10, "noise_steps": 4, "noise": 0.3, "lr": 2e-3,
                                                 "noise_lr": 5e-4})
    assert cfg.phases() == [("clean", 10, 2e-3, 0.0), ("noisy", 4, 5e-4, 0.3)]
    assert ReasoningWarmStartConfig.from_mapping({"steps": 4, "noise": 0.3}).phases() == [("clean", 4, 6e-3, 0.0)]
    assert ReasoningWarmStartConfig.from_mapping({"steps": 0, "noise_steps": 3}).phases()[0][0] == "noisy"
    # the clean phase's cache key ignores the noisy phase
    assert cfg.clean_spec() == ReasoningWarmStartConfig.from_mapping({"steps": 10, "lr": 2e-3}).clean_spec()
    for bad, key in (({"noise_steps": -1}, "noise_steps"), ({"noise_lr": 0.0}, "noise_lr"), ({"noise": 1.0}, "noise"),
                     ({"steps": 0, "noise_steps": 0}, "steps"), ({"clean_fraction": 0.5}, "clean_fraction"),
                     ({"noise_offset": 0}, "noise_offset")):
        with pytest.raises(ReasoningTaskError, match=f"data.warm_start.{key}"):
            ReasoningWarmStartConfig.from_mapping(bad)


def test_warm_start_caches_the_clean_phase_for_every_noisy_phase(tmp_path):
    import torch

    from rise_nemo.backends import build_backend
    from rise_nemo.config import config_from_dict
    from rise_nemo.tasks.reasoning import warm_start_reasoning

    cfg = config_from_dict({"data": {"source": "chain_arithmetic"}, "local": {
        "tokenizer": "builtin:reasoning_task", "num_threads": 1,
        "tiny": {"hidden_size": 32, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16, "intermediate_size": 64}}})
    task = make_chain_task(max_steps=3, heldout_per_level=2)

    def run(**over):
        policy, gen = build_backend(cfg)
        stats = warm_start_reasoning(policy, gen, task, {"steps": 3, "batch_size": 4, **over}, cache_dir=tmp_path,
                                     progress=False)
        return stats, {k: v.clone() for k, v in policy.model.state_dict().items()}

    clean, w_clean = run()
    a, w_a = run(noise_steps=2, noise=0.3)
    b, w_b = run(noise_steps=2, noise=0.5)
    again, w_again = run(noise_steps=2, noise=0.3)
    assert not clean["clean_cached"] and a["clean_cached"] and b["clean_cached"] and again["cached"]
    assert a["clean_loss"] == b["clean_loss"] == clean["final_loss"]
    assert all(torch.equal(w_a[k], w_again[k]) for k in w_a)
    assert not all(torch.equal(w_a[k], w_clean[k]) for k in w_a)  # the noisy phase trained
    assert not all(torch.equal(w_a[k], w_b[k]) for k in w_a)  # on its own noise
    with pytest.raises(ReasoningTaskError, match="data.warm_start.noise_offset"):
        run(noise_steps=1, noise_offset=61)  # the task's modulus


# ---- the late-only skill (RRL's premise task) -------------------------------------------------


def test_todays_task_is_unchanged_for_existing_seeds():
    # fingerprints and instances of the default task as they were before the late-only skill existed
    task = make_chain_task(seed=0, train_levels=[6, 7, 8, 9, 10], train_per_level=8)
    assert (task.fingerprint(), task.warm_start_fingerprint()) == ("0a145096827a2188", "fe034880828ad4c2")
    assert task.train[0].messages[0]["content"] == "mod 61 start 30 a add 3 b sub 3 c sub 3 d sub 1 e sub 1 f sub 3"
    assert task.late is None
    wcfg = ReasoningWarmStartConfig.from_mapping({"noise": 0.35, "noise_offset": 18})
    assert "late_noise" not in wcfg.cache_spec() and wcfg.late_noise_spec(8) is None  # warm-start cache keys kept


def test_late_operands_appear_only_in_the_last_steps_of_long_chains():
    task = make_chain_task(seed=1, max_steps=10, train_per_level=6, heldout_per_level=4, late_from=8,
                           late_operand_min=6, late_operand_max=12)
    assert task.late == (8, 6, 12)
    for p in task.train + task.heldout:
        for i, (_, k) in enumerate(problem_chain(p).ops):
            assert (6 <= k <= 12) if i + 1 >= 8 else (1 <= k <= 5), (p.prompt_id, i, k)
    assert any(problem_chain(p).ops[-1][1] > 5 for p in task.train if p.difficulty == 10)
    rng = random.Random(0)
    assert all(task.sample_sft_chain(rng, 9).ops[8][1] >= 6 for _ in range(50))
    plain = make_chain_task(seed=1, max_steps=10, train_per_level=6, heldout_per_level=4)
    assert plain.warm_start_fingerprint() != task.warm_start_fingerprint() and plain.fingerprint() != task.fingerprint()
    assert all(RuleArithmeticVerifier().verify([p], [p.reference_solution]) == [True] for p in task.heldout)


@pytest.mark.parametrize("kwargs,key", [
    ({"late_from": 1}, "late_from"), ({"late_from": 11}, "late_from"),
    ({"late_from": 8, "late_operand_min": 5}, "late_operand_min"),
    ({"late_from": 8, "late_operand_max": 61}, "late_operand_max"),
])
def test_late_skill_keys_are_checked(kwargs, key):
    with pytest.raises(ReasoningTaskError, match=key):
        make_chain_task(**kwargs)


def test_warm_start_noise_of_the_late_steps_has_its_own_rate_and_mode():
    from rise_nemo.data.chain_task import Chain

    chain = Chain(61, 10, (("add", 1),) * 7 + (("add", 6),) * 3)
    clean = chain.values()
    # late steps (8..10) always wrong by +7, early steps never wrong
    text = noisy_solution(chain, 0.0, random.Random(0), 18, late=(8, 0.999999, 7))
    written = [int(v) for v in text.split(" = ")[1:] for v in [v.split()[0]]]
    assert written[:7] == clean[:7]
    assert [(w - (prev + 6)) % 61 for w, prev in zip(written[7:], written[6:9])] == [7, 7, 7]
    wcfg = ReasoningWarmStartConfig.from_mapping({"noise": 0.35, "noise_offset": 18, "late_noise": 0.5,
                                                  "late_noise_offset": 7})
    assert wcfg.late_noise_spec(8) == (8, 0.5, 7) and wcfg.late_noise_spec(None) is None
    assert wcfg.cache_spec()["late_noise_offset"] == 7
    with pytest.raises(ReasoningTaskError, match="late_noise"):
        ReasoningWarmStartConfig.from_mapping({"late_noise": 1.5})


def test_leading_correct_steps_counts_the_reference_prefix():
    from rise_nemo.data.chain_task import leading_correct_steps

    p = make_chain_task(max_steps=4, train_per_level=1, heldout_per_level=1).train[-1]
    assert leading_correct_steps(p, p.reference_solution) == 4
    assert [leading_correct_steps(p, s) for s in step_prefixes(p)] == [0, 1, 2, 3]
    wrong = step_prefixes(p)[2] + " step c add 1 = 999"
    assert leading_correct_steps(p, wrong) == 2


def test_without_late_is_todays_task_so_the_clean_phase_cache_is_shared():
    late = make_chain_task(seed=0, train_levels=[6, 7, 8, 9, 10], train_per_level=8, late_from=8)
    base = late.without_late()
    assert base.late is None and base.warm_start_fingerprint() == "fe034880828ad4c2"  # today's (above)
    assert [p.messages for p in base.heldout] == [p.messages for p in make_chain_task(
        seed=0, train_levels=[6, 7, 8, 9, 10], train_per_level=8).heldout]
    wcfg = ReasoningWarmStartConfig.from_mapping({"clean_without_late": True})
    assert wcfg.cache_spec()["clean_without_late"] is True
    assert "clean_without_late" not in ReasoningWarmStartConfig.from_mapping({}).cache_spec()
