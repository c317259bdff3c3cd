"""Placement probes: NeMo-RL's worker groups on a Ray cluster that DECLARES GPUs, with workers that do no CUDA work.

What is NeMo-RL's and runs unchanged: ``grpo.setup`` / ``distillation.setup`` / ``Value`` building their
``RayVirtualCluster`` (real placement groups on the declared GPUs, their bundles and strategies), ``Policy`` /
``VllmGeneration`` / ``Value`` choosing the worker class, the parallel layout and the workers per bundle,
``RayWorkerGroup`` computing each worker's GPU share (``1 / max_colocated_worker_groups``, worker_groups.py:556-560),
its ranks, ports and environment, ``RayWorkerBuilder.IsolatedWorkerInitializer.create_worker`` (the worker class's
own ``configure_worker``, its Ray options and the placement-group scheduling strategy).

What is replaced, and only because it would touch CUDA: the worker class itself. ``probe_worker_classes()`` maps
NeMo-RL's worker classes (DTensor v1/v2 and Megatron policy workers, the vLLM generation worker, the DTensor v2
and Megatron value workers) to a probe of the same name whose ``configure_worker`` is the REAL one (imported from
NeMo-RL, or, where its module cannot be imported without Megatron-Core, compiled from NeMo-RL's source file:
the function itself, nothing around it) and whose methods record where the worker sits and otherwise do
nothing. Two ways to create it:

- ``executed``: a real Ray actor (``ray.remote`` probe) in a real worker process, scheduled by Ray into NeMo-RL's
  placement group bundle; it reports the node, bundle, GPU ids and the resources Ray granted it. A worker Ray
  cannot place stays pending: that is the failure these tests exist for.
- ``recorded`` (recipes at their documented size, 8 GPUs per node: too many processes for a CI machine): the
  placement groups are still real Ray placement groups on the declared GPUs and NeMo-RL's initializer code still
  runs (in this process); the worker's actor creation is recorded (the placement group, the bundle and the
  options NeMo-RL computed) instead of spawned, and ``fits()`` applies Ray's bundle rule to the records: a
  bundle's GPU and CPU claims may not exceed what the bundle holds; an actor that sets ``num_gpus`` but no
  ``num_cpus`` claims 1 CPU (Ray's default for actors, measured: executed probes report
  ``{'GPU': 0.5, 'CPU': 1.0}``). ``tests/nemo/test_placement_on_declared_gpus.py`` checks that the recorded
  claims equal what Ray grants the executed probes on the same layouts.

One thing NeMo-RL leaves to vLLM is modelled: with vLLM TP/PP > 1, NeMo-RL's workers of an engine ask for no
GPU and the engine's leader gets ``fraction_of_gpus`` (vllm_worker.py:140-148); vLLM's own Ray executor then
starts one worker per bundle of the engine with that fraction. The probe does not start vLLM, so the leader's
record claims ``fraction_of_gpus`` on each of its bundles in its place (``claims()``).
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

import ray

# NeMo-RL's worker classes (fully qualified, v0.7.0) -> the probe that stands in for each.
PROBED = {
    "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker": "VllmGenerationWorker",
    "nemo_rl.models.policy.workers.dtensor_policy_worker.DTensorPolicyWorker": "DTensorPolicyWorker",
    "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2": "DTensorPolicyWorkerV2",
    "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker": "MegatronPolicyWorker",
    "nemo_rl.models.value.workers.dtensor_value_worker_v2.DTensorValueWorkerV2": "DTensorValueWorkerV2",
    "nemo_rl.models.value.workers.megatron_value_worker.MegatronValueWorker": "MegatronValueWorker",
}
MODULE = __name__
RECORDED_PREFIX = "Recorded"


def real_configure_worker(real_fqn: str):
    """NeMo-RL's ``configure_worker`` of that worker class, or None where the class has none (the DTensor workers:
    RayWorkerBuilder then keeps the GPU share it computed). Imported when the module imports here; else (the
    Megatron workers import Megatron-Core at module level, the v2 workers Automodel, whose LoRA kernels triton
    rejects outside the CPU harness) the one function is compiled from NeMo-RL's file."""
    module_name, class_name = real_fqn.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - no Megatron-Core here; the v2 workers' Automodel trips over triton outside
        return _compiled_from_source(module_name, class_name)  # the CPU harness: its configure_worker, from source
    fn = getattr(getattr(module, class_name), "configure_worker", None)
    return fn


