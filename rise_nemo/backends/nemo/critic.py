"""``interfaces.Critic`` on NeMo-RL v0.7's value model (``nemo_rl.models.value.lm_value.Value``, PPO path).

NeMo-RL's ``Value`` is a second full Megatron model whose LM head is replaced by a hidden -> 1 value head
(nemo_rl/models/value/workers/megatron_value_worker.py:99-104), with its own optimizer and scheduler. Its
API, as ``nemo_rl.algorithms.ppo`` drives it:

- ``get_values(data)`` -> ``{"values": [B, S]}``, already shifted right by one so that ``values[t]`` is the
  value of the state before token t (megatron_value_worker.py:829-833) -- rise_nemo's convention
  (rise_nemo.interfaces), so values pass through unchanged; wrapped in ``prepare_for_inference`` /
  ``finish_inference`` (ppo.py:1166-1169);
- ``train(data, loss_fn, gbs=, mbs=)`` shards rows over data-parallel ranks and micro-batches and calls the
  loss per micro-batch as ``loss_fn(values [B, S] (right-shifted), data=, global_valid_seqs=,
  global_valid_toks=)`` (megatron_value_worker.py:142-166; with sequence packing per sequence through
  ``SequencePackingLossWrapper`` as ``loss_fn(logits=values, data=, ...)``, :149-151, 315), summing the
  micro-batch losses (:180-188) and stepping its LR scheduler by ``gbs`` (:702-706); wrapped in
  ``prepare_for_training`` / ``finish_training``, which moves weights and optimizer off the GPUs again
  (ppo.py:1257-1267), and run while the policy is offloaded (``NemoSession.offload_policy``);
- ``save_checkpoint(weights_path, optimizer_path, tokenizer_path)`` (lm_value.py:422), called between
  ``prepare_for_training`` and ``finish_training`` (ppo.py:1558-1573); weights and optimizer are loaded only
  when the ``Value`` is built (``weights_path`` / ``optimizer_path``, lm_value.py:44-53).

The clipped value loss itself is rise_nemo's (rise_nemo.core, ``loss_fn(values [B, T], data)``);
``ValueLossFunction`` presents it to NeMo-RL as a LOGIT / TOKEN_LEVEL ``LossFunction`` (NeMo-RL's own
``MseValueLossFn`` has that type, nemo_rl/algorithms/loss/loss_functions.py:1147-1162), the way
``loss.RiseLossFunction`` presents the policy objective. As for the policy, the loss must be globally
normalised: ``NemoCritic.train`` writes the global count of valid value tokens into the batch as the
per-sample column ``value_token_count`` before NeMo-RL shards it, so summing micro-batch losses is exact.
No NeMo-RL import at module import time (the loss wrapper must unpickle in NeMo-RL's workers).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rise_nemo.backends.nemo.batch import (
    VALUE_COUNT_KEY,
    global_rows,
    pad_train_batch,
    sum_microbatch_metrics,
)
from rise_nemo.backends.nemo.loss import Objective, RiseLossFunction, _nemo_enums
from rise_nemo.planner.critic import value_config

VALUE_REQUIRED_KEYS = ("input_ids", "input_lengths", "token_mask", "sample_mask", "returns")


def align_values(values: torch.Tensor, width: int) -> torch.Tensor:
    """NeMo-RL's value-head output -> [B, width] aligned with input_ids.

    The worker hands the loss values already right-shifted to input_ids' positions: [B, S] (or [B, S, 1]
    before the squeeze, as MseValueLossFn allows, loss_functions.py:1170-1172). With sequence packing the
    packed prepare_fn cuts each sequence to ``data["returns"].shape[1]`` (megatron_value_worker.py:313-314);
    a shorter tensor is padded with zeros (those positions are off the mask).
    """
    if values.dim() == 3 and values.shape[-1] == 1:
        values = values.squeeze(-1)
    if values.shape[1] > width:
        return values[:, :width]
    if values.shape[1] < width:
        return torch.cat([values, values.new_zeros(values.shape[0], width - values.shape[1])], dim=1)
    return values


class ValueLossFunction(RiseLossFunction):
    """NeMo-RL ``LossFunction`` (input_type LOGIT, loss_type TOKEN_LEVEL) around a core value loss.

    ``objective(values [B, T], data) -> (loss, metrics)``, e.g. a ``functools.partial`` of the core's
    clipped value loss (picklable). NeMo-RL's ``global_valid_*`` normalisers are not used: the objective
    divides by ``data["value_token_count"]`` (see the module docstring). Everything but the input type and
    the alignment of the model output is the policy adapter's.
    """

    @property
    def input_type(self) -> Any:
        return _nemo_enums()[1].LOGIT

    @staticmethod
    def align(model_output: torch.Tensor, width: int) -> torch.Tensor:
        return align_values(model_output, width)

    def __call__(
        self,
        logits: torch.Tensor,
        data: Mapping[str, torch.Tensor],
        global_valid_seqs: torch.Tensor | None = None,
        global_valid_toks: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        # ``logits`` (the values) is MseValueLossFn's parameter name: the Megatron value worker passes it
        # positionally without sequence packing and as ``logits=`` through SequencePackingLossWrapper with it
        # (megatron_value_worker.py:149-151, 315; wrapper.py:136-141).
        return self.evaluate(logits, data)

    @staticmethod
    def num_valid_samples(data: Mapping[str, torch.Tensor]) -> float:
        """The micro-batch's row count, as MseValueLossFn reports it (loss_functions.py:1267)."""
        return float(data["sample_mask"].shape[0])


