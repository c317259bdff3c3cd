"""Model shapes for the planner: a built-in table of dense Qwen3 (and Qwen2.5 7B, DeepSeek-Coder-6.7B) sizes,
or a local HF ``config.json``.

The table holds the published Qwen3 and Qwen2.5-7B / Qwen2.5-Math-7B configurations (hidden size, layers, attention heads, KV heads, head
dim, MLP width, vocabulary, tied embeddings), so the planner runs offline and without torch. Parameter
counts are derived from the shape, not typed in: ``tests/planner`` checks them against the nominal sizes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path


class ModelShapeError(ValueError):
    """Unknown model name or unreadable config.json; the message names the file or the name."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # SwiGLU intermediate size
    vocab: int
    tied_embeddings: bool
    qk_norm: bool = True  # Qwen3 normalises q and k per head
    qkv_bias: bool = False  # Qwen2.5 has biases on q, k and v instead

    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        return q + kv + o + qk_norm + bias

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden * self.ffn  # gate, up, down

    @property
    def layer_params(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + 2 * self.hidden  # + 2 RMSNorms

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        heads = 1 if self.tied_embeddings else 2
        return self.layers * self.layer_params + heads * self.embedding_params + self.hidden  # + final norm

    def kv_bytes_per_token(self, dtype_bytes: float) -> float:
        """K and V of one token over all layers (what vLLM's KV cache stores per token)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


def _qwen3(name, hidden, layers, heads, kv_heads, ffn, tied) -> ModelShape:
    return ModelShape(name, hidden, layers, heads, kv_heads, 128, ffn, 151936, tied)


QWEN3: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _qwen3("qwen3-0.6b", 1024, 28, 16, 8, 3072, True),
        _qwen3("qwen3-1.7b", 2048, 28, 16, 8, 6144, True),
        _qwen3("qwen3-4b", 2560, 36, 32, 8, 9728, True),
        _qwen3("qwen3-8b", 4096, 36, 32, 8, 12288, False),
        _qwen3("qwen3-14b", 5120, 40, 40, 8, 17408, False),
        _qwen3("qwen3-32b", 5120, 64, 64, 8, 25600, False),
    )
}


# Qwen2.5-7B and Qwen2.5-Math-7B share one shape (config.json of both: hidden 3584, 28 layers, 28 heads,
# 4 KV heads, MLP 18944, vocabulary 152064, untied embeddings, q/k/v biases, no q/k norm).
QWEN25: dict[str, ModelShape] = {
    name: ModelShape(name, 3584, 28, 28, 4, 128, 18944, 152064, False, qk_norm=False, qkv_bias=True)
    for name in ("qwen2.5-7b", "qwen2.5-math-7b")
}
# DeepSeek-Coder-6.7B (base and instruct; the RRL paper's APPS+ model): the LLaMA architecture, hidden 4096,
# 32 layers, 32 heads = 32 KV heads (no GQA), SwiGLU 11008, vocabulary 32256, untied embeddings, no biases,
# no q/k norm (the model card's config.json). 6.74B parameters in all.
DEEPSEEK_CODER: dict[str, ModelShape] = {
    "deepseek-coder-6.7b": ModelShape("deepseek-coder-6.7b", 4096, 32, 32, 32, 128, 11008, 32256, False,
                                      qk_norm=False, qkv_bias=False),
}
# Llama-2-7B (base and chat; the RRL paper's HH-RLHF model): hidden 4096, 32 layers, 32 heads = 32 KV heads,
# SwiGLU 11008, vocabulary 32000, untied embeddings, no biases, no q/k norm (meta-llama/Llama-2-7b-hf
# config.json). 6.74B parameters in all.
LLAMA2: dict[str, ModelShape] = {
    "llama-2-7b": ModelShape("llama-2-7b", 4096, 32, 32, 32, 128, 11008, 32000, False, qk_norm=False,
                             qkv_bias=False),
}
BUILT_IN: dict[str, ModelShape] = {**QWEN3, **QWEN25, **DEEPSEEK_CODER, **LLAMA2}


def _table_key(name: str) -> str:
    """'Qwen/Qwen3-14B', 'Qwen3-14B-Base' or 'Qwen/Qwen3-4B-Instruct-2507' (a dated release of the same
    shape) -> 'qwen3-14b' / 'qwen3-4b'; 'meta-llama/Llama-2-7b-chat-hf' -> 'llama-2-7b'."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"-\d{4}$", "", key)
    for suffix in ("-hf", "-chat", "-fp8", "-base", "-instruct", "-thinking"):
        key = key.removesuffix(suffix)
    return key


def from_hf_config(path: str | Path) -> ModelShape:
    """Shape from a Hugging Face ``config.json`` (or a directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise ModelShapeError(f"{p}: no such model config") from exc
    except json.JSONDecodeError as exc:
        raise ModelShapeError(f"{p}: line {exc.lineno}: not valid JSON ({exc.msg})") from exc
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise ModelShapeError(f"{p}: missing key(s) {', '.join(missing)}")
    heads = int(cfg["num_attention_heads"])
    return ModelShape(
        name=str(cfg.get("_name_or_path") or p.parent.name),
        hidden=int(cfg["hidden_size"]),
        layers=int(cfg["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        ffn=int(cfg["intermediate_size"]),
        vocab=int(cfg["vocab_size"]),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=cfg.get("model_type") != "qwen2",  # Qwen2/2.5: q/k/v biases instead of q/k norms
        qkv_bias=cfg.get("model_type") == "qwen2",
    )


def resolve_model(name_or_path: str) -> ModelShape:
    """A built-in size by (HF) name, else a local config.json / model directory."""
    key = _table_key(name_or_path)
    if key in BUILT_IN:
        return BUILT_IN[key]
    p = Path(name_or_path)
    if p.exists():
        return from_hf_config(p)
    raise ModelShapeError(
        f"unknown model {name_or_path!r}: not a built-in size ({', '.join(BUILT_IN)}) and no local config.json there"
    )