def _compiled_from_source(module_name: str, class_name: str):
    spec_root = next(Path(p) for p in sys.path if (Path(p) / "nemo_rl").is_dir())
    path = spec_root / (module_name.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    seen = [class_name]
    while seen:
        node = classes.get(seen.pop())
        if node is None:
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "configure_worker":
                source = textwrap.dedent(ast.get_source_segment(path.read_text(), item))
                source = "\n".join(line for line in source.splitlines() if line.strip() != "@staticmethod")
                namespace: dict[str, Any] = {"Optional": Optional, "Any": Any, "os": os, "__name__": MODULE}
                exec(compile(source, str(path), "exec"), namespace)  # NeMo-RL's function, from its own file
                return namespace["configure_worker"]
        seen += [b.id for b in node.bases if isinstance(b, ast.Name)]
    return None


class PlacementProbe:
    """The worker's stand-in: ``__init__`` takes whatever NeMo-RL passes its worker and records where it runs;
    every other method answers what the setup path expects of a worker that holds no model."""

    REAL_FQN = ""

    def __init__(self, *args: Any, **kwargs: Any):
        self.init_kwargs = {k: kwargs[k] for k in ("bundle_indices", "fraction_of_gpus", "seed") if k in kwargs}
        self.record = self._where()
        self.calls: list[str] = []

    def _where(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "real": self.REAL_FQN,
            "name": ctx.get_actor_name(),
            "node_id": ctx.get_node_id(),
            "placement_group": ctx.get_placement_group_id(),
            "bundle": int(os.environ.get("LOCAL_RANK", "-1")),  # RayWorkerGroup sets LOCAL_RANK = the bundle index
            "node_rank": int(os.environ.get("NODE_RANK", "-1")),
            "rank": int(os.environ.get("RANK", "-1")),
            "world_size": int(os.environ.get("WORLD_SIZE", "-1")),
            "gpu_ids": [int(g) for g in ray.get_gpu_ids()],
            "resources": dict(ctx.get_assigned_resources()),
            **self.init_kwargs,
        }

    def placement(self) -> dict[str, Any]:
        return self.record

    # -- what the setup paths call on a worker (answers of a worker without a model) --------------------------
    def report_node_ip_and_gpu_id(self) -> tuple[str, int]:
        return (ray.util.get_node_ip_address(), (self.record["gpu_ids"] or [self.record["bundle"]])[0])

    def report_device_id(self) -> str:
        return f"probe-{self.record['node_id']}-{self.record['bundle']}"

    def prepare_refit_info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}

    def report_dp_openai_server_base_url(self, *args: Any, **kwargs: Any) -> None:
        return None


# Phase changes and life-cycle calls the setup paths make on workers: recorded, nothing else.
NOOP_METHODS = ("post_init", "sleep", "wake_up", "reset_prefix_cache", "finish_generation", "prepare_for_generation",
                "offload_after_refit", "offload_before_refit", "prepare_for_training", "prepare_for_lp_inference",
                "finish_training", "finish_inference", "prepare_for_inference", "shutdown", "start_gpu_profiling",
                "stop_gpu_profiling", "clear_vllm_logger_metrics")


def _noop(name: str):
    def method(self: PlacementProbe, *args: Any, **kwargs: Any) -> bool:
        self.calls.append(name)
        return True

    method.__name__ = name
    return method


for _name in NOOP_METHODS:
    setattr(PlacementProbe, _name, _noop(_name))


_REAL_CONFIGURE: dict[str, Any] = {}


def _probe_class(real_fqn: str, name: str) -> type:
    """A PlacementProbe subclass for one NeMo-RL worker class. Its ``configure_worker`` is the real class's,
    looked up when RayWorkerBuilder first calls it (in the initializer, which imports that class's module
    anyway); a class without one behaves as RayWorkerBuilder does then: the GPU share it computed, nothing else."""

    def configure_worker(num_gpus: float, bundle_indices: Any = None) -> tuple:
        if real_fqn not in _REAL_CONFIGURE:
            _REAL_CONFIGURE[real_fqn] = real_configure_worker(real_fqn)
        real = _REAL_CONFIGURE[real_fqn]
        if real is None:
            return {"num_gpus": num_gpus}, {}, {}, {}
        return real(num_gpus=num_gpus, bundle_indices=bundle_indices)

    return type(name, (PlacementProbe,), {"REAL_FQN": real_fqn, "__module__": MODULE, "__qualname__": name,
                                          "configure_worker": staticmethod(configure_worker)})


