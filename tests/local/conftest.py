"""Fixtures: a tiny random-init Qwen3 on a word-level tokenizer saved to a temp dir (built in < 1 s)."""

from __future__ import annotations

import pytest
import torch

from rise_nemo.backends.local import build
from rise_nemo.backends.local.tokenizer import build_word_tokenizer

CORPUS = [
    "hello world how are you today ?",
    "the cat sat on a mat . a dog ran in the park .",
    "give me advice about tea , bread and sleep .",
]

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 64}


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def word_tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("word_tok")
    build_word_tokenizer(CORPUS).save_pretrained(path)
    return str(path)


@pytest.fixture
def tiny_cfg(word_tokenizer_dir):
    return {"tokenizer": word_tokenizer_dir, "tiny": dict(TINY), "seed": 0, "lr": 1e-2, "micro_batch_size": 4}


@pytest.fixture
def backend(tiny_cfg):
    return build(tiny_cfg)


def conv(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]
