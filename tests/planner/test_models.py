"""Model shapes: the built-in Qwen3 table reproduces the published sizes; HF config.json parsing and errors."""

from __future__ import annotations

import json

import pytest

from rise_nemo.planner import QWEN3, ModelShapeError, from_hf_config, resolve_model

# Non-embedding parameter counts published on the Qwen3 model cards, in billions.
NON_EMBEDDING_B = {"qwen3-0.6b": 0.44, "qwen3-1.7b": 1.4, "qwen3-4b": 3.6, "qwen3-8b": 6.95, "qwen3-14b": 13.2,
                   "qwen3-32b": 31.2}


@pytest.mark.parametrize("name", sorted(NON_EMBEDDING_B))
def test_param_counts_match_published_sizes(name):
    m = QWEN3[name]
    embeddings = m.embedding_params * (1 if m.tied_embeddings else 2)
    assert (m.total_params - embeddings) / 1e9 == pytest.approx(NON_EMBEDDING_B[name], rel=0.01)


def test_resolve_accepts_hf_names():
    assert resolve_model("Qwen/Qwen3-14B") is QWEN3["qwen3-14b"]
    assert resolve_model("Qwen/Qwen3-4B-Base") is QWEN3["qwen3-4b"]


def test_hf_config_json(tmp_path):
    cfg = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 32, "intermediate_size": 256, "vocab_size": 1000, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = resolve_model(str(tmp_path))
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (128, 2, 4, 2, 32)
    # q 128x128, k/v 2x128x64, o 128x128, qk-norm 64, mlp 3x128x256, 2 norms; tied embedding 1000x128
    layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 64 + 3 * 128 * 256 + 2 * 128
    assert shape.total_params == 2 * layer + 1000 * 128 + 128


def test_hf_config_errors_name_the_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 1,\n oops}')
    with pytest.raises(ModelShapeError, match=r"config.json: line 2"):
        from_hf_config(bad)
    bad.write_text(json.dumps({"hidden_size": 1}))
    with pytest.raises(ModelShapeError, match="missing key.*num_hidden_layers"):
        from_hf_config(bad)
    with pytest.raises(ModelShapeError, match="unknown model 'llama-7b'"):
        resolve_model("llama-7b")


def test_deepseek_coder_shape():
    """DeepSeek-Coder-6.7B (the RRL paper's APPS model): LLaMA shape, 6.74B parameters, any HF spelling."""
    m = resolve_model("deepseek-ai/deepseek-coder-6.7b-instruct")
    assert m is resolve_model("deepseek-coder-6.7b-base") and m.name == "deepseek-coder-6.7b"
    assert m.total_params / 1e9 == pytest.approx(6.74, rel=0.005)
    assert (m.kv_heads, m.qk_norm, m.qkv_bias, m.tied_embeddings) == (32, False, False, False)
