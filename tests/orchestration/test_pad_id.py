"""The pad id a step's batches use comes from the backend's tokenizer, whichever object holds it (local:
``engine.tokenizer``; nemo: ``session.tokenizer``). Before steps.rollouts.pad_id_of, a NeMo-RL
generator (which keeps the tokenizer on its session) got 0."""

from __future__ import annotations

from types import SimpleNamespace

from rise_nemo.steps.rollouts import pad_id_of


def test_pad_id_from_the_tokenizer_wherever_the_backend_keeps_it():
    tok = SimpleNamespace(pad_token_id=7, eos_token_id=2)
    assert pad_id_of(SimpleNamespace(tokenizer=tok)) == 7
    assert pad_id_of(SimpleNamespace(engine=SimpleNamespace(tokenizer=tok))) == 7  # local backend
    assert pad_id_of(SimpleNamespace(session=SimpleNamespace(tokenizer=tok), pad_id=7)) == 7  # nemo backend


def test_a_generator_without_a_tokenizer_pads_with_zero():
    assert pad_id_of(SimpleNamespace()) == 0
    assert pad_id_of(SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=None))) == 0


def test_the_local_backend_pads_with_its_engines_pad_id():
    import pytest

    pytest.importorskip("transformers")
    from rise_nemo.backends.local import build, parse_local_config

    _, generator = build(parse_local_config({"num_threads": 1, "tokenizer": "builtin:persistent_task"}))
    assert pad_id_of(generator) == generator.engine.pad_token_id
