"""The lean decode step (rise_nemo.backends.local.lean_decode): its logits equal the HF forward's on the same
cache (left-padded batches of different prompt lengths, GQA and plain multi-head attention, tied and untied
heads, Qwen3 / Qwen2 with q/k/v biases / Llama), a fixed-seed generate gives the HF loop's samples and
log-probs, it reads the trained weights at every call, and unsupported models fall back to the HF loop."""

from __future__ import annotations

import pytest
import torch

from rise_nemo.backends.local import build
from rise_nemo.backends.local.config import LocalConfigError, parse_local_config
from rise_nemo.backends.local.lean_decode import LeanDecoder, lean_support
from rise_nemo.interfaces import SamplingParams

CFG = {"tokenizer": "builtin:persistent_task", "seed": 0, "num_threads": 1, "generation_batch_size": 6}
PROMPTS = [[{"role": "user", "content": "a short one"}],
           [{"role": "user", "content": "a somewhat longer prompt about the weather and the sea"}],
           [{"role": "user", "content": "medium length prompt here"}]]


def _model(kind: str, vocab: int, heads: int = 4, kv_heads: int = 2, tied: bool = True):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=48, max_position_embeddings=128,
                  tie_word_embeddings=tied, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        if kind == "qwen3":
            return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=8, **common))
        if kind == "qwen2":  # q/k/v projections with biases
            model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
        else:  # llama with biases in attention and MLP
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(attention_bias=True, mlp_bias=True,
                                                                           **common))
        for name, p in model.named_parameters():  # HF initialises biases to 0: make them count
            if name.endswith("bias"):
                p.data.normal_(0, 0.5)
        return model


def _engine(model=None, dtype="float32"):
    _, gen = build({**CFG, "dtype": dtype})
    if model is not None:
        gen.engine.model = model.eval()
    return gen.engine


def _left_padded(eng, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, width = len(lens), max(lens)
    ids = torch.full((b, width), eng.pad_token_id)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, n in enumerate(lens):
        ids[r, width - n:] = torch.randint(3, eng.model.config.vocab_size, (n,), generator=g)
        mask[r, width - n:] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("kind,heads,kv_heads,tied", [("qwen3", 4, 2, True), ("qwen3", 4, 2, False),
                                                      ("qwen3", 4, 4, True), ("qwen2", 4, 2, False),
                                                      ("llama", 4, 1, True), ("qwen3-bfloat16", 4, 2, True)])
@pytest.mark.parametrize("lens", [[5, 9, 3, 9, 7, 1], [6, 6, 6]])  # left padding / none (no mask)
@torch.inference_mode()
def test_lean_step_logits_equal_the_hf_forward(kind, heads, kv_heads, tied, lens):
    eng = _engine(dtype="bfloat16" if kind.endswith("bfloat16") else "float32")
    if kind[:5] != "qwen3" or (heads, kv_heads, tied) != (4, 2, True):
        eng = _engine(_model(kind, eng.model.config.vocab_size, heads, kv_heads, tied))
    assert lean_support(eng.model) is None
    assert (eng.model.lm_head.weight is eng.model.model.embed_tokens.weight) == tied
    ids, mask, pos = _left_padded(eng, lens)
    n = 12
    dec = LeanDecoder(eng)
    first = dec.prefill(ids, mask, pos, n)
    cache = eng.new_cache()
    assert torch.equal(first, eng.forward(ids, mask, pos, cache)[:, -1])
    full = torch.cat([mask, mask.new_ones(len(lens), n)], 1)  # the HF step gets the plain 2D mask
    positions = pos[:, -1:] + torch.arange(1, n + 1)
    g = torch.Generator().manual_seed(1)
    for i in range(n):
        tok = torch.randint(3, eng.model.config.vocab_size, (len(lens),), generator=g)
        lean = dec.step(tok, i)
        hf = eng.forward(tok[:, None], full[:, : ids.shape[1] + i + 1], positions[:, i: i + 1], cache)[:, -1]
        torch.testing.assert_close(lean, hf, rtol=0, atol=1e-5)


def _generate(decode: str, params: SamplingParams, prefixes=None, model=None, engine_seed: int = 0):
    _, gen = build({**CFG, "decode": decode, "seed": engine_seed})
    if model is not None:
        gen.engine.model = model
    assert gen.engine.lean_decode == (decode == "lean")
    first = gen.generate(PROMPTS, 4, params, prefixes=prefixes)
    second = gen.generate(PROMPTS, 2, params)  # the engine RNG's next use (seed unset) must match as well
    return [[(r.response_token_ids, r.sampling_logprobs, r.finished) for r in g] for g in first + second]


# Seeds (the call's, or the engine RNG's when the call has none) under which this random tiny model's rows stop
# at different lengths, so the comparison covers rows that finish early.
@pytest.mark.parametrize("params,engine_seed", [(SamplingParams(max_new_tokens=24, seed=8), 0),
                                                (SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9), 1),
                                                (SamplingParams(max_new_tokens=12, temperature=0.0), 0)])
