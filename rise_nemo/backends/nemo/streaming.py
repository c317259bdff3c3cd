"""Streamed generation on NeMo-RL's async vLLM engine (``vllm_cfg.async_engine: true``).

``NemoRolloutStream`` is ``interfaces.RolloutStream`` on ``VllmGeneration.generate_async``, NeMo-RL's own
streaming path (one sample per call; each call goes to a vLLM worker that adds it to its running batch,
vllm_generation.py:727-805): every sample of a put request is submitted at once from an asyncio loop in a
background thread and reported to ``on_rollout`` when its call returns, so the caller can judge a response while
vLLM is still generating others, and add requests (privileged prompts) while the engine runs. A request's seeds go
with it (``seeding.SEED_KEY``; the worker is ``vllm_seeds``), so a seeded sample does not depend on what else vLLM
batches it with or when; ``generate`` on the async engine is one streamed call. The stream opens the session's
generation window (one refit per step, as for the synchronous engine); closing the stream does not close it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable
from concurrent.futures import Future
from typing import Any

import torch

from rise_nemo.backends.nemo.batch import generation_input, rollouts_from_generation
from rise_nemo.backends.nemo.seeding import SEED_KEY
from rise_nemo.interfaces import GenerationRequest, OnRollout, Rollout, SamplingParams


class NemoRolloutStream:
    def __init__(self, generator: Any, on_rollout: OnRollout):
        from rise_nemo.judges.client import LoopThread

        self.generator = generator  # runtime.NemoGenerator
        self.on_rollout = on_rollout
        generator.session.open_generation()  # the step's one refit, before the first request
        self._loop = LoopThread("rise-vllm-rollouts")
        self._futures: set[Future] = set()
        self._lock = threading.Lock()
        self._closed = False

    def call(self, tag: Hashable, slots: int, params: SamplingParams) -> NemoCall:
        if self._closed:
            raise RuntimeError("rollout stream is closed")
        return NemoCall(self, tag, slots, greedy=self.generator._check_params(params))

    def _submit(self, tag: Hashable, slot: int, request: GenerationRequest, greedy: bool) -> None:
        g = self.generator
        prompt_ids = g.encode_prompt(list(request.prompt))
        inputs = prompt_ids + [int(t) for t in request.prefix]
        g._check_lengths([inputs])
        for j in range(request.n):
            data = generation_input([inputs], 1, g.pad_id)  # input_ids [1, L], input_lengths [1]
            if request.seeds is not None:
                data[SEED_KEY] = torch.tensor([int(request.seeds[j])], dtype=torch.long)
            future = asyncio.run_coroutine_threadsafe(
                self._sample(tag, slot, j, request, prompt_ids, data, greedy), self._loop.loop)
            with self._lock:
                self._futures.add(future)
            future.add_done_callback(self._forget)

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._futures.discard(future)

    async def _sample(self, tag, slot: int, j: int, request: GenerationRequest, prompt_ids: list[int],
                      data: dict[str, torch.Tensor], greedy: bool) -> None:
        g = self.generator
        item: Rollout | BaseException
        try:
            outputs = [out async for _, out in g.session.generation.generate_async(g.session.to_batched(data),
                                                                                   greedy=greedy)]
            output = outputs[-1] if outputs else None  # one sample per call: one output
            if output is None:
                raise RuntimeError(f"vLLM returned no output for sample {j} of request {slot} of call {tag!r}")
            item = rollouts_from_generation(output, [list(request.prompt)], [prompt_ids], 1, decode=g.decode_response,
                                            eos_token_ids=g.eos_ids,
                                            prefixes=[list(request.prefix)] if request.prefix else None)[0][0]
        except asyncio.CancelledError:
            return
        except BaseException as exc:  # reported per sample: the consumer decides (the rubric step raises)
            item = exc
        if not self._closed:
            self.on_rollout(tag, slot, j, item)

    def close(self) -> None:
        """Abandons samples still in flight (their vLLM requests finish unread) and stops the loop thread."""
        self._closed = True
        with self._lock:
            pending = list(self._futures)
        for future in pending:
            future.cancel()
        self._loop.stop()


class NemoCall:
    """interfaces.GenerationCall: a put request is submitted to vLLM at once (no slot order to keep: seeded
    samples do not depend on their batch, and unseeded vLLM samples depend on it anyway)."""

    def __init__(self, stream: NemoRolloutStream, tag: Hashable, slots: int, greedy: bool):
        self._stream, self.tag, self.greedy = stream, tag, greedy
        self._filled = [False] * slots

    def _fill(self, slot: int) -> None:
        if not 0 <= slot < len(self._filled):
            raise IndexError(f"call {self.tag!r}: slot {slot} out of range 0..{len(self._filled) - 1}")
        if self._filled[slot]:
            raise ValueError(f"call {self.tag!r}: slot {slot} was already filled")
        self._filled[slot] = True

    def put(self, slot: int, request: GenerationRequest) -> None:
        self._fill(slot)
        self._stream._submit(self.tag, slot, request, self.greedy)

    def skip(self, slot: int) -> None:
        self._fill(slot)
