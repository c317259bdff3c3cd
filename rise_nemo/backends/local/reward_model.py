"""A Bradley-Terry reward model on CPU in the trainer's process (the local backend's ``RewardModel``).

The model is a Hugging Face ``AutoModelForSequenceClassification`` with ONE output (``num_labels == 1``: the
scalar head a Bradley-Terry model is trained with, TRL's ``RewardTrainer`` / NeMo-RL's ``rm.yaml``), loaded
from the recipe's ``reward_model.path`` (a local directory), in float32 or bfloat16, in eval mode; scoring
runs under ``torch.inference_mode`` (no grad).

One conversation = the prompt's messages + the response as the final assistant turn, rendered and tokenised
by the REWARD MODEL's own chat template (``add_generation_prompt=False``), as NeMo-RL's
``RewardModelEnvironment.preprocess_data`` renders a message log. The score is the model's logit where
Hugging Face's sequence-classification pooling reads it (the last non-pad token), the place the head was
trained on.

Truncation rule: a rendering longer than ``reward_model.max_length`` tokens keeps its LAST ``max_length``
tokens (the oldest dialogue tokens are dropped), so the response and the end the head reads are always
scored; each truncated conversation is counted (``truncated``; the scorer logs it per step).

Batching: conversations are scored ``batch_size`` at a time, right-padded with an attention mask; a
padded batch gives the scores of one-by-one forwards (tests/local/test_reward_model.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class RewardModelConfigError(ValueError):
    """A problem with the ``reward_model:`` block: one line naming the key."""


def _key_error(key: str, message: str) -> RewardModelConfigError:
    return RewardModelConfigError(f"config key 'reward_model.{key}': {message}")


class LocalRewardModel:
    """``score(conversations) -> list[float]``: one scalar per (messages + final assistant reply)."""

    def __init__(self, path: str | Path, *, dtype: str = "float32", batch_size: int = 8, max_length: int = 2048,
                 num_threads: int | None = None):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if dtype not in DTYPES:
            raise _key_error("dtype", f"expected one of {sorted(DTYPES)}, got {dtype!r}")
        if int(batch_size) < 1 or int(max_length) < 2:
            raise _key_error("batch_size" if int(batch_size) < 1 else "max_length", "too small")
        p = Path(str(path)).expanduser()
        if not p.is_dir():
            raise _key_error("path", f"{path} is not a directory; the local backend loads a reward model from a "
                             "local directory holding a Hugging Face sequence classifier and its tokenizer")
        if num_threads:
            torch.set_num_threads(int(num_threads))
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(p))
            self.model = AutoModelForSequenceClassification.from_pretrained(str(p), dtype=DTYPES[dtype])
        except (OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise _key_error("path", f"cannot load a sequence classifier from {p}: {first}") from None
        labels = int(getattr(self.model.config, "num_labels", 0))
        if labels != 1:
            raise _key_error("path", f"{p} has num_labels={labels}; a Bradley-Terry reward model has one scalar "
                             "output (num_labels=1)")
        if not getattr(self.tokenizer, "chat_template", None):
            raise _key_error("path", f"{p}: the tokenizer has no chat template; the reward model scores the "
                             "dialogue rendered with its own template")
        if self.tokenizer.pad_token_id is None:  # Llama-style tokenizers: pad with EOS (HF/TRL's convention)
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval()
        self.path, self.dtype = p, dtype
        self.batch_size, self.max_length = int(batch_size), int(max_length)
        self.calls = 0  # conversations scored
        self.truncated = 0  # of them, longer than max_length (their oldest tokens dropped)

    def encode(self, conversation: Sequence[Mapping[str, str]]) -> tuple[list[int], bool]:
        """Token ids of the rendered conversation (truncation rule: the module docstring) and whether it was cut."""
        ids = self.tokenizer.apply_chat_template([dict(m) for m in conversation], tokenize=True,
                                                 add_generation_prompt=False)
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # BatchEncoding from newer transformers
            ids = ids["input_ids"]
        ids = list(ids)
        if len(ids) > self.max_length:
            return ids[-self.max_length:], True
        return ids, False

    @torch.inference_mode()
    def score_ids(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """Scores of already-encoded sequences, ``batch_size`` at a time (right padding + attention mask)."""
        out: list[float] = []
        pad = int(self.tokenizer.pad_token_id)
        for start in range(0, len(sequences), self.batch_size):
            chunk = [list(s) for s in sequences[start:start + self.batch_size]]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, s in enumerate(chunk):
                ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
                mask[i, :len(s)] = 1
            logits = self.model(input_ids=ids, attention_mask=mask).logits  # [b, 1]
            out.extend(float(x) for x in logits[:, 0].float())
        return out

    def score(self, conversations: Sequence[Sequence[Mapping[str, str]]]) -> list[float]:
        encoded = [self.encode(c) for c in conversations]
        self.calls += len(encoded)
        self.truncated += sum(cut for _, cut in encoded)
        return self.score_ids([ids for ids, _ in encoded])

    def close(self) -> None:
        return None


def build_reward_model(cfg: Any) -> LocalRewardModel:
    """The recipe's ``reward_model:`` block -> a LocalRewardModel (threads: ``local.num_threads`` if set)."""
    block = cfg.reward_model
    if not block.path:
        raise _key_error("path", "is null; set it to a local directory holding a Bradley-Terry reward model")
    local = cfg.local or {}
    return LocalRewardModel(str(block.path), dtype=str(block.dtype), batch_size=int(block.batch_size),
                            max_length=int(block.max_length), num_threads=local.get("num_threads"))
