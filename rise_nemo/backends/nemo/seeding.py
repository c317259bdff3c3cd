"""Request seeding on NeMo-RL's vLLM generation (the driver's half; the worker is ``vllm_seeds``).

``seeded_generation_workers()`` is held while NeMo-RL builds its ``VllmGeneration`` (inside ``grpo.setup``): for
the async engine it makes NeMo-RL start ``vllm_seeds.SeededVllmAsyncGenerationWorker`` instead of its own
``VllmAsyncGenerationWorker`` (the same class plus the per-request seed), through the function NeMo-RL itself
resolves worker classes with (``resolve_generation_worker_cls``, models/generation/vllm/utils.py:394-403; its
ModelOpt workers are substituted there), and gives the class NeMo-RL's own interpreter for vLLM workers
(``ACTOR_ENVIRONMENT_REGISTRY``). A worker class that NeMo-RL resolves to something else (a ModelOpt
quantized worker, ``generation.quant_cfg``) is left alone: its requests are not seeded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

SEED_KEY = "sampling_seed"  # generation data column: the request's seed ([1] int64; one sample per async call)
NEMO_ASYNC_WORKER = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker"
SEEDED_ASYNC_WORKER = "rise_nemo.backends.nemo.vllm_seeds.SeededVllmAsyncGenerationWorker"


@contextmanager
def seeded_generation_workers() -> Iterator[None]:
    """While held, NeMo-RL builds its async vLLM workers as ``SEEDED_ASYNC_WORKER`` (module docstring)."""
    from nemo_rl.distributed import ray_actor_environment_registry as registry
    from nemo_rl.models.generation.vllm import vllm_generation

    registry.ACTOR_ENVIRONMENT_REGISTRY.setdefault(SEEDED_ASYNC_WORKER, registry.get_actor_python_env(NEMO_ASYNC_WORKER))
    resolve = vllm_generation.resolve_generation_worker_cls

    def resolve_seeded(default_cls: str, config: dict) -> str:
        chosen = resolve(default_cls, config)
        return SEEDED_ASYNC_WORKER if chosen == NEMO_ASYNC_WORKER else chosen

    vllm_generation.resolve_generation_worker_cls = resolve_seeded
    try:
        yield
    finally:
        vllm_generation.resolve_generation_worker_cls = resolve
