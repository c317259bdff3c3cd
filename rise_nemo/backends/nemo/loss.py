"""The core objective (eq. 12) as a NeMo-RL ``LossFunction`` — a thin seam, no formula of its own.

NeMo-RL's Megatron worker calls a loss once per micro-batch (and, with sequence packing, once per
sequence) as ``loss_fn(data=..., global_valid_seqs=..., global_valid_toks=..., next_token_logprobs=...)``
(nemo_rl/algorithms/loss/wrapper.py) and simply sums the returned losses and metrics. The core objective
already divides every term by global counts carried in the data as per-sample columns
(``natural_token_count``, ``guided_seq_count``, computed on the driver per global batch, see
``rise_nemo.backends.nemo.batch.attach_global_counts``), so summing is exact and NeMo-RL's own
``global_valid_*`` normalisers are not needed.

This module must unpickle inside NeMo-RL's Megatron worker processes: it imports nothing from nemo_rl at
module import time; the two enum attributes NeMo-RL dispatches on are resolved lazily.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import torch

Objective = Callable[[torch.Tensor, Mapping[str, torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


class _FallbackLossType(enum.Enum):
    """Stand-ins with NeMo-RL's enum values, used only where nemo_rl is not importable (CPU tests)."""

    TOKEN_LEVEL = "token_level"


class _FallbackLossInputType(enum.Enum):
    LOGPROB = "logprob"
    LOGIT = "logit"  # the value loss (rise_nemo.backends.nemo.critic)


def _nemo_enums() -> tuple[Any, Any]:
    try:
        from nemo_rl.algorithms.loss.interfaces import LossInputType, LossType
    except ImportError:
        return _FallbackLossType, _FallbackLossInputType
    return LossType, LossInputType


def align_next_token_logprobs(next_token_logprobs: torch.Tensor, width: int) -> torch.Tensor:
    """NeMo-RL's next-token log-probs [B, S-1] -> our convention [B, width] aligned with input_ids.

    NeMo-RL's column t holds log p(input_ids[t+1] | input_ids[:t+1]); ours puts it at t+1 with column 0
    = 0 (rise_nemo.interfaces). ``width`` is the data's sequence width; with sequence packing NeMo-RL
    trims both to the unpadded length, otherwise S-1+1 == width and nothing is cut or padded.
    """
    b = next_token_logprobs.shape[0]
    lp = torch.cat([next_token_logprobs.new_zeros(b, 1), next_token_logprobs], dim=1)  # [B, S]
    if lp.shape[1] > width:
        lp = lp[:, :width]
    elif lp.shape[1] < width:
        lp = torch.cat([lp, lp.new_zeros(b, width - lp.shape[1])], dim=1)
    return lp


class RiseLossFunction:
    """NeMo-RL ``LossFunction`` (input_type LOGPROB, loss_type TOKEN_LEVEL) around a core objective.

    ``objective(logprobs [B, T], data) -> (loss, metrics)`` is what the orchestration hands to
    ``Policy.train``: ``functools.partial(rise_nemo.core.losses.policy_objective, cfg=...)`` (picklable).
    """

    def __init__(self, objective: Objective):
        self.objective = objective

    @property
    def loss_type(self) -> Any:
        return _nemo_enums()[0].TOKEN_LEVEL

    @property
    def input_type(self) -> Any:
        return _nemo_enums()[1].LOGPROB

    @staticmethod
    def align(model_output: torch.Tensor, width: int) -> torch.Tensor:
        """NeMo-RL's per-token model output -> [B, T] aligned with input_ids (what the objective takes)."""
        return align_next_token_logprobs(model_output, width)

    def __call__(
        self,
        next_token_logprobs: torch.Tensor,
        data: Mapping[str, torch.Tensor],
        global_valid_seqs: torch.Tensor | None = None,
        global_valid_toks: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        # The parameter names are NeMo-RL's (ClippedPGLossFn): its workers pass the model output by keyword
        # through prepare_loss_input (``**{"next_token_logprobs": ...}``, nemo_rl/algorithms/loss/utils.py).
        return self.evaluate(next_token_logprobs, data)

    def evaluate(self, model_output: torch.Tensor, data: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        # global_valid_* are NeMo-RL's normalisers over token_mask * sample_mask of ALL rows; the core
        # objective normalises each kind by its own global count instead (eqs. 11-12), read from data.
        loss, metrics = self.objective(self.align(model_output.float(), data["token_mask"].shape[1]), data)
        # NeMo-RL's worker reads metrics["loss"] per micro-batch to report the global loss, and
        # metrics["num_valid_samples"] to decide whether the micro-batch counts (dtensor_policy_worker.py:916,
        # 934; KeyError without it).
        out = {k: float(v) for k, v in metrics.items() if v is not None}
        out["loss"] = float(loss.detach())
        out["num_valid_samples"] = self.num_valid_samples(data)
        return loss, out

    @staticmethod
    def num_valid_samples(data: Mapping[str, torch.Tensor]) -> float:
        """The micro-batch's sample_mask sum, as ClippedPGLossFn reports it (loss_functions.py:719)."""
        return float(data["sample_mask"].float().sum())
