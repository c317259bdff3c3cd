"""The local generator's decode loop: the same samples, sampling log-probs and RNG use as the
previous loop (kept below verbatim as the reference) for a fixed seed and for the engine's own RNG, with left
padding, prefixes, temperature/top-p and greedy decoding: the lean decode step (local.decode=lean, the
default) and the HF forward step on both of its mask paths (prepared 4D mask / 2D mask)."""

from __future__ import annotations

import pytest
import torch

from rise_nemo.backends.local import build
from rise_nemo.backends.local.generator import LocalGenerator, _sample, _trim_rows
from rise_nemo.interfaces import SamplingParams

CFG = {"tokenizer": "builtin:persistent_task", "seed": 0, "num_threads": 1, "generation_batch_size": 5}
PROMPTS = [[{"role": "user", "content": "a short one"}],
           [{"role": "user", "content": "a somewhat longer prompt about the weather and the sea"}],
           [{"role": "user", "content": "medium length prompt here"}]]


@torch.no_grad()
def _previous_decode_batch(self, prompt_ids, params, rng):
    """The loop before the leaner one (commit 4ee8def), verbatim."""
    eng = self.engine
    dev = eng.device
    b, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    ids = torch.full((b, width), eng.pad_token_id, dtype=torch.long, device=dev)
    mask = torch.zeros((b, width), dtype=torch.long, device=dev)
    for r, p in enumerate(prompt_ids):
        ids[r, width - len(p) :] = torch.tensor(p, device=dev)
        mask[r, width - len(p) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    stop = torch.tensor(eng.stop_token_ids, device=dev)
    cache = eng.new_cache()
    eng.model.eval()
    logits = eng.forward(ids, mask, pos, cache)[:, -1]
    next_pos = pos[:, -1:] + 1
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    tokens_out, logps_out = [], []
    for _ in range(params.max_new_tokens):
        tok, lp = _sample(logits, params, rng)
        tok = tok.masked_fill(done, eng.pad_token_id)
        tokens_out.append(tok)
        logps_out.append(lp)
        done = done | torch.isin(tok, stop)
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=dev)], dim=1)
        logits = eng.forward(tok[:, None], mask, next_pos, cache)[:, -1]
        next_pos = next_pos + 1
    return _trim_rows(torch.stack(tokens_out, 1), torch.stack(logps_out, 1), stop)


def _run(mode: str, previous: bool, params: SamplingParams, monkeypatch, prefixes=None, prompts=PROMPTS):
    """mode: lean | hf-prepared (the HF step with the model's 4D mask) | hf-2d (the HF step with a 2D mask)."""
    _, gen = build({**CFG, "decode": "lean" if mode == "lean" else "hf"})
    assert gen.engine.lean_decode == (mode == "lean")
    gen.engine.prepared_masks = mode != "hf-2d" and gen.engine.prepared_masks
    if previous:
        monkeypatch.setattr(LocalGenerator, "_decode_batch", _previous_decode_batch)
    first = gen.generate(prompts, 4, params, prefixes=prefixes)
    second = gen.generate(prompts, 2, params)  # the engine RNG's next use (seed unset) must match as well
    monkeypatch.undo()
    return [[(r.response_token_ids, r.sampling_logprobs, r.finished) for r in g] for g in first + second]


@pytest.mark.parametrize("mode", ["lean", "hf-prepared", "hf-2d"])
@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=24, seed=7),
                                    SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9),
                                    SamplingParams(max_new_tokens=12, temperature=0.0)])
def test_decode_loop_samples_equal_the_previous_loop(mode, params, monkeypatch):
    new = _run(mode, False, params, monkeypatch)
    assert new == _run(mode, True, params, monkeypatch)
    assert any(len(set(map(len, (x[0] for x in g)))) > 1 for g in new) or params.temperature == 0


@pytest.mark.parametrize("mode", ["lean", "hf-prepared"])
def test_decode_loop_with_prefixes_and_no_padding(mode, monkeypatch):
    params = SamplingParams(max_new_tokens=16, seed=3)
    same = [PROMPTS[0]] * 2  # one prompt length: no padding, no mask
    prefixes = [[5, 6, 7], [8]]
    assert _run(mode, False, params, monkeypatch, prefixes, same) == _run(mode, True, params, monkeypatch, prefixes, same)
    assert _run(mode, False, params, monkeypatch, prefixes, PROMPTS[:2]) == _run(
        mode, True, params, monkeypatch, prefixes, PROMPTS[:2])


def test_prepared_mask_path_is_taken_here():
    """transformers >= 5 with SDPA on the tiny Qwen3 model: the 4D mask path is the one the tests above cover."""
    import transformers

    _, gen = build(CFG)
    assert gen.engine.prepared_masks == (int(transformers.__version__.split(".")[0]) >= 5)
