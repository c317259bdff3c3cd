"""A lean decode step for the local generator: one new token per row on a preallocated (static) KV cache.

Each decode step of the HF loop is a full ``model(...)`` call: for the tiny 2-layer model the local backend
trains, its cost is Python and per-op dispatch (170 aten ops on the tiny model, module and kwargs plumbing, a
growing ``DynamicCache`` that concatenates every layer's keys and values at every token), not arithmetic.
``LeanDecoder.step`` computes the same function in 105 aten ops and plain function calls: it reads the HF module's own parameters at every call (no copies: the
policy trains the same module between generate calls), takes RoPE's cos/sin for all positions of the batch,
computed once with the model's own rotary module, writes K/V into [B, H_kv, L + N, D] buffers, and makes one
SDPA call per layer with the prepared mask; rows that have finished stop being computed (drop_finished). The
prefill stays the HF forward (its left-padding mask is the model's own); its cache is copied into the static
buffers once.

Supported (decided once per engine, ``lean_support``; anything else keeps the HF loop):
  - model classes Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM (embed -> per layer RMSNorm, q/k/v
    projections (Qwen3: per-head q_norm/k_norm), RoPE, GQA attention, o_proj, residual, RMSNorm, SiLU-gated MLP,
    residual -> final RMSNorm -> lm_head, tied or not; linear biases wherever the module has them),
  - RoPE of the default type (no scaling), every layer full attention (no sliding window), SDPA attention
    (``local.attn_implementation: sdpa``), SiLU activation, transformers >= 5 (its cache layout).
``local.decode: hf`` forces the HF loop.

Numerics: every op is the one the HF modules run on a single-token step, in the same order and dtype
(RMSNorm in float32, the GQA query packed per key/value head as transformers' SDPA path does for one query
token), so on CPU (float32 and bfloat16) the logits equal the HF step's bit for bit on the tested shapes
(tests/local/test_lean_decode.py checks them to 1e-5 and the samples for equality). On another device or CPU
the kernels may round differently: then a sample can differ where two tokens' scores tie to the last bit.
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
    if x.dtype != torch.float32:
        return weight * _rms(x.float(), 1.0, eps).to(x.dtype)
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _cat_bias(*linears) -> torch.Tensor | None:
    """The fused projection's bias: the modules' biases concatenated (zeros for one without), or None."""
    if all(m.bias is None for m in linears):
        return None
    return torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.weight.shape[0]) for m in linears])


class LeanDecoder:
    """The decode steps of one left-padded batch (see the module docstring).

    ``prefill(ids, mask, pos, n)`` runs the HF forward on the prompts, copies its cache into static buffers
    sized for ``n`` more tokens and returns the last column's logits [B, V]; ``step(tok, i)`` feeds the i-th
    generated token [B] of every row and returns the next logits [B, V].

    Per batch (in ``prefill``, after the weights of this generate call are final) the q/k/v projections and the
    gate/up projections of each layer are concatenated into one matrix each, and Qwen3's q_norm/k_norm weights
    into one [H + H_kv, D] tensor: one matmul instead of three (two), one RMSNorm and one RoPE for q and k
    together. These are per-call temporaries of the module's current weights, dropped with the decoder, so a
    later optimizer step is always seen. Each output element is the same dot product as in the separate
    projections (tests/local/test_lean_decode.py checks the logits against the HF forward).
    """

    MIN_ROWS = 16  # drop_finished never computes fewer rows than this (or the batch, if smaller)
    KEEP_FRACTION = 0.75

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
        model = self.model
        b, width = ids.shape
        logits, cache, positions = self.engine.prefill(ids, mask, pos, n)  # [B, V], DynamicCache, [B, N]
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
        cos, sin = model.model.rotary_emb(self.keys[0], positions)  # [B, N, D] each, as HF computes them
        # rotate_half(x) * sin == roll(x, D/2) * [-sin[:D/2], sin[D/2:]] (the sign moved onto sin: exact)
        half = self.head_dim // 2
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        self.cos, self.sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, N, 1, D]: broadcast over heads
        # The step's mask over the prompt + generated columns: additive (0 / -inf, what SDPA makes of HF's
        # prepared boolean mask at every call), None without padding (the model's mask builder concludes so too).
        self.mask = None
        if not bool(mask.all()):
            full = torch.cat([mask.bool(), mask.new_ones(b, n, dtype=torch.bool)], dim=1)[:, None, None, :]
            self.mask = torch.zeros(full.shape, dtype=logits.dtype, device=dev).masked_fill(~full, float("-inf"))
        self.layers = []
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = (attn.q_proj, attn.k_proj, attn.v_proj)
            qk_norm = None
            if hasattr(attn, "q_norm"):
                qk_norm = torch.cat([attn.q_norm.weight.expand(self.n_heads, self.head_dim),
                                     attn.k_norm.weight.expand(self.n_kv, self.head_dim)])
            self.layers.append((
                layer.input_layernorm.weight,
                torch.cat([m.weight for m in qkv]), _cat_bias(*qkv), qk_norm,
                attn.o_proj,
                layer.post_attention_layernorm.weight,
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), _cat_bias(mlp.gate_proj, mlp.up_proj),
                mlp.down_proj,
            ))
        self.rows = None  # the batch rows the steps still compute (None: all), see drop_finished
        self.out = logits  # [B, V]: the last logits of every row (a dropped row keeps its last ones)
        self.compactions = 0
        return logits

    def drop_finished(self, done: torch.Tensor) -> None:
        """Stop computing rows that have finished (``done`` [B]), once at most KEEP_FRACTION of the computed rows
        are left (each compaction copies the caches; 0.9 and 0.5 decode as fast as 3/4 on the embedded task,
        compacting at every finished row is slower).

        A finished row's later tokens are replaced by padding and trimmed, so its logits are never used; the
        sampler still draws for every row (its random stream does not change). Every other row's computation is
        the same per-row arithmetic on fewer rows; the rows kept never drop below MIN_ROWS (finished rows fill
        up), because matmul kernels may pick another summation order for a handful of rows (on the CPUs tested
        only below 9 rows), which could change a logit's last bit.
        """
        current = done.shape[0] if self.rows is None else self.rows.shape[0]
        active = ~done if self.rows is None else ~done[self.rows]  # [current]
        n_active = int(active.sum())
        target = max(n_active, min(self.MIN_ROWS, current))
        if target > self.KEEP_FRACTION * current:
            return
        if target > n_active:  # fill up with finished rows
            filler = (~active).nonzero().squeeze(1)[: target - n_active]
            active = active.index_fill(0, filler, True)
        keep = active.nonzero().squeeze(1)  # [target], positions among the current rows, in order
        self.rows = keep if self.rows is None else self.rows[keep]
        self.keys = [k.index_select(0, keep) for k in self.keys]
        self.values = [v.index_select(0, keep) for v in self.values]
        self.cos, self.sin = self.cos.index_select(0, keep), self.sin.index_select(0, keep)
        if self.mask is not None:
            self.mask = self.mask.index_select(0, keep)
        self.compactions += 1

    def step(self, tok: torch.Tensor, i: int, done: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, V] after the i-th generated token ``tok`` [B]; ``done`` [B]: rows that have finished
        (optional; see drop_finished)."""
        if done is not None:
            self.drop_finished(done)
        if self.rows is not None:
            tok = tok.index_select(0, self.rows)
        model = self.model.model
        b, hd, eps, n_q, n_kv = tok.shape[0], self.head_dim, self.eps, self.n_heads, self.n_kv
        n_qk = n_q + n_kv
        col = self.width + i  # the cache column of this token
        cos, sin = self.cos[:, i], self.sin[:, i]  # [B, 1, D]
        mask = None if self.mask is None else self.mask[..., : col + 1]
        group = n_q // n_kv
        h = F.embedding(tok, model.embed_tokens.weight)  # [B, hidden]
        for li, (ln1, w_qkv, b_qkv, qk_norm, o_proj, ln2, w_gu, b_gu, down) in enumerate(self.layers):
            qkv = F.linear(_rms(h, ln1, eps), w_qkv, b_qkv)  # [B, (H + 2 H_kv) D]
            qk = qkv[:, : n_qk * hd].view(b, n_qk, hd)
            if qk_norm is not None:
                qk = _rms(qk, qk_norm, eps)
            qk = qk * cos + qk.roll(hd // 2, -1) * sin  # RoPE on q and k together
            keys, values = self.keys[li], self.values[li]
            keys[:, :, col] = qk[:, n_q:]
            values[:, :, col] = qkv[:, n_qk * hd :].view(b, n_kv, hd)
            keys, values = keys[:, :, : col + 1], values[:, :, : col + 1]
            q = qk[:, :n_q]
            if mask is None and group > 1:  # transformers' SDPA path without a mask: native GQA
                o = F.scaled_dot_product_attention(q[:, :, None], keys, values, scale=self.scale, enable_gqa=True)
            else:  # with a mask: the query packed per key/value head (transformers' pack_gqa for one token)
                o = F.scaled_dot_product_attention(q.reshape(b, n_kv, group, hd), keys, values, attn_mask=mask,
                                                   scale=self.scale)
            h = h + F.linear(o.reshape(b, n_q * hd), o_proj.weight, o_proj.bias)
            gu = F.linear(_rms(h, ln2, eps), w_gu, b_gu)  # [B, 2 I]
            inter = gu.shape[-1] // 2
            h = h + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], down.weight, down.bias)
        h = _rms(h, model.norm.weight, eps)
        head = self.model.lm_head
        logits = F.linear(h, head.weight, head.bias)
        if self.rows is None:
            self.out = logits
        else:  # the sampler has read the previous logits already: updated in place
            self.out.index_copy_(0, self.rows, logits)
        return self.out
