"""Supervised fine-tuning pieces shared by the embedded tasks' warm starts (persistent task, reasoning task).

``sft_batch(examples, generator)`` renders (messages, response) pairs with the local backend's chat
template into a training batch in rise_nemo.interfaces' layout; ``sft_loss`` is the globally normalised
token-mean negative log-likelihood of the responses, an ``interfaces.LossFn`` for ``policy.train``.
``sft_phase`` is the warm starts' training loop; ``save_weights`` / ``load_weights`` their on-disk cache.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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


sft_loss.needs_prev_logprobs = False  # rise_nemo.core.losses.loss_needs_prev_logprobs


def sft_phase(policy, generator, steps: int, lr: float, next_examples: Callable[[], list[Example]], desc: str,
              progress: bool) -> tuple[float, float]:
    """``steps`` SFT steps of the local policy from a fresh optimiser, the lr decaying linearly from ``lr`` to
    10% over the phase (a noisy constant-lr end blurs what the targets teach, a decayed one settles it); each
    step trains on ``next_examples()``. Returns (the last step's NLL, seconds). Entropy is not computed
    during the phase (not needed here).

    The phase always runs on ONE torch thread: CPU kernels reduce in a thread-count-dependent order, so
    the same warm start built with 1 and 2 threads differs in the last bits and, after hundreds of steps,
    visibly (persistent task: a different Rubric-RL curve downstream). The cache key cannot know who built
    a cache, so the weights must not depend on it."""
    from tqdm.auto import tqdm

    policy.reset_optimizer(lr=lr)
    entropy_flag, policy.engine.cfg.compute_entropy = policy.engine.cfg.compute_entropy, False
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0, loss = time.perf_counter(), float("nan")
    bar = tqdm(range(steps), desc=desc, disable=not progress, mininterval=1.0)
    try:
        for step in bar:
            for group in policy.optimizer.param_groups:
                group["lr"] = lr * (1.0 - 0.9 * step / max(steps - 1, 1))
            loss = policy.train(sft_batch(next_examples(), generator), sft_loss)["sft/nll"]
            bar.set_postfix(nll=f"{loss:.3f}")
    finally:
        policy.engine.cfg.compute_entropy = entropy_flag
        torch.set_num_threads(threads)
    return loss, time.perf_counter() - t0


def save_weights(policy, cache: Path, stats: Mapping) -> None:
    """Write the local policy's weights (model.pt) and ``stats`` (stats.json) to ``cache`` atomically: a
    temporary folder renamed into place, so a crash never leaves half a cache."""
    tmp = cache.with_name(cache.name + f".tmp{time.time_ns()}")
    tmp.mkdir(parents=True)
    torch.save({k: v.detach().cpu() for k, v in policy.model.state_dict().items()}, tmp / "model.pt")
    (tmp / "stats.json").write_text(json.dumps(dict(stats), indent=1))
    try:
        tmp.rename(cache)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def load_weights(policy, cache: Path) -> None:
    """Load what ``save_weights`` wrote into the local policy; a fresh optimiser at its own lr."""
    policy.model.load_state_dict(torch.load(cache / "model.pt", map_location=policy.engine.device, weights_only=True))
    policy.reset_optimizer()


def response_nll(policy, generator, examples: Sequence[Example]) -> float:
    """Per-token negative log-likelihood of the examples' responses under ``policy`` (token mean over all of
    them, EOS included): e.g. a task's references vs the model's own samples (ExpRL's premise)."""
    batch = sft_batch(examples, generator)
    with torch.no_grad():
        logprobs = policy.get_logprobs(batch)
    mask = batch["token_mask"]
    return float(-(logprobs * mask).sum() / mask.sum())
