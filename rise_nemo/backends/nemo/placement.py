"""Where NeMo-RL's worker groups sit on the GPUs, and what happens when one cannot be placed.

NeMo-RL places every worker with Ray placement groups (nemo_rl/distributed/virtual_cluster.py, v0.7.0): a
``RayVirtualCluster`` reserves one bundle of ``{GPU: 1, CPU: max_colocated_worker_groups}`` per GPU, and each
worker of a group on it asks for ``1 / max_colocated_worker_groups`` of its bundle's GPU
(worker_groups.py:556-560). A cluster built for two colocated groups therefore holds exactly two: a third group
asks for half a GPU of bundles whose GPU is already taken, and Ray leaves it pending for ever (no error, no
timeout: the driver blocks in its first call to the group).

- ``grpo.setup`` builds its colocated cluster for two groups, the policy and vLLM (grpo.py:585-592), and has
  no parameter for it. A method with a critic puts the value model there as a third group, which NeMo-RL's own
  ``ppo.setup`` provides for by building the same cluster for three (ppo.py:407-415).
  ``colocated_groups(grpo, 3)`` makes ``grpo.setup`` build it the way ``ppo.setup`` does, and
  ``check_room`` refuses a group the cluster has no room for, in one line, before Ray is asked.
- Anything that still cannot be placed (too few GPUs or CPUs on the Ray nodes, a Ray cluster smaller than
  the recipe's layout) ends the run in bounded time with one line naming the recipe's layout: NeMo-RL's own
  placement-group errors are translated (``placement_errors``), and ``PlacementWatchdog`` ends a run whose
  Ray actor waits for resources longer than ``nemo.adapter.placement_timeout_s``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rise_nemo.recipe_keys import get

log = logging.getLogger("rise_nemo.backends.nemo")

GRPO_COLOCATED_GROUPS = 2  # grpo.setup: policy + vLLM on one cluster (grpo.py:585-592)
CRITIC_COLOCATED_GROUPS = 3  # ppo.setup: policy + vLLM + value model (ppo.py:407-415)
GRPO_CLUSTER_NAME = "grpo_policy_cluster"  # the colocated cluster grpo.setup builds (grpo.py:584)
DEFAULT_PLACEMENT_TIMEOUT_S = 600.0
PENDING_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION")


class NemoPlacementError(RuntimeError):
    """A worker group that the recipe's layout cannot place; the message is one line naming the layout."""


def layout_line(recipe: Mapping[str, Any]) -> str:
    """The recipe's cluster layout in one line, e.g. ``ppo_math_7b: 1 training node x 8 GPUs, on each GPU:
    policy + vLLM + value model (3 colocated worker groups)``."""
    name = get(recipe, "run.name", "recipe", str)
    nodes = get(recipe, "nemo.cluster.num_nodes", 1, int)
    gpus = get(recipe, "nemo.cluster.gpus_per_node", 8, int)
    colocated = bool(get(recipe, "nemo.policy.generation.colocated.enabled", True, bool))
    groups = ["policy"] + (["vLLM"] if colocated else [])
    if get(recipe, "nemo.teacher", None) is not None:
        groups.append("teacher")
    if get(recipe, "nemo.value", None) is not None:
        groups.append("value model")
    where = f"{nodes} training node(s) x {gpus} GPUs"
    if not colocated:
        gen_nodes = get(recipe, "nemo.policy.generation.colocated.resources.num_nodes", None, int)
        where += f" + vLLM on {gen_nodes or 'dedicated'} node(s)"
    return f"{name}: {where}, on each training GPU: {' + '.join(groups)}"


def has_critic(recipe: Mapping[str, Any]) -> bool:
    """Whether the recipe's method trains a value model (a reasoning method whose advantage estimator reads a
    critic: ``ReasoningMethod.critic``)."""
    from rise_nemo.methods.registry import ReasoningMethod, recipe_method

    method = recipe_method(recipe)
    return isinstance(method, ReasoningMethod) and method.critic


@contextlib.contextmanager
def colocated_groups(grpo_module: Any, groups: int | None) -> Iterator[None]:
    """While the block runs, ``grpo_module.setup`` builds its colocated cluster for ``groups`` worker groups.

    grpo.setup constructs ``RayVirtualCluster(name="grpo_policy_cluster", ..., max_colocated_worker_groups=2)``
    by the name its module imported (grpo.py:585-592); for the block, that name is a subclass that asks for
    ``groups`` instead, so the cluster is built exactly as ppo.setup builds it (ppo.py:407-415). Nothing else
    changes: the non-colocated clusters, the bundles per node, the placement groups and the workers are
    NeMo-RL's. ``None``: grpo.setup's own cluster."""
    if groups is None:
        yield
        return
    original = grpo_module.RayVirtualCluster

    class ColocatedCluster(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any):
            if kwargs.get("name") == GRPO_CLUSTER_NAME:
                kwargs["max_colocated_worker_groups"] = groups
            super().__init__(*args, **kwargs)

    grpo_module.RayVirtualCluster = ColocatedCluster
    try:
        yield
    finally:
        grpo_module.RayVirtualCluster = original


