"""Driver-side batch plumbing between the orchestration's plain-tensor batches and NeMo-RL.

Everything here works on plain ``dict[str, torch.Tensor]`` (NeMo-RL's BatchedDataDict is a dict subclass),
so it is tested on CPU without NeMo-RL. Three jobs:

- generation: chat-prompt token lists -> vLLM input (``input_ids``/``input_lengths``, n samples per prompt)
  and vLLM's ``GenerationOutputSpec`` -> ``interfaces.Rollout`` lists;
- training: the orchestration's batch (natural + guided rows, guided responses already spliced onto the
  ORIGINAL prompt tokens) -> a NeMo-RL train batch: per-kind global counts recomputed on the driver for
  the global batch and carried as per-sample columns, rows padded to a multiple of DP x micro-batch
  (padding rows have sample_mask 0), the sequence axis padded to ``make_sequence_length_divisible_by``;
- off-policy correction for rollouts from a different engine (FP8 vLLM): the PPO ratio of the natural rows
  is taken against the sampler's own log-probs where that is valid (see ``use_behaviour_logprobs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rise_nemo.core.logprobs import ppo_reference_logprobs
from rise_nemo.interfaces import KIND_GUIDED, KIND_NATURAL, Rollout

PER_TOKEN_KEYS = ("input_ids", "token_mask", "generation_logprobs", "prev_logprobs", "reference_policy_logprobs",
                  "token_advantages", "values", "returns")
PER_SAMPLE_KEYS = ("input_lengths", "sample_mask", "advantages", "kind", "natural_token_count", "guided_seq_count",
                   "sampled_under_train_prompt")
REQUIRED_KEYS = ("input_ids", "input_lengths", "token_mask", "sample_mask", "kind")
# Per-sample advantages [B] or per-token ones [B, T] (rise_nemo.interfaces): a batch carries at least one.
# Both travel to NeMo-RL's workers unchanged (NeMo-RL's own ClippedPGLossFn also reads [B, T] advantages,
# nemo_rl/algorithms/loss/loss_functions.py:321, ``data["advantages"][:, 1:]``).
ADVANTAGE_KEYS = ("advantages", "token_advantages")


class BatchError(ValueError):
    """A training batch that NeMo-RL cannot consume; the message names the key."""


# ----------------------------------------------------------------------------------------------------------
# Generation


def generation_input(prompt_ids: Sequence[Sequence[int]], n: int, pad_id: int) -> dict[str, torch.Tensor]:
    """vLLM input for ``n`` samples of every prompt, rows ordered prompt-major (p0s0, p0s1, ..., p1s0, ...).

    Returns input_ids [P*n, L] right-padded with ``pad_id`` and input_lengths [P*n].
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("an empty prompt cannot be generated from (chat template produced no tokens)")
    rows = [list(p) for p in prompt_ids for _ in range(n)]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [P*n, L]
    for i, r in enumerate(rows):
        input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return {"input_ids": input_ids, "input_lengths": torch.tensor([len(r) for r in rows], dtype=torch.long)}


def rollouts_from_generation(
    output: Mapping[str, Any],
    prompts: Sequence[list[dict]],
    prompt_ids: Sequence[Sequence[int]],
    n: int,
    decode,
    eos_token_ids: Sequence[int] = (),
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Rollout]]:
    """NeMo-RL ``GenerationOutputSpec`` -> result[i][j] = prompt i's j-th sample.

    ``output_ids`` [P*n, S] holds each row's unpadded input followed by its generated tokens (right-padded);
    ``logprobs`` [P*n, S] holds the sampler's log-prob of each generated token at the same position (0 on
    the input, nemo_rl/models/generation/vllm/vllm_worker.py:727-736); ``generation_lengths`` [P*n] counts
    generated tokens only; optional ``truncated`` [P*n] (hit max_new_tokens without a stop token).
    ``decode(token_ids) -> str`` renders the response text for the judge.

    ``prefixes[i]``: given response tokens that were appended to prompt i's input (vLLM continues them as
    extra context). Each rollout's response starts with them, ``given_token_count`` says how many, and their
    sampling log-probs are 0.0: like NeMo-RL's GRPO, which marks assistant tokens without generation
    log-probs as not trainable (nemo_rl/algorithms/grpo.py:1465-1493, token_loss_mask 0).
    """
    out_ids, gen_lp = output["output_ids"], output["logprobs"]
    gen_len = output["generation_lengths"]
    truncated = output.get("truncated")
    expected = len(prompt_ids) * n
    if out_ids.shape[0] != expected:
        raise BatchError(f"generation returned {out_ids.shape[0]} rows, expected {len(prompt_ids)} prompts x {n}")
    eos = set(int(t) for t in eos_token_ids)
    result: list[list[Rollout]] = []
    given_all = [list(map(int, g)) for g in prefixes] if prefixes is not None else [[] for _ in prompt_ids]
    if len(given_all) != len(prompt_ids):
        raise BatchError(f"{len(given_all)} prefixes for {len(prompt_ids)} prompts")
    for i, (messages, p_ids, given) in enumerate(zip(prompts, prompt_ids, given_all)):
        group = []
        for j in range(n):
            row = i * n + j
            start, length = len(p_ids) + len(given), int(gen_len[row])
            sampled = [int(t) for t in out_ids[row, start : start + length].tolist()]
            lps = [0.0] * len(given) + [float(x) for x in gen_lp[row, start : start + length].tolist()]
            if truncated is not None:
                finished = not bool(truncated[row])
            else:  # older engines: finished when the last token is a stop token
                finished = bool(sampled) and sampled[-1] in eos
            resp = given + sampled
            group.append(Rollout(list(messages), list(p_ids), resp, decode(resp), lps, finished,
                                 given_token_count=len(given)))
        result.append(group)
    return result


