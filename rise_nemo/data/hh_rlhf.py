"""Anthropic HH-RLHF preference pairs (Bai et al. 2022) -> ``PreferencePair``: the prompt and two responses.

A row is ``{"chosen": transcript, "rejected": transcript}``, each transcript a dialogue of
``"\\n\\nHuman: ..."`` / ``"\\n\\nAssistant: ..."`` turns that differ only in the last Assistant turn. The
prompt is the transcript up to the last ``"Assistant:"`` (as the RRL paper's RLHF setting and
NeMo-RL's / TRL's HH preprocessing use it), as chat messages (Human -> user, Assistant -> assistant) ending
with the user's turn; ``chosen`` / ``rejected`` are the two last Assistant turns. Rows whose transcripts
differ before that turn, have no Assistant turn or no Human turn before it fail with ``file:line`` and the
key (``RubricError``, or skipped and listed with ``skip_invalid``), as every loader's rows do.

Training reads the same rows as reasoning problems (``data.format: hh_rlhf``, rise_nemo.data.reasoning: the
chosen reply is the reference solution) scored by a reward model (rise_nemo.steps.reward_model); the
win / tie / lose evaluation is the ``hh_win_rate`` suite (rise_nemo.evals.hh_win_rate).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rise_nemo.data.loaders import Skipped, _err, _prompt_id, _require_text, read_records

__all__ = ["PreferencePair", "LoadedPairs", "load_hh_rlhf", "parse_hh_record", "split_transcript"]

_TURN = re.compile(r"\n\n(Human|Assistant):[ ]?")
_ROLE = {"Human": "user", "Assistant": "assistant"}


@dataclass(frozen=True)
class PreferencePair:
    prompt_id: str
    messages: tuple[dict[str, str], ...]  # the dialogue before the last Assistant turn, ending with the user
    chosen: str
    rejected: str


class LoadedPairs(NamedTuple):
    pairs: list[PreferencePair]
    skipped: list[Skipped]


def split_transcript(text: str) -> tuple[str, tuple[dict[str, str], ...], str]:
    """(prompt text up to and including the last "Assistant:", its messages, the last Assistant turn);
    ValueError when the transcript has no Assistant turn after a Human turn."""
    marks = list(_TURN.finditer(text))
    last = next((m for m in reversed(marks) if m.group(1) == "Assistant"), None)
    if last is None:
        raise ValueError("no '\\n\\nAssistant:' turn")
    messages = []
    for m, end in zip(marks, marks[1:] + [None]):
        if m is last:
            break
        content = text[m.end():end.start() if end is not None else len(text)].strip()
        messages.append({"role": _ROLE[m.group(1)], "content": content})
    if not messages or messages[-1]["role"] != "user":
        raise ValueError("the last Assistant turn does not follow a Human turn")
    prefix = text[:last.end()].rstrip(" ")
    return prefix, tuple(messages), text[last.end():].strip()


def parse_hh_record(row: Any, where: str, default_id: str = "") -> PreferencePair:
    if not isinstance(row, Mapping):
        raise _err(where, "chosen", f"expected a JSON object per record, got {type(row).__name__}")
    parts = {}
    for key in ("chosen", "rejected"):
        try:
            parts[key] = split_transcript(_require_text(row, key, where))
        except ValueError as exc:
            raise _err(where, key, str(exc)) from None
    (prompt, messages, chosen), (other, _, rejected) = parts["chosen"], parts["rejected"]
    if prompt != other:
        raise _err(where, "rejected", "differs from 'chosen' before the last Assistant turn (not a pair)")
    return PreferencePair(_prompt_id(row, ("prompt_id", "id"), default_id or where), messages, chosen, rejected)


def load_hh_rlhf(path: str | Path, skip_invalid: bool = False) -> LoadedPairs:
    """HH-RLHF preference pairs from JSONL or parquet; ids ``<file stem>-<line>`` unless the row has one."""
    pairs, skipped = read_records(path, parse_hh_record, skip_invalid, "HH-RLHF pairs")
    return LoadedPairs(pairs, skipped)
