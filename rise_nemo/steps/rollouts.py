"""Text <-> tokens through whichever backend's generator a step holds (ExpRL segments and reference
solutions, RRL's canonical states)."""

from __future__ import annotations

from typing import Any


def find_tokenizer(generator: Any) -> Any:
    """The backend's tokenizer (local: ``engine.tokenizer``; nemo: ``session.tokenizer``)."""
    for owner in (generator, getattr(generator, "engine", None), getattr(generator, "session", None)):
        tok = getattr(owner, "tokenizer", None)
        if tok is not None:
            return tok
    raise ValueError(f"{type(generator).__name__} exposes no tokenizer (ExpRL-Process segments rollouts "
                     "with it, RRL cuts reference states with it)")


def token_texts(generator: Any, ids: list[int]) -> list[str]:
    """Each token's own text (the cut-point rules of core.replay.state_boundaries read them)."""
    return list(find_tokenizer(generator).batch_decode([[t] for t in ids], skip_special_tokens=True)) if ids else []


def pad_id_of(generator: Any) -> int:
    """The tokenizer's pad id for the batches a step builds (padding is masked everywhere, so any id is
    correct; 0 for a generator without a tokenizer, e.g. a test double)."""
    try:
        pad = getattr(find_tokenizer(generator), "pad_token_id", None)
    except ValueError:
        return 0
    return pad if isinstance(pad, int) else 0


def encode_response(generator: Any, text: str) -> list[int]:
    """Response text -> token ids ending with EOS, as a finished generation would be (reference solutions)."""
    if hasattr(generator, "encode_response"):
        return list(generator.encode_response(text))
    tok = find_tokenizer(generator)
    return list(tok.encode(text, add_special_tokens=False)) + [int(tok.eos_token_id)]