def _define_probes() -> None:
    """For each probed worker: ``Probe<Name>`` (the plain class, importable by name so that Ray pickles it by
    reference), ``<Name>`` (the Ray actor of it) and ``Recorded<Name>`` (the recorder)."""
    module = sys.modules[MODULE]
    for real_fqn, name in PROBED.items():
        plain = _probe_class(real_fqn, "Probe" + name)
        setattr(module, "Probe" + name, plain)
        setattr(module, name, ray.remote(plain))
        setattr(module, RECORDED_PREFIX + name, RecordedActorClass(plain))


# ----------------------------------------------------------------------------------------------------------
# "recorded": actor creation recorded in this process

RECORDS: list[dict[str, Any]] = []  # every recorded worker, in creation order


class RecordedActorClass:
    """Stands where ``worker_class`` is in create_worker: ``.options(**o).remote(*a, **k)`` records the actor
    NeMo-RL asked Ray for and returns a handle whose ``method.remote()`` runs the probe's method here."""

    def __init__(self, plain: type):
        self.plain = plain
        self._default_options: dict[str, Any] = {}
        self.configure_worker = plain.configure_worker

    def options(self, **options: Any) -> _Creation:
        return _Creation(self.plain, options)


class _Creation:
    def __init__(self, plain: type, options: dict[str, Any]):
        self.plain, self.options = plain, options

    def remote(self, *args: Any, **kwargs: Any) -> RecordedHandle:
        strategy = self.options["scheduling_strategy"]
        pg, bundle = strategy.placement_group, strategy.placement_group_bundle_index
        env = (self.options.get("runtime_env") or {}).get("env_vars") or {}
        probe = self.plain.__new__(self.plain)
        probe.init_kwargs = {k: kwargs[k] for k in ("bundle_indices", "fraction_of_gpus", "seed") if k in kwargs}
        probe.calls = []
        node = ray.util.placement_group_table(pg)["bundles_to_node_id"][bundle]
        probe.record = {
            "real": self.plain.REAL_FQN, "name": self.options.get("name"), "node_id": node,
            "placement_group": pg.id.hex(), "bundle": bundle, "node_rank": int(env.get("NODE_RANK", -1)),
            "rank": int(env.get("RANK", -1)), "world_size": int(env.get("WORLD_SIZE", -1)), "gpu_ids": None,
            # Ray's actor defaults: num_gpus as given; num_cpus 1 when unset (measured on the executed probes)
            "resources": {"GPU": float(self.options.get("num_gpus") or 0), "CPU": float(self.options.get("num_cpus", 1))},
            **probe.init_kwargs,
        }
        RECORDS.append(probe.record)
        return RecordedHandle(probe)


class _Method:
    def __init__(self, probe: PlacementProbe, name: str):
        self.probe, self.name = probe, name

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        return ray.put(getattr(self.probe, self.name)(*args, **kwargs))

    def options(self, **_: Any) -> _Method:
        return self


class RecordedHandle:
    def __init__(self, probe: PlacementProbe):
        self._probe = probe

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("__"):
            raise AttributeError(name)
        if not hasattr(self._probe, name):
            raise AttributeError(f"probe worker {self._probe.REAL_FQN} has no method {name!r} (add it to PlacementProbe)")
        return _Method(self._probe, name)


class _InProcessInitializer:
    """``RayWorkerBuilder.IsolatedWorkerInitializer`` run in this process: NeMo-RL's own class (the one Ray would
    start as an actor), its ``create_worker`` called directly, its result handed back as an object ref."""

    def __init__(self, real_cls: type, args: tuple, kwargs: dict):
        self.obj = real_cls(*args, **kwargs)

    @property
    def create_worker(self) -> Any:
        obj = self.obj

        class _Call:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> ray.ObjectRef:
                handle = obj.create_worker(*args, **kwargs)
                return ray.put(handle)

        return _Call


class InProcessInitializerClass:
    def __init__(self, actor_class: Any):
        self.real_cls = actor_class.__ray_metadata__.modified_class

    def options(self, **_: Any) -> InProcessInitializerClass:
        return self

    def remote(self, *args: Any, **kwargs: Any) -> _InProcessInitializer:
        return _InProcessInitializer(self.real_cls, args, kwargs)


