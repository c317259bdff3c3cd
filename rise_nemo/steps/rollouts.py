"""What every training step shares, whichever method runs: sampling streams and parameters, one generate call
for groups of rollouts, the training samples and the batch built from them (rise_nemo.interfaces conventions),
the policy-gradient loss of a recipe, and text <-> tokens through whichever backend's generator a step holds.
Each step makes ONE generate, verify, judge or reward-model call for all its rollouts: ``flat_call`` flattens
the N groups, calls once and regroups.

Nothing here knows a method: the steps (rubric, reasoning, sft) and the behaviour they plug in call it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from rise_nemo.core.losses import ObjectiveConfig, policy_loss_fn
from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.interfaces import (
    KIND_GUIDED,
    KIND_NATURAL,
    Generator,
    ResponseEncoder,
    Rollout,
    SamplingParams,
    Verifier,
)

# Seed streams: each generate call in a step gets its own seed derived from (run seed, step, stream), so a
# resumed run samples exactly what the uninterrupted run sampled.
STREAM_NATURAL, STREAM_PRIVILEGED, STREAM_EVAL = 1, 2, 3

T = TypeVar("T")
R = TypeVar("R")


def derive_seed(run_seed: int, step: int, stream: int) -> int:
    return (run_seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**31 - 1)


@dataclass
class TrainSample:
    prompt_ids: list[int]  # ORIGINAL prompt's tokens (guided and RuscaRL rows are spliced onto them)
    response_ids: list[int]
    kind: int
    advantage: float
    generation_logprobs: list[float]
    # True only when the response was sampled under prompt_ids itself: only then may its sampler log-probs
    # serve as the PPO reference (core.logprobs.ppo_reference_logprobs).
    sampled_under_train_prompt: bool
    source: tuple[bool, int, int] | None = None  # (privileged?, group row, index in group): samples.jsonl
    loss_mask: list[int] | None = None  # per response token, 0 = excluded from the loss (masked penalised span)
    given_tokens: int = 0  # leading response tokens that were given (a replayed state): context, not trained


def sampling_params(cfg: Any, step: int, stream: int) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=int(cfg.sampling.max_new_tokens),
        temperature=float(cfg.sampling.temperature),
        top_p=float(cfg.sampling.top_p),
        seed=derive_seed(int(cfg.run.seed), step, stream),
    )


def flat_call(fn: Callable[[list[T]], Sequence[R]], groups: Sequence[Sequence[T]], what: str) -> list[list[R]]:
    """Flatten N groups, ONE call, regroup: ``fn`` on the items of every group in order (one generate, verifier,
    judge or reward-model call per step), its results cut back into groups of the same sizes. A result count
    that does not add up is a RuntimeError naming ``what``; no item, no call."""
    flat = [x for group in groups for x in group]
    out = list(fn(flat)) if flat else []
    if len(out) != len(flat):
        raise RuntimeError(f"{what} returned {len(out)} results for {len(flat)} items")
    results = iter(out)
    return [[next(results) for _ in group] for group in groups]


def generate_each(generator: Generator, conversations: Sequence[Sequence[list[dict]]], params: SamplingParams,
                  prefixes: Sequence[Sequence[list[int]]] | None = None) -> list[list[Rollout]]:
    """One sample of every conversation of every group (``prefixes[i][j]``: the given response tokens rollout j
    of group i continues) in ONE generate call with n = 1: [N][G_i]."""
    def one_each(flat: list[tuple[list[dict], list[int] | None]]) -> list[Rollout]:
        convs = [c for c, _ in flat]
        rows = (generator.generate(convs, 1, params) if prefixes is None
                else generator.generate(convs, 1, params, prefixes=[list(p or []) for _, p in flat]))
        if any(len(row) != 1 for row in rows):
            raise RuntimeError(f"generator returned {[len(row) for row in rows]} samples for single-sample prompts")
        return [row[0] for row in rows]

    pairs = [[(c, prefixes[i][j] if prefixes is not None else None) for j, c in enumerate(group)]
             for i, group in enumerate(conversations)]
    return flat_call(one_each, pairs, "generator")


def generate_groups(generator: Generator, requests: Sequence[tuple[list[dict], int]],
                    params: SamplingParams) -> list[list[Rollout]]:
    """ONE generate call for (conversation, n) requests whose n may differ: [len(requests)][n]."""
    sizes = {n for _, n in requests}
    if len(sizes) == 1:
        return generator.generate([c for c, _ in requests], sizes.pop(), params)
    return generate_each(generator, [[c] * n for c, n in requests], params)


def verify_groups(verifier: Verifier, problems: Sequence[ReasoningProblem],
                  groups: Sequence[Sequence[Rollout]]) -> list[list[bool | None]]:
    """The verifier's verdict on every rollout of every problem's group, in ONE verify call: [N][G_i]."""
    pairs = [[(p, r.response_text) for r in group] for p, group in zip(problems, groups)]
    return flat_call(lambda flat: verifier.verify([p for p, _ in flat], [text for _, text in flat]), pairs, "verifier")


def build_batch(samples: Sequence[TrainSample], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded training batch (rise_nemo.interfaces conventions) with the global count columns."""
    if not samples:
        raise RuntimeError("no trainable sample in this step (every verdict unknown?)")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    b, t = len(samples), max(lengths)
    input_ids = torch.full((b, t), pad_id, dtype=torch.long)  # [B, T]
    token_mask = torch.zeros(b, t)  # [B, T], 1 on response tokens
    gen_lp = torch.zeros(b, t)  # [B, T]
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[row, : p + r] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        if s.loss_mask is not None:
            token_mask[row, p : p + r] = torch.tensor(s.loss_mask[:r], dtype=torch.float32)
        else:
            token_mask[row, p : p + r] = 1.0
        token_mask[row, p : p + min(s.given_tokens, r)] = 0.0  # a given prefix is context only
        gen_lp[row, p : p + r] = torch.tensor(s.generation_logprobs[:r] + [0.0] * (r - len(s.generation_logprobs)))
    kind = torch.tensor([s.kind for s in samples], dtype=torch.long)  # [B]
    natural_tokens = float(token_mask[kind == KIND_NATURAL].sum())
    guided_seqs = float((kind == KIND_GUIDED).sum())
    return {
        "input_ids": input_ids,
        "input_lengths": torch.tensor(lengths, dtype=torch.long),
        "token_mask": token_mask,
        "sample_mask": torch.ones(b),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        "kind": kind,
        "generation_logprobs": gen_lp,
        "sampled_under_train_prompt": torch.tensor([float(s.sampled_under_train_prompt) for s in samples]),
        "natural_token_count": torch.full((b,), natural_tokens),
        "guided_seq_count": torch.full((b,), guided_seqs),
    }


