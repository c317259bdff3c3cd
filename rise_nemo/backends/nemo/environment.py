"""Rubric scoring as a NeMo-RL environment, so NeMo-RL's own rollout, validation and evaluation loops can
score rubric datasets with any ``interfaces.Judge`` (rule or HTTP).

``RubricEnvironmentCore`` is the logic, in plain Python (tested on CPU); ``env_actor.RubricJudgeEnvironment``
is the Ray actor NeMo-RL creates (``create_env``), registered with ``register_rubric_environment``.
The rubric travels in each datum's ``extra_env_info`` (``rubric_datum``), which NeMo-RL hands to ``step``
as ``metadata``. The judge always sees the ORIGINAL conversation: every message before the final
assistant turn.

NeMo-RL drops metadata returned on a terminal step, so per-criterion verdicts do not travel back through
its rollout code; the scalar reward (eq. 3) does. ``env_actor`` implements the interface's
``global_post_process_and_metrics`` (mean and max reward), but NeMo-RL v0.7.0 never calls it: no rollout
or algorithm loop does (only environments define it; nemo_rl/environments/interfaces.py:85), so those
numbers appear only where a caller asks for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.core.rewards import rubric_reward
from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric, RubricPrompt
from rise_nemo.interfaces import Judge, JudgeRequest

TASK_NAME = "rubric"


def rubric_to_metadata(prompt: RubricPrompt) -> dict[str, Any]:
    """JSON-able form of a prompt's rubric for ``extra_env_info`` (crosses Ray and the dataloader)."""
    return {
        "prompt_id": prompt.prompt_id,
        "criteria": [
            {"text": c.text, "weight": float(c.weight), "tags": list(c.tags),
             "check": None if c.check is None else {"kind": c.check.kind, "value": c.check.value}}
            for c in prompt.rubric.criteria
        ],
    }


def rubric_from_metadata(meta: Mapping[str, Any], where: str = "extra_env_info") -> Rubric:
    if not isinstance(meta, Mapping) or "criteria" not in meta:
        raise ValueError(f"{where}: no 'criteria' (was the datum built by rise_nemo.backends.nemo.environment.rubric_datum?)")
    criteria = tuple(
        Criterion(str(c["text"]), float(c["weight"]), tuple(c.get("tags") or ()),
                  None if not c.get("check") else MachineCheck(c["check"]["kind"], str(c["check"]["value"])))
        for c in meta["criteria"]
    )
    return Rubric(criteria).validate(f"{where} prompt {meta.get('prompt_id', '?')}")


def rubric_datum(prompt: RubricPrompt, encode, idx: int, task_name: str = TASK_NAME) -> dict[str, Any]:
    """A NeMo-RL ``DatumSpec`` for one rubric prompt: the whole conversation rendered as ONE user-side
    message (its token_ids = chat template + generation prompt, so generation continues from it; its
    content = the final user turn, for NeMo-RL's logs). The full conversation rides in extra_env_info.

    ``encode(messages) -> list[int]`` is the generator's ``encode_prompt``.
    """
    extra = {**rubric_to_metadata(prompt), "conversation": [dict(m) for m in prompt.messages]}
    return _datum(prompt.messages, encode, idx, extra, task_name)


def _datum(messages, encode, idx: int, extra_env_info: dict[str, Any], task_name: str) -> dict[str, Any]:
    ids = torch.tensor(encode(list(messages)), dtype=torch.long)
    return {
        "message_log": [{"role": "user", "content": str(messages[-1]["content"]), "token_ids": ids}],
        "length": int(ids.numel()),
        "extra_env_info": extra_env_info,
        "loss_multiplier": 1.0,
        "idx": idx,
        "task_name": task_name,
    }


REASONING_TASK_NAME = "math"  # NeMo-RL's verifiable-answer environment takes the answer as ``ground_truth``


