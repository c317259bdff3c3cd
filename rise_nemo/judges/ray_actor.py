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
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from rise_nemo.interfaces import JudgeRequest, JudgeStats, Verdict


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
        actor_cls = ray.remote(num_cpus=num_cpus, num_gpus=0, max_restarts=0)(JudgeActor)
        self._actor = actor_cls.remote(builder, dict(cfg))
        # Fail here, with the actor's own error, if the judge cannot be built (bad config, missing key).
        self._last_stats = ray.get(self._actor.stats.remote(), timeout=start_timeout_s)

    def submit(self, requests: Sequence[JudgeRequest]):
        """Start judging; returns an ObjectRef resolving to ``list[list[Verdict]]``."""
        return self._actor.judge.remote(list(requests))

    def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
        return self._ray.get(self.submit(requests), timeout=self.timeout_s)

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