def recipe_policy_loss_fn(cfg: Any, lam: float = 0.0, token_weighting: str = "policy_support"):
    """The policy-gradient loss of every RL step: core.losses.policy_loss_fn with the recipe's ``policy_loss:`` and
    ``rise:`` settings: eq. 12 with ``lam``; with lam 0 and per-token advantages, PPO's clipped surrogate. It says
    whether it needs reference log-probs (KL > 0)."""
    g = cfg.policy_loss
    objective = ObjectiveConfig(
        clip_low=float(g.clip_low), clip_high=float(g.clip_high), kl_coef=float(g.kl_coef),
        entropy_coef=float(g.entropy_coef), lambda_guide=lam, gamma=float(cfg.rise.gamma),
        a_max=float(cfg.rise.a_max), token_weighting=token_weighting,
    )
    return policy_loss_fn(objective)


def eval_sampling_params(cfg: Any, step: int) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=int(cfg.eval.max_new_tokens or cfg.sampling.max_new_tokens),
        temperature=float(cfg.eval.temperature),
        top_p=float(cfg.sampling.top_p if cfg.eval.top_p is None else cfg.eval.top_p),
        # Seeded by the step: every method/checkpoint is evaluated on the same sampling stream. A stage that
        # continues another one's weights continues its steps (eval.stream_offset, pipeline.py), so the same
        # weights are evaluated on the same stream in both stages.
        seed=derive_seed(int(cfg.run.seed), int(cfg.eval.get("stream_offset", 0) or 0) + step, STREAM_EVAL),
    )


class preserved_rng:
    """Context manager restoring Python, NumPy and torch RNG states on exit."""

    def __enter__(self):
        self._py = random.getstate()
        self._np = np.random.get_state()
        self._torch = torch.get_rng_state()
        self._cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return self

    def __exit__(self, *exc):
        random.setstate(self._py)
        np.random.set_state(self._np)
        torch.set_rng_state(self._torch)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)
        return False


# ---- text <-> tokens (ExpRL segments and reference solutions, RRL's canonical states) ----------------


def find_tokenizer(generator: Any) -> Any:
    """The backend's tokenizer (local: ``engine.tokenizer``; nemo: ``session.tokenizer``): the one place that knows
    where each backend keeps it."""
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
    if isinstance(generator, ResponseEncoder):
        return list(generator.encode_response(text))
    tok = find_tokenizer(generator)
    return list(tok.encode(text, add_special_tokens=False)) + [int(tok.eos_token_id)]
