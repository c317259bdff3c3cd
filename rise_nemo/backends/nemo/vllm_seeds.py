"""NeMo-RL's async vLLM generation worker, made to honour a per-request seed (request seeding).

NeMo-RL v0.7.0 builds one vLLM ``SamplingParams`` per request without a seed
(``BaseVllmGenerationWorker._build_sampling_params``, vllm_worker.py:491-517, called per sample by
``VllmAsyncGenerationWorkerImpl.generate_async``, vllm_worker_async.py:1099-1103), so every sample draws from
the engine's one random stream in whatever order vLLM's continuous batching schedules it: a request's sample
then depends on what else is in flight and when. vLLM itself gives a request with ``SamplingParams.seed`` its
own torch.Generator. This worker passes the seed the driver puts in the request's data (column ``SEED_KEY``,
one int: ``generate_async`` takes one sample per call, vllm_generation.py:756-760) into that request's
``SamplingParams``; everything else is NeMo-RL's worker, unchanged.

How the seed reaches ``_build_sampling_params``, which is not given the data: the first step of NeMo-RL's
``generate_async`` runs in a task whose context holds the seed (``contextvars``), and the task it creates for
the sample (vllm_worker_async.py:1258-1260) inherits that context. No NeMo-RL code is copied.

NeMo-RL picks its worker class by name (vllm_generation.py:188-194, through ``resolve_generation_worker_cls``,
its seam for substituting a worker, utils.py:394-403, which its ModelOpt path uses);
``rise_nemo.backends.nemo.seeded_generation_workers`` substitutes this class while NeMo-RL builds the generation.
This module imports vLLM and runs in the vLLM worker process only.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import ray
from nemo_rl.distributed.worker_group_utils import get_nsight_config_if_pattern_matches
from nemo_rl.models.generation.vllm.vllm_worker_async import VllmAsyncGenerationWorkerImpl

from rise_nemo.backends.nemo.seeding import SEED_KEY

_REQUEST_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("rise_nemo_request_seed", default=None)


class SeededVllmAsyncGenerationWorkerImpl(VllmAsyncGenerationWorkerImpl):
    async def generate_async(self, data: Any, greedy: bool = False):
        seeds = data.get(SEED_KEY) if hasattr(data, "get") else None
        stream = super().generate_async(data, greedy)
        if seeds is None:
            async for item in stream:
                yield item
            return
        context = contextvars.copy_context()
        context.run(_REQUEST_SEED.set, int(seeds[0]))

        async def advance():
            return await stream.__anext__()

        while True:
            try:
                item = await asyncio.create_task(advance(), context=context)
            except StopAsyncIteration:
                return
            yield item

    def _build_sampling_params(self, *, greedy: bool, stop_strings: Any, max_new_tokens: int | None = None):
        params = super()._build_sampling_params(greedy=greedy, stop_strings=stop_strings, max_new_tokens=max_new_tokens)
        seed = _REQUEST_SEED.get()
        if seed is not None and not greedy:
            params.seed = int(seed)  # vLLM: this request samples from its own torch.Generator
        return params


@ray.remote(runtime_env={**get_nsight_config_if_pattern_matches("vllm_async_generation_worker")})  # pragma: no cover
class SeededVllmAsyncGenerationWorker(SeededVllmAsyncGenerationWorkerImpl):
    pass
