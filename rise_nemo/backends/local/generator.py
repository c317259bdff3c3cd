"""LocalGenerator: batched sampling with a KV cache, temperature, top-p, EOS stop, max new tokens.

Rows (prompt x sample) are left-padded into one batch so every row's next token sits in the last column;
position ids skip the padding, so a row's logits equal those of the same row decoded alone. The sampling
log-prob of a token is taken from the distribution actually sampled from (tempered, top-p truncated and
renormalised); at temperature 1 and top_p 1 it equals the policy's ``get_logprobs`` for the same tokens.

Reproducibility: ``SamplingParams.seed`` set -> a fresh torch.Generator with that seed for this call (the
same call always gives the same samples); unset -> the engine's RNG (seeded by ``local.seed``), which
advances with every call and is saved in the policy's state_dict for exact resume. ``seeds`` (request
seeding, interfaces.Generator): each row draws its uniforms from its own seed (``RequestUniforms``), so its
random numbers do not depend on the other rows.

Streaming (``open_stream``, interfaces.RolloutStream): a background thread decodes each call's rows in slot
order, in the same chunks of ``generation_batch_size`` rows as ``generate`` (a chunk starts once its rows are
known), and reports every row when its chunk ends. A row's logits depend on its batch in the last bit (the
attention and GEMM reductions see other rows' padding), so keeping the chunks is what makes a streamed call
return exactly what ``generate`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rise_nemo.backends.local.engine import LocalEngine
from rise_nemo.backends.local.lean_decode import LeanDecoder
from rise_nemo.core.rubric import Conversation
from rise_nemo.interfaces import GenerationRequest, OnRollout, Rollout, SamplingParams


def _check_params(params: SamplingParams, n: int) -> None:
    if n < 1:
        raise ValueError(f"generate: n must be >= 1, got {n}")
    if params.max_new_tokens < 1:
        raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature must be >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {params.top_p}")


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs [B, V] of the distribution sampled from: softmax(logits / T), top-p truncated.

    Top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (the most likely token
    always stays) and renormalises; removed tokens get -inf.
    """
    x = logits.float()
    logp = torch.log_softmax(x if temperature == 1 else x / temperature, dim=-1)  # [B, V]
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()  # mass of strictly better tokens
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    logp = logp.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logp, dim=-1)


