"""The HTTP judge inside a CPU-only Ray actor (one small loopback Ray cluster per test session)."""

from __future__ import annotations

import asyncio

import pytest
from judge_testlib import expected, small_requests

from rise_nemo.interfaces import AsyncJudge, Judge
from rise_nemo.judges.http import build_http_judge
from rise_nemo.judges.ray_actor import JudgeActor, RayJudge

pytestmark = pytest.mark.slow
BUILDER = "rise_nemo.judges.http:build_http_judge"


def _cfg(url: str, **extra) -> dict:
    return {"type": "http", "mode": "batched", "model": "rule-grader", "base_urls": [url],
            "batch_size": 3, "timeout_s": 300.0, "backoff_base_s": 0.01, "ray_actor": True, "ray_num_cpus": 0.25,
            "ray_timeout_s": 900.0, "ray_start_timeout_s": 900.0, **extra}

# Generous bounds, never timings: on a loaded 2-core machine (CI beside 4 CPU hogs) starting the actor's
# worker process took over 120 s.
WAIT_S = 900


def test_http_judge_in_ray_actor(ray_session, server):
    reqs = small_requests()
    judge = build_http_judge(_cfg(server.url))
    try:
        assert isinstance(judge, RayJudge) and isinstance(judge, Judge)
        ref = judge.submit(reqs)  # returns at once: the driver can generate while the actor judges
        assert ray_session.get(ref, timeout=WAIT_S) == expected(reqs)
        assert isinstance(judge, AsyncJudge)
        assert judge.judge_async(reqs).result(timeout=WAIT_S) == expected(reqs)  # a future (the pipelined step's)
        # the pipelined step's stream keeps the inner HTTP judge's capacity in flight (interfaces.CapacityJudge)
        assert judge.max_concurrency == 64 and judge.load_of(reqs[0]) == len(reqs[0].rubric.criteria) / 3
        assert judge.judge(reqs) == expected(reqs)  # second time: from the actor's cache
        stats = judge.stats
        assert stats.calls == 6 and stats.cache_hits == 30 and stats.unknown_verdicts == 0
        assert judge.metrics()["judge/calls"] == 6.0
        resources = judge.assigned_resources()
        assert resources.get("CPU") == 0.25 and not resources.get("GPU")
    finally:
        judge.close()


def test_actor_build_errors_surface(ray_session, server, monkeypatch):
    monkeypatch.delenv("RISE_TEST_MISSING_KEY", raising=False)
    with pytest.raises(Exception, match="RISE_TEST_MISSING_KEY"):
        RayJudge(BUILDER, {**_cfg(server.url, api_key_env="RISE_TEST_MISSING_KEY"), "ray_actor": False},
                 num_cpus=0.25, timeout_s=WAIT_S, start_timeout_s=WAIT_S)


def test_judge_actor_plain_class(server):
    # The class Ray wraps also works on its own (its methods are coroutines).
    actor = JudgeActor(BUILDER, {**_cfg(server.url), "ray_actor": False})
    reqs = small_requests()[:1]
    assert asyncio.run(actor.judge(reqs)) == expected(reqs)
    assert asyncio.run(actor.stats()).calls == 2
    asyncio.run(actor.close())
