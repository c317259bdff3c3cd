"""The chain task's sketch references (``data.task.reference=sketch``, ExpRL's premise): not
imitable step by step, still checkable by the embedded reference judge."""

from __future__ import annotations

import pytest

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.data.chain_task import (
    ReasoningTaskError,
    make_chain_task,
    problem_chain,
    reference_score,
    reference_segment_scores,
)
from rise_nemo.judges.reference import RuleReferenceJudge, ScoreRequest


def test_sketch_task_is_deterministic_and_keeps_the_control_problems():
    sketch, again, control = make_chain_task(seed=1, reference="sketch"), make_chain_task(seed=1, reference="sketch"), \
        make_chain_task(seed=1)
    assert [p.reference_solution for p in sketch.train] == [p.reference_solution for p in again.train]
    assert [p.messages for p in sketch.train + sketch.heldout] == [p.messages for p in control.train + control.heldout]
    assert [p.answer for p in sketch.heldout] == [p.answer for p in control.heldout]
    assert sketch.fingerprint() != control.fingerprint()
    assert control.fingerprint() == make_chain_task(seed=1, reference="full").fingerprint()
    # The warm start (full solutions) is shared by both conditions.
    assert sketch.warm_start_fingerprint() == control.warm_start_fingerprint()


def test_sketch_skips_steps_and_is_checkable_by_the_judge():
    task = make_chain_task(seed=0, reference="sketch")
    judge = RuleReferenceJudge()
    for p in task.heldout:
        chain = problem_chain(p)
        level = len(chain.ops)
        ref = p.reference_solution
        assert ref.count("step ") == level // 2 + level % 2
        assert (ref == chain.solution_text()) == (level == 1)  # one step: nothing to skip
        assert ref.endswith(f"answer {p.answer}")
        full = chain.solution_text()
        # A correct full solution gets 5 from the sketch, as from the full reference.
        assert reference_score(ref, full) == 5 == reference_score(chain.solution_text(), full)
        assert judge.score([ScoreRequest(p, full)]) == [[5]]
        if level >= 2:
            # Imitating the sketch token by token skips steps: not a complete solution (below 5).
            assert reference_score(ref, ref) < 5
            # A wrong last result is caught.
            vals = chain.values()
            bad = chain.solution_text([*vals[:-1], (vals[-1] + 1) % chain.modulus])
            assert reference_score(ref, bad) < 5
    # Segment view: a segment's steps the sketch skips are no items; the checked ones still count.
    p = next(q for q in task.heldout if q.difficulty == 4)
    chain = problem_chain(p)
    segs = [f"step {lab} {op} {k} = {v}" for lab, (op, k), v in zip("abcd", chain.ops, chain.values())]
    assert reference_segment_scores(p.reference_solution, segs) == [1, 5, 1, 5]
    wrong = segs[1].rsplit("=", 1)[0] + f"= {(chain.values()[1] + 1) % chain.modulus}"
    assert reference_segment_scores(p.reference_solution, [wrong]) == [1]


def test_bad_reference_style_names_the_key():
    with pytest.raises(ReasoningTaskError, match=r"data\.task\.reference: expected one of \['full', 'sketch'\]"):
        make_chain_task(reference="outline")


def test_response_nll_is_the_token_mean_of_the_policy_logprobs():
    """tasks.sft.response_nll against the policy's own log-probs, computed directly."""
    import torch

    from rise_nemo.backends.local import build
    from rise_nemo.tasks.sft import Example, response_nll, sft_batch

    torch.manual_seed(0)
    policy, generator = build({"tokenizer": "builtin:reasoning_task", "seed": 0, "lr": 1e-5,
                               "tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                                        "head_dim": 16, "intermediate_size": 64}})
    p: ReasoningProblem = make_chain_task(seed=0).heldout[3]
    examples = [Example([dict(m) for m in p.messages], p.reference_solution), Example([dict(m) for m in p.messages], "answer 3")]
    batch = sft_batch(examples, generator)
    lp = policy.get_logprobs(batch)
    expected = -float((lp * batch["token_mask"]).sum() / batch["token_mask"].sum())
    assert response_nll(policy, generator, examples) == pytest.approx(expected)
    assert response_nll(policy, generator, examples) > 0
