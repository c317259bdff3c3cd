"""Supervised fine-tuning pieces shared by the embedded tasks' warm starts (persistent task, reasoning task).

``sft_batch(examples, generator)`` renders (messages, response) pairs with the local backend's chat
template into a training batch in rise_nemo.interfaces' layout; ``sft_loss`` is the globally normalised
token-mean negative log-likelihood of the responses, an ``interfaces.LossFn`` for ``policy.train``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Example:
    messages: list[dict]
    response: str


def sft_batch(examples: Sequence[Example], generator) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response ids [B, T], lengths [B], token_mask [B, T] on response tokens, and the
    global response-token count as a per-sample column (so micro-batch losses add up)."""
    seqs, starts = [], []
    for ex in examples:
        p = generator.encode_prompt(ex.messages)
        seqs.append(p + generator.encode_response(ex.response))
        starts.append(len(p))
    width = max(map(len, seqs))
    pad = generator.engine.pad_token_id
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width))
    for i, (s, p) in enumerate(zip(seqs, starts)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, p : len(s)] = 1.0
    n_tok = float(mask.sum())
    return {"input_ids": ids, "input_lengths": torch.tensor([len(s) for s in seqs]), "token_mask": mask,
            "global_tokens": torch.full((len(seqs),), n_tok)}


def sft_loss(logprobs: torch.Tensor, data: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean negative log-likelihood of the responses, normalised by the global token count."""
    loss = -(logprobs * data["token_mask"]).sum() / data["global_tokens"][0]
    return loss, {"sft/nll": float(loss.detach())}