def attach_value_count(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The global normaliser of the value loss as a per-sample column (every row the same value)."""
    b = batch["input_ids"].shape[0]
    count = float((batch["token_mask"].float() * batch["sample_mask"].float()[:, None]).sum())
    out = dict(batch)
    out[VALUE_COUNT_KEY] = torch.full((b,), count, dtype=torch.float32)
    return out


class NemoCritic:
    """``interfaces.Critic`` on NeMo-RL's ``Value``; shares the policy's ``NemoSession`` (phase bookkeeping).

    ``value``: a ``nemo_rl.models.value.lm_value.Value`` (built by ``build_value`` or by the caller).
    ``config``: the value config NeMo-RL built it from (micro-batch sizes, sequence multiple).
    """

    def __init__(self, session: Any, value: Any, config: Mapping[str, Any], resumed_from: Path | None = None):
        self.session = session
        self.value = value
        self.micro_batch = int(config["train_micro_batch_size"])
        self.logprob_batch = int(config.get("logprob_batch_size") or self.micro_batch)
        self.seq_multiple = int(config.get("make_sequence_length_divisible_by") or 1)
        self.global_batch = int(config["train_global_batch_size"])  # every train call: gbs = this (global_rows)
        self.pad_id = int(session.tokenizer.pad_token_id)
        self.resumed_from = resumed_from

    @property
    def dp_size(self) -> int:
        return int(self.value.sharding_annotations.get_axis_size("data_parallel"))

    def get_values(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self.session.offload_policy()  # vLLM asleep and the policy off the GPUs before the value model wakes
        b, t = data["input_ids"].shape
        keys = {"input_ids": data["input_ids"], "input_lengths": data["input_lengths"]}
        padded, _ = pad_train_batch(keys, self.dp_size * self.logprob_batch, self.seq_multiple, self.pad_id)
        self.value.prepare_for_inference()
        out = self.value.get_values(self.session.to_batched(padded))["values"]
        self.value.finish_inference()
        if out.dim() == 3:
            out = out.squeeze(-1)  # ppo.py:1168 squeezes a trailing value dimension
        return out[:b, :t].float().cpu()

    def train(self, data: Mapping[str, torch.Tensor], loss_fn: Objective) -> dict[str, float]:
        self.session.offload_policy()  # the policy just trained: its weights, grads and Adam state leave first
        missing = [k for k in VALUE_REQUIRED_KEYS if k not in data]
        if missing:
            raise ValueError(f"critic training batch is missing key(s) {missing}")
        batch = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        batch["token_mask"] = batch["token_mask"].float()
        batch["sample_mask"] = batch["sample_mask"].float()
        batch = attach_value_count(batch)
        row_multiple = global_rows(batch["input_ids"].shape[0], self.dp_size, self.micro_batch, self.global_batch,
                                   "nemo.value", "the rows of one training step")
        train_data, _ = pad_train_batch(batch, row_multiple, self.seq_multiple, self.pad_id)
        # ONE global batch of exactly train_global_batch_size rows: one optimiser step and one LR-scheduler
        # iteration per step, whatever the number of rows (global_rows)
        gbs = train_data["input_ids"].shape[0]
        self.value.prepare_for_training()
        result = self.value.train(self.session.to_batched(train_data), ValueLossFunction(loss_fn),
                                  gbs=gbs, mbs=self.micro_batch)
        self.value.finish_training()
        metrics = {f"critic/{k}": v for k, v in sum_microbatch_metrics(result.get("all_mb_metrics", {})).items()}
        metrics["critic/grad_norm"] = float(result["grad_norm"])
        return metrics

    # -- checkpoints: sharded Megatron weights + optimizer, like NemoPolicy (ppo.py:1558-1573)
    def save_checkpoint(self, path: str | Path) -> None:
        path = Path(path)
        self.session.offload_policy()
        self.value.prepare_for_training()
        # checkpointing_cfg: the DTensor v2 value worker refuses to save without it (automodel/checkpoint.py:280-283;
        # ppo.py:1571 passes master_config.checkpointing); the Megatron worker ignores it
        self.value.save_checkpoint(weights_path=str(path / "weights"), optimizer_path=str(path / "optimizer"),
                                   tokenizer_path=str(path / "tokenizer"),
                                   checkpointing_cfg=self.session.config.get("checkpointing"))
        self.value.finish_training()

    def load_checkpoint(self, path: str | Path) -> None:
        """NeMo-RL loads the value model's weights and optimizer when the ``Value`` is built; this hook only
        verifies that the orchestration resumes from the checkpoint it was built from."""
        if self.resumed_from is None or Path(self.resumed_from).resolve() != Path(path).resolve():
            raise RuntimeError(
                f"nemo backend: asked to resume the critic from {path}, but it was built from "
                f"{self.resumed_from or 'scratch'}; NeMo-RL loads checkpoints only when the value model is created"
            )


def build_value(train_cluster: Any, tokenizer: Any, config: Mapping[str, Any], resume_dir: Path | None,
                policy: Any = None) -> Any:
    """NeMo-RL's ``Value`` on the training cluster, as ppo.py builds it in colocated mode (ppo.py:484-552):
    the policy is offloaded while the value workers initialise, the value model is offloaded right after
    (``finish_training``), and the policy is reloaded for the first refit (ppo.py:629-631)."""
    from nemo_rl.models.value.lm_value import Value

    from rise_nemo.backends.nemo import resume_paths
    from rise_nemo.backends.nemo.failfast import shut_down_at_exit

    # The policy's resume rule (NeMo-RL's get_resume_paths): a Megatron value worker keeps its optimizer and
    # LR scheduler inside weights/ (megatron_value_worker.py:964-1010), a DTensor one in optimizer/.
    weights, optimizer = resume_paths(resume_dir) if resume_dir is not None else (None, None)
    if policy is not None:
        policy.offload_after_refit()
    value = Value(cluster=train_cluster, config=dict(config), tokenizer=tokenizer, name_prefix="lm_value",
                  weights_path=weights, optimizer_path=optimizer, init_optimizer=True)
    shut_down_at_exit(value)  # while Ray is still up, not in its __del__ after it
    value.finish_training()
    if policy is not None:
        policy.prepare_for_training()
    return value


__all__ = ["NemoCritic", "ValueLossFunction", "VALUE_COUNT_KEY", "align_values", "attach_value_count",
           "build_value", "value_config"]