def test_lean_generate_equals_the_hf_loop(params, engine_seed):
    lean = _generate("lean", params, engine_seed=engine_seed)
    assert lean == _generate("hf", params, engine_seed=engine_seed)
    assert params.temperature == 0 or any(len({len(x[0]) for x in g}) > 1 for g in lean)  # rows stop apart


def test_lean_generate_equals_the_hf_loop_with_prefixes_and_an_untied_qwen2():
    params = SamplingParams(max_new_tokens=16, seed=3)
    prefixes = [[5, 6, 7], [8], []]
    assert _generate("lean", params, prefixes) == _generate("hf", params, prefixes)
    vocab = build(CFG)[1].engine.model.config.vocab_size
    assert (_generate("lean", params, model=_model("qwen2", vocab, tied=False))
            == _generate("hf", params, model=_model("qwen2", vocab, tied=False)))


def _eos_prone(gen):
    """An untied head with a bias towards EOS (~15% a token): rows stop at many different steps."""
    eng = gen.engine
    old = eng.model.lm_head.weight
    head = torch.nn.Linear(old.shape[1], old.shape[0], bias=True)
    with torch.no_grad():
        head.weight.copy_(old)
        head.bias.zero_()
        head.bias[eng.stop_token_ids] = 4.0
    eng.model.lm_head = head


def test_lean_generate_drops_finished_rows_and_equals_the_hf_loop(monkeypatch):
    """A 60-row batch whose rows stop apart: the lean step stops computing finished rows (never fewer than
    MIN_ROWS) and the samples and log-probs stay the HF loop's."""
    decoders = []
    prefill = LeanDecoder.prefill

    def spy(self, *args):
        decoders.append(self)
        return prefill(self, *args)

    monkeypatch.setattr(LeanDecoder, "prefill", spy)
    params = SamplingParams(max_new_tokens=24, seed=12)  # a seed under which rows stop at 1 to 24 tokens
    outs = {}
    for decode in ("lean", "hf"):
        _, gen = build({**CFG, "decode": decode, "generation_batch_size": 64})
        _eos_prone(gen)
        outs[decode] = [[(r.response_token_ids, r.sampling_logprobs) for r in g]
                        for g in gen.generate(PROMPTS, 20, params)]
    assert outs["lean"] == outs["hf"]
    (dec,) = decoders
    assert dec.compactions >= 2 and dec.rows.shape[0] == LeanDecoder.MIN_ROWS
    lengths = [len(t) for g in outs["lean"] for t, _ in g]
    assert min(lengths) < 4 and max(lengths) == 24  # rows stopped early and late


def test_lean_decode_reads_the_trained_weights():
    """The policy trains the module in place between generate calls: no stale copy in the lean step."""
    params = SamplingParams(max_new_tokens=16, seed=5)
    outs = {}
    for decode in ("lean", "hf"):
        _, gen = build({**CFG, "decode": decode})
        before = gen.generate(PROMPTS, 3, params)
        with torch.no_grad():  # what an optimizer step does: the same parameters, changed in place
            for p in gen.engine.model.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
        after = gen.generate(PROMPTS, 3, params)
        outs[decode] = [[r.response_token_ids for r in g] for g in before + after]
        assert outs[decode][:3] != outs[decode][3:]
    assert outs["lean"] == outs["hf"]


def test_unsupported_models_fall_back_to_the_hf_loop():
    vocab = build(CFG)[1].engine.model.config.vocab_size
    model = _model("qwen3", vocab)
    assert lean_support(model) is None
    model.config._attn_implementation = "eager"
    assert "eager" in lean_support(model)
    model = _model("qwen3", vocab)
    model.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert "linear" in lean_support(model)
    model = _model("qwen3", vocab)
    model.config.layer_types = ["sliding_attention", "full_attention"]
    assert "sliding" in lean_support(model)
    assert "GPT2LMHeadModel" in lean_support(__import__("transformers").GPT2LMHeadModel(
        __import__("transformers").GPT2Config(vocab_size=vocab, n_embd=16, n_layer=1, n_head=2)))
    _, gen = build({**CFG, "attn_implementation": "eager"})  # decided once per engine, from the config
    assert not gen.engine.lean_decode and "eager" in gen.engine.lean_unsupported
    assert gen.generate(PROMPTS[:1], 2, SamplingParams(max_new_tokens=4, seed=0))[0][0].response_token_ids
    _, gen = build({**CFG, "decode": "hf"})
    assert not gen.engine.lean_decode


def test_decode_key_is_checked():
    assert parse_local_config({**CFG}).decode == "lean"
    assert parse_local_config({**CFG, "decode": "hf"}).decode == "hf"
    with pytest.raises(LocalConfigError, match=r"local\.decode: expected one of \['lean', 'hf'\]"):
        parse_local_config({**CFG, "decode": "fast"})
