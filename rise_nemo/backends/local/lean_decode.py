"""A lean decode step for the local generator: one new token per row on a preallocated (static) KV cache.

Each decode step of the HF loop is a full ``model(...)`` call: for the tiny 2-layer model the local backend
trains, its cost is Python and per-op dispatch (~225 ops, kwargs plumbing, a growing ``DynamicCache`` that
concatenates every layer's keys and values at every token), not arithmetic. ``LeanDecoder.step`` computes the
same function with about half the ops: it reads the HF module's own parameters at every call (no copies: the
policy trains the same module between generate calls), takes RoPE's cos/sin for all positions of the batch,
computed once with the model's own rotary module, writes K/V into [B, H_kv, L + N, D] buffers, and makes one
SDPA call per layer with the prepared mask. The prefill stays the HF forward (its left-padding mask is the
model's own); its cache is copied into the static buffers once.

Supported (decided once per engine, ``lean_support``; anything else keeps the HF loop):
  - model classes Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM (embed -> per layer RMSNorm, q/k/v
    projections (Qwen3: per-head q_norm/k_norm), RoPE, GQA attention, o_proj, residual, RMSNorm, SiLU-gated MLP,
    residual -> final RMSNorm -> lm_head, tied or not; linear biases wherever the module has them),
  - RoPE of the default type (no scaling), every layer full attention (no sliding window), SDPA attention
    (``local.attn_implementation: sdpa``), SiLU activation, transformers >= 5 (its cache layout).
``local.decode: hf`` forces the HF loop.

Numerics: every op is the one the HF modules run on a single-token step, in the same order and dtype
(RMSNorm in float32, the GQA query packed per key/value head as transformers' SDPA path does for one query
token), so on CPU in float32 the logits equal the HF step's bit for bit on the tested shapes
(tests/local/test_lean_decode.py checks them to 1e-5 and the samples for equality).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUPPORTED_MODELS = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")


def lean_support(model) -> str | None:
    """None when ``LeanDecoder`` computes exactly this model's decode step; else why not (one line)."""
    import transformers

    name = type(model).__name__
    if name not in SUPPORTED_MODELS:
        return f"model class {name} (lean decode knows {', '.join(SUPPORTED_MODELS)})"
    if int(transformers.__version__.split(".")[0]) < 5:
        return f"transformers {transformers.__version__} (< 5: another cache layout)"
    config = model.config
    attn = getattr(config, "_attn_implementation", None)
    if attn != "sdpa":
        return f"attention implementation {attn!r} (lean decode is sdpa only)"
    rope = getattr(config, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "per-layer"
    if rope_type != "default" or getattr(model.model.rotary_emb, "attention_scaling", 1.0) != 1.0:
        return f"rope type {rope_type!r} (lean decode is default RoPE only)"
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (lean decode is SiLU only)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    return None


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm (Qwen3RMSNorm / LlamaRMSNorm): float32 statistics, the weight applied in the input dtype."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's apply_rotary_pos_emb for one tensor: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanDecoder:
    """The decode steps of one left-padded batch (see the module docstring).

    ``prefill(ids, mask, pos, n)`` runs the HF forward on the prompts, copies its cache into static buffers
    sized for ``n`` more tokens and returns the last column's logits [B, V]; ``step(tok, i)`` feeds the i-th
    generated token [B] of every row and returns the next logits [B, V].
    """

    def __init__(self, engine):
        self.engine = engine
        self.model = engine.model
        config = self.model.config
        self.eps = float(config.rms_norm_eps)
        self.n_heads = int(config.num_attention_heads)
        self.n_kv = int(config.num_key_value_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.n_heads)
        self.scale = self.head_dim**-0.5

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, n: int) -> torch.Tensor:
        eng, model = self.engine, self.model
        b, width = ids.shape
        cache = eng.new_cache()
        logits = eng.forward(ids, mask, pos, cache)[:, -1]  # [B, V]
        dev = ids.device
        self.width = width
        self.keys, self.values = [], []
        for layer in cache.layers:
            k = torch.empty((b, self.n_kv, width + n, self.head_dim), dtype=layer.keys.dtype, device=dev)
            v = torch.empty_like(k)
            k[:, :, :width] = layer.keys
            v[:, :, :width] = layer.values
            self.keys.append(k)
            self.values.append(v)
        positions = pos[:, -1:] + torch.arange(1, n + 1, device=dev)  # [B, N]: position of generated token i
        cos, sin = model.model.rotary_emb(self.keys[0], positions)  # [B, N, D] each, as HF computes them
        self.cos, self.sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, N, 1, D]: broadcast over heads
        # The step's mask: HF's prepared 4D boolean mask (True = attend) over the prompt + generated columns,
        # None without padding (what the model's mask builder concludes too).
        self.mask = None if bool(mask.all()) else torch.cat(
            [mask.bool(), mask.new_ones(b, n, dtype=torch.bool)], dim=1)[:, None, None, :]
        return logits

    def step(self, tok: torch.Tensor, i: int) -> torch.Tensor:
        model = self.model.model
        b, hd, eps = tok.shape[0], self.head_dim, self.eps
        col = self.width + i  # the cache column of this token
        cos, sin = self.cos[:, i], self.sin[:, i]  # [B, 1, D]
        mask = None if self.mask is None else self.mask[..., : col + 1]
        group = self.n_heads // self.n_kv
        h = F.embedding(tok, model.embed_tokens.weight)  # [B, hidden]
        for li, layer in enumerate(model.layers):
            attn = layer.self_attn
            x = _rms(h, layer.input_layernorm.weight, eps)
            q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(b, self.n_heads, hd)
            k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(b, self.n_kv, hd)
            v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(b, self.n_kv, hd)
            if hasattr(attn, "q_norm"):
                q = _rms(q, attn.q_norm.weight, eps)
                k = _rms(k, attn.k_norm.weight, eps)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            keys, values = self.keys[li], self.values[li]
            keys[:, :, col] = k
            values[:, :, col] = v
            keys, values = keys[:, :, : col + 1], values[:, :, : col + 1]
            if mask is None and group > 1:  # transformers' SDPA path without a mask: native GQA
                o = F.scaled_dot_product_attention(q[:, :, None], keys, values, scale=self.scale, enable_gqa=True)
            else:  # with a mask: the query packed per key/value head (transformers' pack_gqa for one token)
                o = F.scaled_dot_product_attention(q.view(b, self.n_kv, group, hd), keys, values, attn_mask=mask,
                                                   scale=self.scale)
            h = h + F.linear(o.reshape(b, self.n_heads * hd), attn.o_proj.weight, attn.o_proj.bias)
            x = _rms(h, layer.post_attention_layernorm.weight, eps)
            mlp = layer.mlp
            gate = F.silu(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias))
            h = h + F.linear(gate * F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias), mlp.down_proj.weight,
                             mlp.down_proj.bias)
        h = _rms(h, model.norm.weight, eps)
        head = self.model.lm_head
        return F.linear(h, head.weight, head.bias)
