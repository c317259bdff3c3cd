"""What a step trained on, for ``samples.jsonl`` (like TRL's completion logging / nano-aha-moment's episode
dumps): per recorded rollout the step, prompt id, whether it was sampled under a hint (privileged, eq. 6),
the response, its per-criterion verdicts on the ORIGINAL rubric, reward (eq. 3), the advantage it was
trained with (eq. 1 natural, A_ref of eq. 7 guided; null when it was not trained on: an unknown verdict,
or a privileged response with A_ref <= 0, eq. 8) and its kind (0 natural, 1 guided).

At most ``cap`` natural and ``cap`` privileged rollouts per step (the first prompts of the batch, in
order), so the file stays small on long runs (``train.log_samples``).

The reasoning step (rise_nemo.steps.reasoning) writes ``reasoning_sample_records``: per rollout
the step, prompt id, difficulty, the response (given prefix + sampled continuation, as generated), how many
of its tokens were given (a replayed prefix / start state: context only, not trained) and how many sampled,
the reward (null when the verifier could not decide: not trained on), the advantage it was trained with
(GRPO: its group advantage; PPO: the mean of its per-token GAE advantages over the sampled tokens) and its
kind (0). At most ``cap`` rollouts per step, the first problems of the batch in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _verdict(v: Any) -> bool | None:
    return None if v is None else bool(v)


def sample_records(step: int, prompts: Sequence[Any], nat: Any, priv: Any, targets: Sequence[int],
                   samples: Sequence[Any], cap: int) -> list[dict[str, Any]]:
    trained = {s.source: s for s in samples if s.source is not None}
    records: list[dict[str, Any]] = []

    def add(scored: Any, privileged: bool, rows: Sequence[tuple[int, int]]) -> None:
        n = 0
        for row, prompt_index in rows:
            for j, rollout in enumerate(scored.rollouts[row]):
                if n >= cap:
                    return
                sample = trained.get((privileged, row, j))
                valid = bool(scored.valid[row, j])
                records.append({
                    "step": step,
                    "prompt_id": prompts[prompt_index].prompt_id,
                    "hinted": privileged,
                    "response": rollout.response_text,
                    "verdicts": [_verdict(v) for v in scored.verdicts[row][j]],
                    "reward": float(scored.rewards[row, j]) if valid else None,
                    "advantage": None if sample is None else float(sample.advantage),
                    "kind": None if sample is None else int(sample.kind),
                })
                n += 1

    add(nat, False, [(i, i) for i in range(len(prompts))])
    if priv is not None:
        add(priv, True, list(enumerate(targets)))
    return records


def reasoning_sample_records(step: int, problems: Sequence[Any], groups: Sequence[Sequence[Any]], rewards: Any,
                             valid: Any, batch: Mapping[str, Any], cap: int) -> list[dict[str, Any]]:
    """``groups[i][j]`` is problem i's j-th rollout; ``rewards`` / ``valid`` [N, G]; ``batch`` holds one row per
    valid rollout in (i, j) order with ``token_advantages`` [B, T] (PPO) or ``advantages`` [B] (GRPO)."""
    per_row = batch.get("token_advantages")
    if per_row is not None:
        mask = batch["token_mask"]
        per_row = (per_row * mask).sum(1) / mask.sum(1).clamp(min=1)
    else:
        per_row = batch["advantages"]
    records: list[dict[str, Any]] = []
    row = 0
    for i, group in enumerate(groups):
        for j, rollout in enumerate(group):
            trained = bool(valid[i, j])
            if len(records) < cap:
                given = int(rollout.given_token_count)
                records.append({
                    "step": step,
                    "prompt_id": problems[i].prompt_id,
                    "difficulty": problems[i].difficulty,
                    "response": rollout.response_text,
                    "given_tokens": given,
                    "sampled_tokens": len(rollout.response_token_ids) - given,
                    "reward": float(rewards[i, j]) if trained else None,
                    "advantage": float(per_row[row]) if trained else None,
                    "kind": 0 if trained else None,
                })
            row += int(trained)
    return records


def sft_sample_records(step: int, problems: Sequence[Any], batch: Mapping[str, Any], cap: int) -> list[dict[str, Any]]:
    """The SFT baseline's step trains on the problems' reference solutions (nothing is sampled): one record per
    problem, row i of ``batch``, with the reference as the response and its trained token count."""
    trained = batch["token_mask"].sum(1)
    return [{"step": step, "prompt_id": p.prompt_id, "difficulty": p.difficulty, "response": p.reference_solution,
             "given_tokens": 0, "sampled_tokens": 0, "trained_tokens": int(trained[i]), "reward": None,
             "advantage": None, "kind": "sft_reference"} for i, p in enumerate(problems[:cap])]