# ----------------------------------------------------------------------------------------------------------
# Training


def check_train_batch(batch: Mapping[str, torch.Tensor]) -> tuple[int, int]:
    """Shape checks with the offending key named; returns (B, T)."""
    for key in REQUIRED_KEYS:
        if key not in batch:
            raise BatchError(f"training batch is missing key {key!r}")
    if not any(key in batch for key in ADVANTAGE_KEYS):
        raise BatchError("training batch is missing key 'advantages' (or per-token 'token_advantages')")
    b, t = batch["input_ids"].shape
    for key in PER_TOKEN_KEYS:
        if key in batch and tuple(batch[key].shape) != (b, t):
            raise BatchError(f"training batch key {key!r} has shape {tuple(batch[key].shape)}, expected {(b, t)}")
    for key in PER_SAMPLE_KEYS:
        if key in batch and tuple(batch[key].shape) != (b,):
            raise BatchError(f"training batch key {key!r} has shape {tuple(batch[key].shape)}, expected {(b,)}")
    kinds = set(int(k) for k in batch["kind"].unique().tolist())
    if not kinds <= {KIND_NATURAL, KIND_GUIDED}:
        raise BatchError(f"training batch key 'kind' holds {sorted(kinds)}; expected {KIND_NATURAL} or {KIND_GUIDED}")
    return b, t


