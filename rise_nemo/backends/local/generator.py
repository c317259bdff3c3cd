"""LocalGenerator: batched sampling with a KV cache, temperature, top-p, EOS stop, max new tokens.

Rows (prompt x sample) are left-padded into one batch so every row's next token sits in the last column;
position ids skip the padding, so a row's logits equal those of the same row decoded alone. The sampling
log-prob of a token is taken from the distribution actually sampled from (tempered, top-p truncated and
renormalised); at temperature 1 and top_p 1 it equals the policy's ``get_logprobs`` for the same tokens.

Reproducibility: ``SamplingParams.seed`` set -> a fresh torch.Generator with that seed for this call (the
same call always gives the same samples); unset -> the engine's RNG (seeded by ``local.seed``), which
advances with every call and is saved in the policy's state_dict for exact resume.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rise_nemo.backends.local.engine import LocalEngine
from rise_nemo.backends.local.lean_decode import LeanDecoder
from rise_nemo.core.rubric import Conversation
from rise_nemo.interfaces import Rollout, SamplingParams


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


def _sample(logits: torch.Tensor, params: SamplingParams, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens [B] and their sampling log-probs [B] (greedy at temperature 0: log-prob 0)."""
    if params.temperature == 0:
        return logits.argmax(dim=-1), torch.zeros(logits.shape[0], device=logits.device)
    logp = sampling_logprobs(logits, params.temperature, params.top_p)
    tokens = inverse_cdf_sample(logp, rng)  # [B]
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


SAMPLER_CHUNK_ELEMENTS = 1 << 18  # rows per CDF pass: 2 MiB of float64, so the pass stays in the CPU's cache


def inverse_cdf_sample(logp: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
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
    ) -> list[list[Rollout]]:
        """interfaces.Generator.generate. ``prefixes[i]``: given response tokens every sample of prompt i
        continues (decoded as context after the prompt; docs/DESIGN.md §7). They open each Rollout's
        ``response_token_ids`` with sampling log-prob 0.0 and ``given_token_count = len(prefixes[i])``."""
        _check_params(params, n)
        if not prompts:
            return []
        if prefixes is not None and len(prefixes) != len(prompts):
            raise ValueError(f"generate: {len(prefixes)} prefixes for {len(prompts)} prompts")
        given = [list(map(int, prefixes[i])) if prefixes is not None else [] for i in range(len(prompts))]
        rng = self.engine.rng
        if params.seed is not None:
            rng = torch.Generator(device=self.engine.device)
            rng.manual_seed(int(params.seed))
        prompt_ids = [self.encode_prompt(p) for p in prompts]
        rows = [i for i in range(len(prompts)) for _ in range(n)]  # row -> prompt index, samples adjacent
        results: list[tuple[list[int], list[float], bool]] = []
        bs = self.engine.cfg.generation_batch_size
        for start in range(0, len(rows), bs):
            chunk = [prompt_ids[i] + given[i] for i in rows[start : start + bs]]
            results.extend(self._decode_batch(chunk, params, rng))
        out: list[list[Rollout]] = [[] for _ in prompts]
        for row, (sampled, sampled_logps, finished) in zip(rows, results):
            tokens, logps = given[row] + sampled, [0.0] * len(given[row]) + sampled_logps
            out[row].append(
                Rollout(
                    prompt_messages=[dict(m) for m in prompts[row]],
                    prompt_token_ids=list(prompt_ids[row]),
                    response_token_ids=tokens,
                    response_text=self.decode_response(tokens),
                    sampling_logprobs=logps,
                    finished=finished,
                    given_token_count=len(given[row]),
                )
            )
        return out

    @torch.inference_mode()
    def _decode_batch(
        self, prompt_ids: list[list[int]], params: SamplingParams, rng: torch.Generator
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
