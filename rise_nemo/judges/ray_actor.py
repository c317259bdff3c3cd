"""Run any judge inside a CPU-only Ray actor, behind the same ``Judge`` interface.

The training driver calls ``RayJudge.judge`` (blocking, with a timeout) or ``RayJudge.submit`` (returns a
Ray ObjectRef at once, so generation of the next batch can overlap judging of this one). The actor
builds its judge itself from ``builder`` ("module:function") and the config mapping, so nothing
unpicklable (threads, sockets) crosses process boundaries.

Secrets: the actor's judge reads its API key from its own process environment. Ray workers inherit the
environment the local Ray node was started with; on a multi-node cluster, export the variable on the
node that hosts the actor. The key is never put in a Ray ``runtime_env`` (Ray stores those in its
control store and shows them in its dashboard).

Ray must stay on loopback on our CI machines: set ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before
``ray.init`` (docs/DESIGN.md §5). ``RayJudge`` never calls ``ray.init`` itself unless asked to.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rise_nemo.interfaces import JudgeRequest, JudgeStats, Verdict
from rise_nemo.judges.code_verifier import CodeReward


def load_builder(spec: str):
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"judge builder {spec!r}: expected 'package.module:function'")
    return getattr(importlib.import_module(module), name)


class JudgeActor:
    """Plain class (unit-testable without Ray); wrapped with ``ray.remote`` at the edge below."""

    def __init__(self, builder: str, cfg: Mapping[str, Any]) -> None:
        self._judge = load_builder(builder)(cfg)

    async def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
        # A worker thread, so the actor keeps answering stats() while a batch is being judged.
        return await asyncio.to_thread(self._judge.judge, requests)

    async def stats(self) -> JudgeStats:
        stats = getattr(self._judge, "stats", None)
        return stats if isinstance(stats, JudgeStats) else JudgeStats()

    async def assigned_resources(self) -> dict[str, float]:
        import ray

        return dict(ray.get_runtime_context().get_assigned_resources())

    async def close(self) -> None:
        close = getattr(self._judge, "close", None)
        if close is not None:
            await asyncio.to_thread(close)


class RayJudge:
    """``Judge`` whose work happens in a Ray actor with ``num_gpus=0``."""

    def __init__(
        self,
        builder: str,
        cfg: Mapping[str, Any],
        *,
        num_cpus: float,  # judge.ray_num_cpus, judge.ray_timeout_s, judge.ray_start_timeout_s (HttpJudgeConfig)
        timeout_s: float,
        start_timeout_s: float,
        init_ray: bool = False,
        max_concurrency: int | None = None,  # interfaces.CapacityJudge, where the wrapped judge's builder knows it
        load_of: Callable[[JudgeRequest], float] | None = None,
    ) -> None:
        import ray

        if not ray.is_initialized():
            if not init_ray:
                raise RuntimeError(
                    "RayJudge needs a running Ray (call ray.init first; on loopback-only machines set "
                    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before it)"
                )
            ray.init(include_dashboard=False, log_to_driver=False)
        self._ray = ray
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self._load_of = load_of
        actor_cls = ray.remote(num_cpus=num_cpus, num_gpus=0, max_restarts=0)(JudgeActor)
        self._actor = actor_cls.remote(builder, dict(cfg))
        # Fail here, with the actor's own error, if the judge cannot be built (bad config, missing key).
        self._last_stats = ray.get(self._actor.stats.remote(), timeout=start_timeout_s)

    def load_of(self, request: JudgeRequest) -> float:
        return self._load_of(request) if self._load_of is not None else 1.0

    def submit(self, requests: Sequence[JudgeRequest]):
        """Start judging; returns an ObjectRef resolving to ``list[list[Verdict]]``."""
        return self._actor.judge.remote(list(requests))

    def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
        return self._ray.get(self.submit(requests), timeout=self.timeout_s)

    def judge_async(self, requests: Sequence[JudgeRequest]) -> concurrent.futures.Future[list[list[Verdict]]]:
        """interfaces.AsyncJudge: the actor's verdicts in a future (the caller bounds the wait by ``timeout_s``,
        as ``judge`` does)."""
        return self.submit(requests).future()

    @property
    def stats(self) -> JudgeStats:
        try:
            self._last_stats = self._ray.get(self._actor.stats.remote(), timeout=30)
        except self._ray.exceptions.GetTimeoutError:
            pass  # report the last known counters rather than block the training loop
        return self._last_stats

    def metrics(self, prefix: str = "judge/") -> dict[str, float]:
        from rise_nemo.judges.stats import stats_to_metrics

        return stats_to_metrics(self.stats, prefix)

    def assigned_resources(self) -> dict[str, float]:
        """What Ray gave the actor (e.g. {"CPU": 0.5}); never a GPU."""
        return self._ray.get(self._actor.assigned_resources.remote(), timeout=30)

    def close(self) -> None:
        try:
            self._ray.get(self._actor.close.remote(), timeout=30)
        except Exception:  # the actor may already be gone; killing it below is what matters
            pass
        self._ray.kill(self._actor)


# ---- the code sandbox as a pool of Ray actors (docs/DESIGN.md §10) ------------------------------------------


class CodeGraderActor:
    """Plain class (unit-testable without Ray): one ``CodeVerifier`` (its own bubblewrap sandbox pool of
    ``workers`` slots) on the node Ray places it on; ``grade`` runs one chunk of rollouts."""

    def __init__(self, verifier_kwargs: Mapping[str, Any]) -> None:
        from rise_nemo.judges.code_verifier import CodeVerifier

        self._verifier = CodeVerifier(**dict(verifier_kwargs))

    def grade(self, responses: Sequence[str], tests: Sequence[Any]) -> list[Any]:
        return self._verifier.grade(responses, tests)

    def close(self) -> None:
        self._verifier.close()


class RayCodeVerifier(CodeReward):
    """The unit-test reward graded on ``actors`` CPU-only Ray actors (``CodeGraderActor``), each with its own
    sandbox pool of ``workers`` slots (``num_cpus = workers``): on a cluster the actors go wherever Ray has
    CPUs (the judge node, CPU nodes), not only the driver's node.

    Back-pressure, not unbounded queues: a step's rollouts are cut into chunks of ``chunk_size``; at most
    ``max_in_flight`` chunks are submitted per actor (one running, the rest queued in the actor); the driver
    waits (``ray.wait``) for a chunk to finish before submitting more. Results come back in input order;
    ``verify`` / ``batch_metrics`` / ``outcomes`` are CodeReward's, as for the local ``CodeVerifier``.
    """

    def __init__(self, actors: int = 2, workers: int = 4, chunk_size: int = 8, max_in_flight: int = 2,
                 verifier_kwargs: Mapping[str, Any] | None = None, start_timeout_s: float = 300.0) -> None:
        import ray

        super().__init__()
        if actors < 1 or workers < 1 or chunk_size < 1 or max_in_flight < 1:
            raise ValueError("actors, workers, chunk_size and max_in_flight must be >= 1")
        if not ray.is_initialized():
            raise RuntimeError("RayCodeVerifier needs a running Ray (call ray.init first; on loopback-only "
                               "machines set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before it)")
        self._ray = ray
        self.chunk_size, self.max_in_flight = int(chunk_size), int(max_in_flight)
        kwargs = {**dict(verifier_kwargs or {}), "workers": int(workers)}
        actor_cls = ray.remote(num_cpus=workers, num_gpus=0, max_restarts=0)(CodeGraderActor)
        self._actors = [actor_cls.remote(kwargs) for _ in range(int(actors))]
        # Fail here, with the actor's own error (e.g. no bubblewrap on that node), not in the first step.
        try:
            ray.get([a.grade.remote([], []) for a in self._actors], timeout=start_timeout_s)
        except Exception as exc:
            for actor in self._actors:
                ray.kill(actor)
            lines = [line for line in str(exc).splitlines() if line.strip()]
            raise RuntimeError(f"a code sandbox actor did not start: {lines[-1] if lines else type(exc).__name__}") from None
        self.peak_in_flight = 0  # the most chunks ever submitted and not finished (<= actors * max_in_flight)

    def grade(self, responses: Sequence[str], tests: Sequence[Any]) -> list[Any]:
        ray = self._ray
        chunks = [(i, list(responses[i:i + self.chunk_size]), list(tests[i:i + self.chunk_size]))
                  for i in range(0, len(responses), self.chunk_size)]
        results: list[Any] = [None] * len(responses)
        load = [0] * len(self._actors)
        pending: dict[Any, tuple[int, int]] = {}  # ref -> (first index, actor)

        def collect(done: list[Any]) -> None:
            for ref in done:
                start, actor = pending.pop(ref)
                load[actor] -= 1
                out = ray.get(ref)
                results[start:start + len(out)] = out

        for start, resp, spec in chunks:
            while min(load) >= self.max_in_flight:  # every actor is full: wait for one chunk to finish
                done, _ = ray.wait(list(pending), num_returns=1)
                collect(done)
            actor = load.index(min(load))
            pending[self._actors[actor].grade.remote(resp, spec)] = (start, actor)
            load[actor] += 1
            self.peak_in_flight = max(self.peak_in_flight, len(pending))
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            collect(done)
        return results

    def close(self) -> None:
        for actor in self._actors:
            try:
                self._ray.get(actor.close.remote(), timeout=60)
            except Exception:  # the actor may already be gone; killing it is what matters
                pass
            self._ray.kill(actor)