def attach_global_counts(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-kind global normalisers of the core objective as per-sample columns (every row the same value).

    ``natural_token_count`` = valid response tokens of natural rows, ``guided_seq_count`` = |O_ref|, both
    over the WHOLE global batch (eqs. 11-12). They must be computed here, on the driver, before NeMo-RL
    shards the batch over data-parallel ranks and micro-batches; each shard then divides by the global value
    and NeMo-RL's sum over shards is exact.
    """
    b = batch["input_ids"].shape[0]
    valid = batch["sample_mask"].bool()  # [B]
    natural = valid & (batch["kind"] == KIND_NATURAL)
    guided = valid & (batch["kind"] == KIND_GUIDED)
    n_tokens = float(batch["token_mask"][natural].sum())
    out = dict(batch)
    out["natural_token_count"] = torch.full((b,), n_tokens, dtype=torch.float32)
    out["guided_seq_count"] = torch.full((b,), float(guided.sum()), dtype=torch.float32)
    return out


def use_behaviour_logprobs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Off-policy correction for rollouts sampled by another engine (e.g. FP8 vLLM vs. the bf16 trainer).

    ``prev_logprobs`` becomes each row's PPO reference as ``core.logprobs.ppo_reference_logprobs`` decides:
    the sampler's log-probs only on rows sampled under the prompt they are trained on (the batch column
    ``sampled_under_train_prompt``), the trainer's recomputed ones everywhere else (guided, coupled
    privileged and RuscaRL rows). The core objective then corrects the mismatch itself (no second formula).
    """
    for key in ("generation_logprobs", "prev_logprobs", "sampled_under_train_prompt"):
        if key not in batch:
            raise BatchError(f"importance-sampling correction needs {key!r} in the training batch")
    out = dict(batch)
    out["prev_logprobs"] = ppo_reference_logprobs(batch["prev_logprobs"], batch["generation_logprobs"],
                                                  batch["token_mask"], batch["sampled_under_train_prompt"])
    return out


VALUE_COUNT_KEY = "value_token_count"  # the critic's: sum(token_mask * sample_mask) over the WHOLE global batch
# Per-sample columns holding one global normaliser (every row the same value), padding rows included: a
# micro-batch of padding rows then divides 0 by the global count, never 0 by 0 (the core objective's
# counts, the SFT baseline's ``global_tokens`` (rise_nemo.tasks.sft), the value loss's count).
GLOBAL_COLUMNS = ("natural_token_count", "guided_seq_count", "global_tokens", VALUE_COUNT_KEY)


def pad_train_batch(
    batch: Mapping[str, torch.Tensor], row_multiple: int, seq_multiple: int, pad_id: int
) -> tuple[dict[str, torch.Tensor], int]:
    """Pad rows to a multiple of ``row_multiple`` (DP x micro-batch) and the sequence axis to a multiple of
    ``seq_multiple``. Padding rows are one pad token long, sample_mask 0, token_mask 0, kind natural, so
    they add nothing to any loss term or count. Returns (padded batch, original row count)."""
    b, t = batch["input_ids"].shape
    rows = -(-b // row_multiple) * row_multiple
    width = -(-t // seq_multiple) * seq_multiple
    out: dict[str, torch.Tensor] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            out[key] = value
            continue
        if value.dim() == 2:
            fill = pad_id if key == "input_ids" else 0
            padded = torch.full((rows, width), fill, dtype=value.dtype)
            padded[:b, :t] = value
        elif value.dim() == 1:
            padded = torch.zeros(rows, dtype=value.dtype)
            padded[:b] = value
            if key in GLOBAL_COLUMNS and b:
                padded[b:] = value[0]  # global columns: every row holds the same value
            elif key == "input_lengths":
                padded[b:] = 1
            elif key == "kind":
                padded[b:] = KIND_NATURAL
        else:
            raise BatchError(f"training batch key {key!r} has {value.dim()} dims; expected 1 or 2")
        out[key] = padded
    return out, b


def global_rows(rows: int, dp_size: int, micro_batch_size: int, global_batch_size: int | None, block: str,
                needed: str) -> int:
    """The row count a training batch is padded to (a multiple of it): exactly ``global_batch_size`` when given,
    so that every ``train`` call hands Megatron the same ``gbs``, which is what its LR scheduler advances by
    (``scheduler.step(increment=gbs)``, megatron_policy_worker.py:801-806, megatron_value_worker.py:702-706;
    warmup and decay are counted in iterations x ``train_global_batch_size``, megatron/setup.py:1013): one
    scheduler iteration per step. Without it, the next multiple of DP x micro-batch."""
    row_multiple = dp_size * micro_batch_size
    if global_batch_size is None:
        return row_multiple
    if global_batch_size % row_multiple:
        raise BatchError(f"recipe key {block}.train_global_batch_size: {global_batch_size} is not a multiple "
                         f"of DP {dp_size} x train_micro_batch_size {micro_batch_size}")
    if rows > global_batch_size:
        raise BatchError(f"recipe key {block}.train_global_batch_size: this step has {rows} training rows, more "
                         f"than {global_batch_size}; set it to at least {needed}")
    return global_batch_size


def to_nemo_train_batch(
    batch: Mapping[str, torch.Tensor],
    dp_size: int,
    micro_batch_size: int,
    seq_multiple: int,
    pad_id: int,
    behaviour_ratio: bool,
    global_batch_size: int | None = None,
) -> tuple[dict[str, torch.Tensor], int]:
    """The orchestration's batch -> the dict handed to NeMo-RL's ``Policy.train`` (as one global batch).

    ``global_batch_size`` (NeMo-RL's ``policy.train_global_batch_size``): rows are padded to exactly that many,
    so that the ``gbs`` of every train call, which is what Megatron's LR scheduler advances by, is constant.
    Without it rows are padded to the next multiple of DP x micro-batch.
    """
    b = check_train_batch(batch)[0]
    row_multiple = global_rows(b, dp_size, micro_batch_size, global_batch_size, "nemo.policy",
                               "prompts_per_step x (group_size + privileged_group_size)")
    if "prev_logprobs" not in batch:
        raise BatchError("training batch is missing key 'prev_logprobs' (call Policy.get_logprobs first)")
    out = dict(batch)
    out["sample_mask"] = batch["sample_mask"].float()
    out["token_mask"] = batch["token_mask"].float()
    if "generation_logprobs" not in out:
        out["generation_logprobs"] = torch.zeros_like(out["prev_logprobs"])
    if behaviour_ratio:
        out = use_behaviour_logprobs(out)
    out = attach_global_counts(out)
    return pad_train_batch(out, row_multiple, seq_multiple, pad_id)


# Values NeMo-RL's Megatron worker stamps on every micro-batch record unchanged (not partial sums).
REPEATED_METRICS = ("lr", "wd", "global_valid_seqs", "global_valid_toks")


def sum_microbatch_metrics(all_mb_metrics: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """NeMo-RL returns one value per micro-batch (and DP rank) for every metric; ours are globally
    pre-normalised, so their sum is the global value. The worker's repeated stamps keep one copy."""
    out = {}
    for key, values in all_mb_metrics.items():
        values = [float(v) for v in values]
        if not values:
            continue
        out[key] = values[0] if key in REPEATED_METRICS else float(sum(values))
    return out
