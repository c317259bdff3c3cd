"""The code sandbox as a pool of Ray actors (judges.ray_actor.RayCodeVerifier) on a private loopback Ray
cluster: the same verdicts and outcome metrics as the local pool, results in input order, and bounded
in-flight work (back-pressure) whatever the number of rollouts; a missing Ray is one line naming the key."""

from __future__ import annotations

import pytest

from rise_nemo.config import config_from_dict
from rise_nemo.data.reasoning import load_reasoning_problems
from rise_nemo.data.samples import apps_solutions_path
from rise_nemo.errors import UserError
from rise_nemo.judges.code_verifier import CodeVerifier
from rise_nemo.steps.verifiers import code_verifier

ray = pytest.importorskip("ray")


def _cfg(**code_reward):
    return config_from_dict({"backend": "local", "method": "ppo", "code_reward": code_reward,
                             "data": {"source": "jsonl", "format": "apps"}}, [])


def test_ray_actors_without_ray_is_one_line_naming_the_key():
    if ray.is_initialized():
        pytest.skip("another suite's Ray is running in this process")
    with pytest.raises(UserError, match=r"^config key 'code_reward\.ray_actors': RayCodeVerifier needs a running Ray"):
        code_verifier(_cfg(ray_actors=1))
    assert isinstance(code_verifier(_cfg(workers=1)), CodeVerifier)




def test_pool_matches_the_local_verifier_with_bounded_in_flight_work(ray_session, sandbox):
    problems = load_reasoning_problems(apps_solutions_path(), "apps").problems
    # each problem: its human solution (passes), a wrong program, a syntax error -> 15 rollouts
    rollouts = [(p, r) for p in problems for r in (p.reference_solution, "print(0)", "def (")]
    probs, responses = [p for p, _ in rollouts], [r for _, r in rollouts]
    local = CodeVerifier(per_test_seconds=4.0, total_seconds=20.0, workers=2, sandbox=sandbox)
    try:
        expected = local.verify(probs, responses)
        expected_metrics = local.batch_metrics()
    finally:
        local.close()
    assert expected == [True, False, False] * len(problems)

    from rise_nemo.judges.ray_actor import RayCodeVerifier

    pool = RayCodeVerifier(actors=1, workers=1, chunk_size=2, max_in_flight=2,
                           verifier_kwargs={"per_test_seconds": 4.0, "total_seconds": 20.0})
    try:
        assert pool.verify(probs, responses) == expected  # in input order, across 8 chunks
        assert pool.batch_metrics() == pytest.approx(expected_metrics)
        assert sum(pool.outcomes.values()) == len(rollouts)
        assert pool.peak_in_flight == 2  # 8 chunks, never more than actors x max_in_flight submitted at once
    finally:
        pool.close()