# ----------------------------------------------------------------------------------------------------------
# Driver side: route NeMo-RL's worker classes to the probes


def probe_worker_classes(recorded: bool) -> callable:
    """Until the returned ``undo()``: every RayWorkerBuilder NeMo-RL creates for one of its CUDA workers builds the
    probe of that name instead (``recorded``: recorded in this process; else a real Ray actor), and the probes
    run in this interpreter (NeMo-RL's actor registry, as for its other CPU actors). With ``recorded``,
    NeMo-RL's worker initializer runs in this process too."""
    from nemo_rl.distributed import ray_actor_environment_registry as registry
    from nemo_rl.distributed import worker_groups

    builder = worker_groups.RayWorkerBuilder
    original_init = builder.__init__
    original_initializer = builder.IsolatedWorkerInitializer

    def __init__(self, ray_actor_class_fqn: str, *args: Any, **kwargs: Any):
        name = PROBED.get(ray_actor_class_fqn)
        if name is not None:
            ray_actor_class_fqn = f"{MODULE}.{RECORDED_PREFIX if recorded else ''}{name}"
        original_init(self, ray_actor_class_fqn, *args, **kwargs)

    added = []
    for name in PROBED.values():
        for fqn in (f"{MODULE}.{name}", f"{MODULE}.{RECORDED_PREFIX}{name}"):
            if fqn not in registry.ACTOR_ENVIRONMENT_REGISTRY:
                registry.ACTOR_ENVIRONMENT_REGISTRY[fqn] = sys.executable
                added.append(fqn)
    builder.__init__ = __init__
    if recorded:
        builder.IsolatedWorkerInitializer = InProcessInitializerClass(original_initializer)

    def undo() -> None:
        builder.__init__ = original_init
        builder.IsolatedWorkerInitializer = original_initializer
        for fqn in added:
            registry.ACTOR_ENVIRONMENT_REGISTRY.pop(fqn, None)

    return undo


# ----------------------------------------------------------------------------------------------------------
# Ray's bundle rule applied to placements


def claims(record: dict[str, Any]) -> list[tuple[tuple[str, int], dict[str, float]]]:
    """((placement group, bundle), resources) claimed because of this worker: its own, and for a vLLM engine's
    leader with TP/PP > 1 the ``fraction_of_gpus`` vLLM's executor takes on each bundle of the engine."""
    out = [((record["placement_group"], record["bundle"]), dict(record["resources"]))]
    bundles = record.get("bundle_indices") or []
    if record.get("fraction_of_gpus") is not None and len(bundles) > 1:
        out += [((record["placement_group"], b), {"GPU": float(record["fraction_of_gpus"])}) for b in bundles]
    return out


def bundle_usage(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, float]]:
    usage: dict[tuple[str, int], dict[str, float]] = {}
    for record in records:
        for where, resources in claims(record):
            slot = usage.setdefault(where, {"GPU": 0.0, "CPU": 0.0})
            for k in ("GPU", "CPU"):
                slot[k] += float(resources.get(k, 0.0))
    return usage


def overfull(records: list[dict[str, Any]], bundle_capacity: dict[tuple[str, int], dict[str, float]]) -> list[str]:
    """The bundles whose claims exceed what they hold (Ray leaves the last claimant pending for ever)."""
    out = []
    for where, used in sorted(bundle_usage(records).items()):
        cap = bundle_capacity.get(where)
        if cap is None:
            out.append(f"{where}: not a bundle of any placement group")
            continue
        for k in ("GPU", "CPU"):
            if used[k] > cap.get(k, 0.0) + 1e-9:
                who = [r["name"] for r in records if any(w == where for w, _ in claims(r))]
                out.append(f"placement group {where[0][:8]} bundle {where[1]}: {k} {used[k]:g} claimed > {cap.get(k, 0):g} "
                           f"({', '.join(map(str, who))})")
    return out


def capacity_of(clusters: list[Any]) -> dict[tuple[str, int], dict[str, float]]:
    """Bundle -> resources for every placement group of these NeMo-RL clusters (from Ray's table)."""
    out = {}
    for cluster in clusters:
        for pg in cluster.get_placement_groups():
            table = ray.util.placement_group_table(pg)
            for index, spec in table["bundles"].items():
                out[(pg.id.hex(), int(index))] = {k: float(v) for k, v in spec.items()}
    return out


_define_probes()