class RequestUniforms:
    """Per-row random numbers from each row's own seed: the t-th uniform of a row is the t-th output of
    SplitMix64 (Steele, Lea & Flood 2014) seeded with the row's seed, read as a float64 in [0, 1) from its top 53
    bits. Stateless in the rows, so a row draws the same numbers in any batch; stands in for a torch.Generator in
    ``inverse_cdf_sample`` (one uniform per row per call, rows that stopped included)."""

    _GAMMA, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)

    def __init__(self, seeds: Sequence[int]):
        self.seeds = np.array([int(x) % 2**64 for x in seeds], dtype=np.uint64)
        self.draws = 0  # uniforms drawn per row so far

    def uniforms(self, rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The next uniform of every row, [rows, 1] float64."""
        if rows != len(self.seeds):
            raise ValueError(f"RequestUniforms: {rows} rows asked, {len(self.seeds)} seeds")
        self.draws += 1
        with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as SplitMix64 intends
            z = self.seeds + np.uint64(self.draws) * self._GAMMA
            z = (z ^ (z >> np.uint64(30))) * self._M1
            z = (z ^ (z >> np.uint64(27))) * self._M2
            z = z ^ (z >> np.uint64(31))
        u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return torch.from_numpy(u).to(device)[:, None]


Randomness = torch.Generator | RequestUniforms


def _sample(logits: torch.Tensor, params: SamplingParams, rng: Randomness) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] and their sampling log-probs [B] (greedy at temperature 0: log-prob 0)."""
    if params.temperature == 0:
        return logits.argmax(dim=-1), torch.zeros(logits.shape[0], device=logits.device)
    logp = sampling_logprobs(logits, params.temperature, params.top_p)
    tokens = inverse_cdf_sample(logp, rng)  # [B]
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


SAMPLER_CHUNK_ELEMENTS = 1 << 18  # rows per CDF pass: 2 MiB of float64, so the pass stays in the CPU's cache


def inverse_cdf_sample(logp: torch.Tensor, rng: Randomness) -> torch.Tensor:
    """One token per row [B] drawn from the log-probs ``logp`` [B, V] (-inf entries are never drawn) by
    inverting the row's CDF at one uniform number: token = the first index whose cumulative mass exceeds
    u * total.

    The same distribution as ``torch.multinomial(logp.exp(), 1)``, which on CPU draws V random numbers per row:
    1 against V uniforms made sampling ~10x cheaper for the embedded model (128 rows of a 330-token vocabulary,
    a third of its decode step before) and ~13x for 64 rows of Qwen's 152k vocabulary (bench/sampler.py). The
    CDF and u are float64, so a token's chance differs from its probability by ~1e-16, not float32's 2^-24
    (Qwen's tail tokens are rarer than that). The CDF is built a few rows at a time (SAMPLER_CHUNK_ELEMENTS):
    one [64, 152k] float64 pass spills out of the cache and costs ~3x more; a row's CDF does not depend on the
    other rows, so the draws are the same either way. Rows that have stopped still draw, so the RNG's use per
    token is fixed (B numbers), whichever rows are still decoding. No host sync.
    """
    rows, vocab = logp.shape
    if isinstance(rng, RequestUniforms):
        u = rng.uniforms(rows, logp.device)  # [B, 1] in [0, 1), each row from its own seed
    else:
        u = torch.rand((rows, 1), dtype=torch.float64, generator=rng, device=logp.device)  # [B, 1] in [0, 1)
    step = max(1, SAMPLER_CHUNK_ELEMENTS // vocab)
    # Two buffers reused by every chunk: fresh multi-MiB tensors per chunk cost page faults (3x slower, erratic).
    probs = torch.empty((min(step, rows), vocab), dtype=torch.float64, device=logp.device)
    cdf_buffer = torch.empty_like(probs)
    tokens = []
    for r in range(0, rows, step):
        n = min(step, rows - r)
        probs[:n].copy_(logp[r : r + n]).exp_()
        cdf = torch.cumsum(probs[:n], dim=-1, out=cdf_buffer[:n])  # [n, V], non-decreasing
        total = cdf[:, -1:].contiguous()  # [n, 1] (1 up to rounding)
        first = torch.searchsorted(cdf, u[r : r + n] * total, right=True)  # first index with cdf > u * total
        # u * total can round up to total itself: then no index qualifies (V); the last token with mass is the
        # one where the CDF first reaches its total.
        tokens.append(torch.minimum(first, torch.searchsorted(cdf, total)).squeeze(1))
    return tokens[0] if len(tokens) == 1 else torch.cat(tokens)


class LocalGenerator:
    """interfaces.Generator on the shared LocalEngine."""

    def __init__(self, engine: LocalEngine):
        self.engine = engine

    def encode_prompt(self, messages: Conversation) -> list[int]:
        return self.engine.encode_prompt(messages)

    def encode_response(self, text: str) -> list[int]:
        """Response text -> token ids ending with EOS, exactly as a finished generation would be."""
        return self.engine.encode_response(text)

    def decode_response(self, token_ids: Sequence[int]) -> str:
        """Response token ids -> the text the judge sees (also used to locate token spans)."""
        return self.engine.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()

    def generate(
        self,
        prompts: Sequence[Conversation],
        n: int,
        params: SamplingParams,
        prefixes: Sequence[Sequence[int]] | None = None,
        *,
        seeds: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Rollout]]:
        """interfaces.Generator.generate. ``prefixes[i]``: given response tokens every sample of prompt i
        continues (decoded as context after the prompt; docs/DESIGN.md §7). They open each Rollout's
        ``response_token_ids`` with sampling log-prob 0.0 and ``given_token_count = len(prefixes[i])``.
        ``seeds[i][j]``: row (i, j) draws from its own seed (``RequestUniforms``)."""
        _check_params(params, n)
        if not prompts:
            return []
        if prefixes is not None and len(prefixes) != len(prompts):
            raise ValueError(f"generate: {len(prefixes)} prefixes for {len(prompts)} prompts")
        if seeds is not None and (len(seeds) != len(prompts) or any(len(s) != n for s in seeds)):
            raise ValueError(f"generate: seeds must be {len(prompts)} lists of {n} (one per sample)")
        requests = [GenerationRequest(list(p), n, tuple(map(int, seeds[i])) if seeds is not None else None,
                                      tuple(map(int, prefixes[i])) if prefixes is not None else ())
                    for i, p in enumerate(prompts)]
        rows = [row for i, r in enumerate(requests) for row in self._rows(i, r)]
        rng = self._call_randomness(params, rows)
        out: list[list[Rollout]] = [[] for _ in prompts]
        bs = self.engine.cfg.generation_batch_size
        for start in range(0, len(rows), bs):
            chunk = rows[start : start + bs]
            for row, rollout in zip(chunk, self._decode_rows(chunk, params, rng)):
                out[row.slot].append(rollout)
        return out

    def open_stream(self, on_rollout: OnRollout) -> LocalRolloutStream:
        """interfaces.StreamingGenerator: calls decoded in a background thread, chunk by chunk (module docstring)."""
        return LocalRolloutStream(self, on_rollout)

    def _rows(self, slot: int, request: GenerationRequest) -> list[_Row]:
        """The request's samples as decode rows (samples of one prompt adjacent, as ``generate`` orders them)."""
        ids = self.encode_prompt(request.prompt)
        seeds = request.seeds if request.seeds is not None else (None,) * request.n
        return [_Row(slot, j, request.prompt, ids, list(request.prefix), seeds[j]) for j in range(request.n)]

    def _call_randomness(self, params: SamplingParams, rows: Sequence[_Row]) -> torch.Generator | None:
        """The random stream a call's rows share: None when every row has its own seed (request seeding)."""
        seeded = {row.seed is not None for row in rows}
        if len(seeded) > 1:
            raise ValueError("generate: either every request of a call has seeds or none has")
        if seeded == {True}:
            return None
        if params.seed is None:
            return self.engine.rng
        rng = torch.Generator(device=self.engine.device)
        rng.manual_seed(int(params.seed))
        return rng

    def _decode_rows(self, rows: Sequence[_Row], params: SamplingParams, rng: torch.Generator | None) -> list[Rollout]:
        """One decode batch: the rows' rollouts, in row order (``rng`` None: each row's own seed)."""
        randomness = rng if rng is not None else RequestUniforms([row.seed for row in rows])
        results = self._decode_batch([row.prompt_ids + row.given for row in rows], params, randomness)
        out = []
        for row, (sampled, sampled_logps, finished) in zip(rows, results):
            tokens, logps = row.given + sampled, [0.0] * len(row.given) + sampled_logps
            out.append(Rollout(
                prompt_messages=[dict(m) for m in row.prompt],
                prompt_token_ids=list(row.prompt_ids),
                response_token_ids=tokens,
                response_text=self.decode_response(tokens),
                sampling_logprobs=logps,
                finished=finished,
                given_token_count=len(row.given),
            ))
        return out

    @torch.inference_mode()
    def _decode_batch(
        self, prompt_ids: list[list[int]], params: SamplingParams, rng: Randomness
    ) -> list[tuple[list[int], list[float], bool]]:
        """Decode one left-padded batch; returns (response ids incl. EOS, sampling log-probs, finished).

        Runs under ``torch.inference_mode`` (no autograd bookkeeping on any op; nothing it creates outlives the
        call but Python lists). The prefill is the HF forward; per token: one decode step, the sampler, the stop
        check. The decode step is ``LeanDecoder.step`` (a static KV cache, 105 aten ops against the HF forward's 170,
        finished rows no longer computed; lean_decode.py) where the engine supports it (``engine.lean_decode``, ``local.decode``), else the HF
        forward on a DynamicCache with everything prepared before the loop: the positions of all steps, and the
        attention mask as the model's prepared 4D mask (transformers >= 5 with SDPA and full attention: the model
        skips building it from the 2D mask at every token) or a preallocated 2D mask sliced per step; a batch
        without padding passes no mask (what the model's mask builder would conclude anyway). The stop check
        reads one bool per token: free on CPU (no device queue to drain). Both steps give the same logits for every
        row still decoding, and the samples, their log-probs and the RNG's use are exactly the previous loop's
        (tests/local/test_decode_loop.py, tests/local/test_lean_decode.py).
        """
        eng = self.engine
        dev = eng.device
        n = params.max_new_tokens
        b, width = len(prompt_ids), max(len(p) for p in prompt_ids)
        ids = torch.full((b, width), eng.pad_token_id, dtype=torch.long, device=dev)  # [B, L] left-padded
        mask = torch.zeros((b, width), dtype=torch.long, device=dev)
        for r, p in enumerate(prompt_ids):
            ids[r, width - len(p) :] = torch.tensor(p, device=dev)
            mask[r, width - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, L] positions ignore the padding
        stop = torch.tensor(eng.stop_token_ids, device=dev)
        eng.model.eval()
        if eng.lean_decode:
            decoder = LeanDecoder(eng)
            logits = decoder.prefill(ids, mask, pos, n)  # [B, V]
            step = decoder.step
        else:
            logits, step = self._hf_steps(ids, mask, pos, n)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        tokens_out, logps_out = [], []
        for i in range(n):
            tok, lp = _sample(logits, params, rng)  # [B], [B]
            tok = tok.masked_fill(done, eng.pad_token_id)
            tokens_out.append(tok)
            logps_out.append(lp)
            done = done | torch.isin(tok, stop)
            if bool(done.all()):  # on CPU a free check; the loop ends as soon as every row stopped
                break
            logits = step(tok, i, done)
        return _trim_rows(torch.stack(tokens_out, 1), torch.stack(logps_out, 1), stop)

    def _hf_steps(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, n: int):
        """The HF prefill's last logits [B, V] and the HF decode step ``(tok [B], i, done [B]) -> logits [B, V]``
        (every row, finished or not)."""
        eng = self.engine
        width = ids.shape[1]
        logits, cache, positions = eng.prefill(ids, mask, pos, n)  # [B, V], DynamicCache, [B, N]
        step_mask = self._step_mask(mask, n)  # [B, 1, 1, L + N] bool, [B, L + N] long, or None (no padding)

        def step(tok: torch.Tensor, i: int, done: torch.Tensor) -> torch.Tensor:
            kv_mask = None if step_mask is None else step_mask[..., : width + i + 1]
            return eng.forward(tok[:, None], kv_mask, positions[:, i : i + 1], cache)[:, -1]

        return logits, step

    def _step_mask(self, mask: torch.Tensor, n: int) -> torch.Tensor | None:
        """The decode steps' attention mask over prompt + N generated columns (see _decode_batch), or None."""
        if bool(mask.all()):
            return None
        full = torch.cat([mask, mask.new_ones(mask.shape[0], n)], dim=1)  # [B, L + N]
        if self.engine.prepared_masks:
            return full.bool()[:, None, None, :]
        return full


def _trim_rows(tokens: torch.Tensor, logps: torch.Tensor, stop: torch.Tensor) -> list[tuple[list[int], list[float], bool]]:
    """Cut each row after its first stop token; rows without one are unfinished (hit max_new_tokens)."""
    out = []
    is_stop = torch.isin(tokens, stop)  # [B, N]
    for r in range(tokens.shape[0]):
        hits = is_stop[r].nonzero()
        finished = hits.numel() > 0
        end = int(hits[0]) + 1 if finished else tokens.shape[1]
        out.append((tokens[r, :end].tolist(), logps[r, :end].float().tolist(), finished))
    return out


@dataclass
class _Row:
    """One sample to decode: slot (the request's place in its call), sample index, prompt, its token ids, the
    given prefix, and the row's own seed (None: the call's random stream)."""

    slot: int
    sample: int
    prompt: Conversation
    prompt_ids: list[int]
    given: list[int]
    seed: int | None


class _StreamCall:
    """One streamed call: its slots, the rows of the slots known so far in slot order, and its random stream."""

    def __init__(self, tag: Hashable, slots: int, params: SamplingParams):
        _check_params(params, 1)
        self.tag, self.params = tag, params
        self.slots: list[list[_Row] | None] = [None] * slots  # [] = skipped
        self.known = 0  # slots[:known] are all put or skipped
        self.rows: list[_Row] = []  # rows of slots[:known], in slot order
        self.taken = 0  # rows handed to the decoder
        self.rng: torch.Generator | None = None
        self.rng_fixed = False

    @property
    def complete(self) -> bool:
        return self.known == len(self.slots)

    def next_chunk(self, size: int) -> list[_Row]:
        """The next ``size`` rows (fewer at the call's end), once they are all known; [] until then."""
        left = len(self.rows) - self.taken
        if left >= size or (self.complete and left > 0):
            chunk = self.rows[self.taken : self.taken + size]
            self.taken += len(chunk)
            return chunk
        return []

    @property
    def finished(self) -> bool:
        return self.complete and self.taken == len(self.rows)


class LocalRolloutStream:
    """interfaces.RolloutStream of the local backend (module docstring). Calls are decoded in the order they
    were opened; a call that cannot fill its next chunk yet (slots still unknown) waits, and so does every later
    call that shares its random stream (the engine's), so each stream's draws are taken in ``generate``'s order."""

    def __init__(self, generator: LocalGenerator, on_rollout: OnRollout):
        self.generator = generator
        self.on_rollout = on_rollout
        self._calls: list[_StreamCall] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rise-local-rollouts", daemon=True)
        self._thread.start()

    def call(self, tag: Hashable, slots: int, params: SamplingParams) -> _LocalCallHandle:
        with self._cond:
            if self._closed:
                raise RuntimeError("rollout stream is closed")
            call = _StreamCall(tag, slots, params)
            self._calls.append(call)
            self._cond.notify_all()
        return _LocalCallHandle(self, call)

    def _fill(self, call: _StreamCall, slot: int, rows: list[_Row]) -> None:
        with self._cond:
            if not 0 <= slot < len(call.slots):
                raise IndexError(f"call {call.tag!r}: slot {slot} out of range 0..{len(call.slots) - 1}")
            if call.slots[slot] is not None:
                raise ValueError(f"call {call.tag!r}: slot {slot} was already filled")
            call.slots[slot] = rows
            while call.known < len(call.slots) and call.slots[call.known] is not None:
                call.rows += call.slots[call.known]
                call.known += 1
            self._cond.notify_all()

    def _next(self) -> tuple[_StreamCall, list[_Row]] | None:
        """The next chunk to decode (caller holds the lock), or None."""
        busy_streams: set[int] = set()
        for call in self._calls:
            if call.finished:
                continue
            # the engine's stream: no call seed and rows without seeds (unknown yet: assume so)
            shares_engine = call.params.seed is None and (not call.rows or call.rows[0].seed is None)
            if shares_engine and "engine" in busy_streams:
                continue
            chunk = call.next_chunk(self.generator.engine.cfg.generation_batch_size)
            if chunk:
                return call, chunk
            if shares_engine:
                busy_streams.add("engine")
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (work := self._next()) is None:
                    self._cond.wait()
                if self._closed:
                    return
            call, chunk = work
            try:
                if not call.rng_fixed:
                    call.rng, call.rng_fixed = self.generator._call_randomness(call.params, chunk), True
                rollouts = self.generator._decode_rows(chunk, call.params, call.rng)
            except BaseException as exc:  # reported per row: the consumer decides (the rubric step raises)
                for row in chunk:
                    self._report(call.tag, row.slot, row.sample, exc)
                continue
            for row, rollout in zip(chunk, rollouts):
                self._report(call.tag, row.slot, row.sample, rollout)

    def _report(self, tag, slot, sample, item) -> None:
        if not self._closed:
            self.on_rollout(tag, slot, sample, item)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()


class _LocalCallHandle:
    """interfaces.GenerationCall of a LocalRolloutStream call."""

    def __init__(self, stream: LocalRolloutStream, call: _StreamCall):
        self._stream, self._call = stream, call

    def put(self, slot: int, request: GenerationRequest) -> None:
        self._stream._fill(self._call, slot, self._stream.generator._rows(slot, request))

    def skip(self, slot: int) -> None:
        self._stream._fill(self._call, slot, [])