def problem_datum(problem: ReasoningProblem, encode, idx: int, task_name: str = REASONING_TASK_NAME) -> dict[str, Any]:
    """A NeMo-RL ``DatumSpec`` for one verifiable reasoning problem (PPO, sparse GRPO, RRL, ExpRL recipes):
    the same prompt rendering as ``rubric_datum``; ``extra_env_info`` carries the answer under NeMo-RL's
    math-environment key ``ground_truth`` (nemo_rl/environments/math_environment.py), never the hidden
    reference solution."""
    return _datum(problem.messages, encode, idx, {"prompt_id": problem.prompt_id, "ground_truth": str(problem.answer)},
                  task_name)


def prompt_datum(prompt: RubricPrompt | ReasoningProblem, encode, idx: int) -> dict[str, Any]:
    """``rubric_datum`` or ``problem_datum``, by the prompt's type (a recipe's training set holds one kind)."""
    if isinstance(prompt, ReasoningProblem):
        return problem_datum(prompt, encode, idx)
    if isinstance(prompt, RubricPrompt):
        return rubric_datum(prompt, encode, idx)
    raise TypeError(f"training prompt {idx}: expected a RubricPrompt or ReasoningProblem, got {type(prompt).__name__}")


def split_conversation(message_log: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, str]], str]:
    """(original conversation, response): the response is the final assistant message."""
    if not message_log or message_log[-1].get("role") != "assistant":
        raise ValueError("rubric environment: the message log must end with the assistant's response")
    convo = [{"role": str(m["role"]), "content": str(m["content"])} for m in message_log[:-1]]
    return convo, str(message_log[-1]["content"])


class RubricEnvironmentCore:
    """``step`` of a one-turn rubric environment on any ``interfaces.Judge``."""

    def __init__(self, judge: Judge, clip_min: float | None = None):
        self.judge = judge
        self.clip_min = clip_min

    def score(self, message_logs: Sequence[Sequence[Mapping[str, Any]]], metadata: Sequence[Mapping[str, Any]]):
        """Returns (rewards [B] float32, unknown [B] bool): a response with any unknown verdict scores 0 and is
        flagged (the training loop excludes such samples; NeMo-RL's validation just averages)."""
        requests = []
        for i, (log, meta) in enumerate(zip(message_logs, metadata)):
            convo, response = split_conversation(log)
            # The datum carries the original conversation; NeMo-RL's message_log may hold only rendered text.
            original = meta.get("conversation") or convo
            requests.append(JudgeRequest(original, response, rubric_from_metadata(meta, f"metadata[{i}]"),
                                         str(meta.get("prompt_id", i))))
        verdicts = self.judge.judge(requests)
        rewards, unknown = [], []
        for req, v in zip(requests, verdicts):
            if any(x is None for x in v):
                rewards.append(0.0)
                unknown.append(True)
                continue
            r = rubric_reward(torch.tensor([bool(x) for x in v]), torch.tensor(req.rubric.weights), self.clip_min)
            rewards.append(float(r))
            unknown.append(False)
        return torch.tensor(rewards, dtype=torch.float32), torch.tensor(unknown)

    def step(self, message_log_batch, metadata):
        """NeMo-RL ``EnvironmentInterface.step`` fields, as a tuple in ``EnvironmentReturn`` order."""
        rewards, unknown = self.score(message_log_batch, metadata)
        observations = [
            {"role": "environment", "content": "rubric: unknown verdict" if u else f"rubric reward {float(r):.4f}"}
            for r, u in zip(rewards, unknown)
        ]
        n = len(message_log_batch)
        return observations, list(metadata), [None] * n, rewards, torch.ones(n), [None] * n

    @staticmethod
    def batch_metrics(rewards: torch.Tensor) -> dict[str, float]:
        if rewards.numel() == 0:
            return {}
        return {"rubric/mean_reward": float(rewards.float().mean()), "rubric/max_reward": float(rewards.max())}