def check_room(cluster: Any, groups_on_it: int, group: str, layout: str) -> None:
    """Refuse, in one line, to add ``group`` to a NeMo-RL cluster that already holds ``groups_on_it`` colocated
    groups and was built for no more (Ray would leave it pending for ever)."""
    room = int(getattr(cluster, "max_colocated_worker_groups", 1))
    if groups_on_it + 1 > room:
        raise NemoPlacementError(
            f"cannot place the {group} on {getattr(cluster, 'name', 'the cluster') or 'the cluster'}: it was built for "
            f"{room} colocated worker group(s) per GPU and holds {groups_on_it} ({layout})")


@contextlib.contextmanager
def placement_errors(layout: str) -> Iterator[None]:
    """NeMo-RL's own placement failures (RayVirtualCluster: ``ResourceInsufficientError`` after its retries,
    ``TimeoutError`` when placement groups are not ready within 180 s) as one line naming the layout."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is a placement failure
        name = type(exc).__name__
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        if name == "ResourceInsufficientError" or (isinstance(exc, TimeoutError) and "placement group" in first):
            raise NemoPlacementError(f"cannot place the worker groups of {layout}: {first}") from exc
        raise


def pending_actors(job_id: Any) -> dict[str, dict[str, Any]]:
    """Actors of this Ray job still waiting to be created (resources, or their dependencies), by actor id.

    Reads the GCS actor table (``ray._private.state.actors``; ``ray.util.state`` would need the dashboard,
    which a Slurm cluster may run without)."""
    from ray._private import state

    out = {}
    for actor_id, info in state.actors(job_id=job_id).items():
        if info.get("State") in PENDING_STATES:
            out[actor_id] = info
    return out


class PlacementWatchdog:
    """A daemon thread that ends the run when one of this job's Ray actors has waited ``timeout_s`` to be
    placed: NeMo-RL's driver would otherwise block in its first call to that actor for ever (on Slurm,
    holding every node until the job's time limit).

    ``on_stuck(message)``: what to do with the one-line message; by default ``failfast.abort`` (print it,
    shut Ray down with a bound, exit non-zero). ``poll_s``: how often the actor table is read."""

    def __init__(self, layout: str, timeout_s: float = DEFAULT_PLACEMENT_TIMEOUT_S,
                 on_stuck: Callable[[str], None] | None = None, poll_s: float = 5.0):
        self.layout = layout
        self.timeout_s = float(timeout_s)
        self.poll_s = float(poll_s)
        self.on_stuck = on_stuck
        self.message: str | None = None
        self._first_seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PlacementWatchdog:
        import ray

        job_id = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
        self._thread = threading.Thread(target=self._watch, args=(job_id,), name="rise-placement-watchdog",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self, job_id: Any, now: float | None = None) -> str | None:
        """One look at the actor table; the failure message once an actor has waited ``timeout_s``."""
        now = time.monotonic() if now is None else now
        pending = pending_actors(job_id)
        for gone in set(self._first_seen) - set(pending):
            del self._first_seen[gone]
        stuck = []
        for actor_id, info in pending.items():
            since = self._first_seen.setdefault(actor_id, now)
            if now - since >= self.timeout_s:
                stuck.append(info)
        if not stuck:
            return None
        first = stuck[0]
        name = first.get("Name") or first.get("ActorClassName") or "an actor"
        return (f"Ray actor {name} ({first.get('ActorClassName', '?')}) was not placed within {self.timeout_s:g} s, "
                f"{len(stuck)} actor(s) waiting for GPU/CPU resources, on {self.layout} (the Ray cluster has "
                f"{_resources()}; nemo.adapter.placement_timeout_s sets this limit)")

    def _watch(self, job_id: Any) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                message = self.check(job_id)
            except Exception as exc:  # noqa: BLE001 - a watchdog that cannot read the table must not kill the run
                log.warning("placement watchdog stopped: cannot read Ray's actor table (%s)", exc)
                return
            if message is not None:
                self.message = message
                if self.on_stuck is not None:
                    self.on_stuck(message)
                else:
                    from rise_nemo.backends.nemo.failfast import abort

                    abort(message)
                return


def _resources() -> str:
    try:
        import ray

        res = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        return f"{nodes} node(s), {res.get('GPU', 0):g} GPUs, {res.get('CPU', 0):g} CPUs"
    except Exception:  # noqa: BLE001 - only for the message
        return "unknown resources"


def start_watchdog(recipe: Mapping[str, Any]) -> PlacementWatchdog | None:
    """The watchdog for a run of ``recipe`` (Ray initialised), or None when turned off
    (``nemo.adapter.placement_timeout_s: 0``)."""
    import ray

    timeout = float(get(recipe, "nemo.adapter.placement_timeout_s", DEFAULT_PLACEMENT_TIMEOUT_S, (int, float)))
    if timeout <= 0 or not ray.is_initialized():
        # no Ray of this process (init_ray replaced, as tests do): nothing to watch. Asking for the runtime
        # context would start or attach to a Ray itself - a stale /tmp/ray/ray_current_cluster made that fail.
        return None
    return PlacementWatchdog(layout_line(recipe), timeout).start()


__all__ = ["CRITIC_COLOCATED_GROUPS", "DEFAULT_PLACEMENT_TIMEOUT_S", "GRPO_COLOCATED_GROUPS", "NemoPlacementError",
           "PlacementWatchdog", "check_room", "colocated_groups", "has_critic", "layout_line", "placement_errors",
           "start_watchdog"]
