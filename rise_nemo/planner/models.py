"""Model shapes for the planner: a built-in table of dense Qwen3 sizes, or a local HF ``config.json``.

The table holds the published Qwen3 configurations (hidden size, layers, attention heads, KV heads, head
dim, MLP width, vocabulary, tied embeddings), so the planner runs offline and without torch. Parameter
counts are derived from the shape, not typed in: ``tests/planner`` checks them against the nominal sizes.
"""

from __future__ import annotations

import json
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

    @property
    def attn_params_per_layer(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        qk_norm = 2 * self.head_dim  # Qwen3 normalises q and k per head
        return q + kv + o + qk_norm

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


def _table_key(name: str) -> str:
    """'Qwen/Qwen3-14B' or 'Qwen3-14B-Base' -> 'qwen3-14b'."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    for suffix in ("-base", "-instruct", "-fp8"):
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
    )


def resolve_model(name_or_path: str) -> ModelShape:
    """A built-in Qwen3 size by (HF) name, else a local config.json / model directory."""
    key = _table_key(name_or_path)
    if key in QWEN3:
        return QWEN3[key]
    p = Path(name_or_path)
    if p.exists():
        return from_hf_config(p)
    raise ModelShapeError(
        f"unknown model {name_or_path!r}: not a built-in size ({', '.join(QWEN3)}) and no local config.json there"
    )
