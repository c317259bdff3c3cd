"""``interfaces.Policy`` and ``interfaces.Generator`` on NeMo-RL's Megatron ``Policy`` and vLLM generation.

One step of the orchestration (rise_nemo.steps.rubric) calls, in order:
  generator.generate(natural prompts)      -> opens the generation window (refit weights into vLLM once)
  generator.generate(privileged prompts)   -> same window, same engine: no second refit or wake-up
  policy.get_logprobs(batch)               -> closes the window (vLLM sleeps), Megatron forward
  policy.train(batch, loss_fn)             -> ONE NeMo-RL train call for natural + guided rows
which is the order of NeMo-RL's own grpo_train (refit_policy_generation, generate, finish_generation,
prepare_for_lp_inference, get_logprobs, prepare_for_training, train), with two generate calls in one
window. ``NemoSession`` holds the shared state (which phase the GPUs are in, whether vLLM holds stale
weights). NeMo-RL objects are passed in; nothing here imports nemo_rl at module import time except
``BatchedDataDict``, imported lazily where a NeMo-RL call needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rise_nemo.backends.nemo.batch import (
    BatchError,
    check_train_batch,
    generation_input,
    pad_train_batch,
    rollouts_from_generation,
    sum_microbatch_metrics,
    to_nemo_train_batch,
)
from rise_nemo.backends.nemo.config import uses_async_engine
from rise_nemo.backends.nemo.failfast import shut_down_at_exit
from rise_nemo.backends.nemo.loss import RiseLossFunction
from rise_nemo.core.losses import loss_needs_prev_logprobs, loss_needs_reference_logprobs
from rise_nemo.interfaces import KIND_NATURAL, GenerationRequest, LossFn, OnRollout, Rollout, SamplingParams

log = logging.getLogger("rise_nemo.backends.nemo")


def _batched(data: Mapping[str, Any]):
    """NeMo-RL's workers require its BatchedDataDict (a UserDict with sharding helpers)."""
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    return BatchedDataDict(dict(data))


class NemoSession:
    """Phase bookkeeping shared by NemoPolicy and NemoGenerator (one per run)."""

    def __init__(
        self,
        policy: Any,
        generation: Any,
        tokenizer: Any,
        master_config: Mapping[str, Any],
        refit: Callable[..., None],
        to_batched: Callable[[Mapping[str, Any]], Any] = _batched,
    ):
        self.policy = policy  # nemo_rl.models.policy.lm_policy.Policy (Megatron)
        self.generation = generation  # nemo_rl.models.generation.vllm.VllmGeneration
        self.tokenizer = tokenizer
        self.config = master_config
        self.colocated = bool(master_config["policy"]["generation"]["colocated"]["enabled"])
        self.refit = refit  # nemo_rl.algorithms.grpo.refit_policy_generation
        self.to_batched = to_batched
        shut_down_at_exit(policy, generation)  # while Ray is still up, not in their __del__ after it
        self.stale = True  # vLLM holds weights older than the policy's
        self.generating = False
        self.refits = 0
        self.resumed_from: Path | None = None  # checkpoint the policy was built from (set by build_backend())
        self.train_cluster: Any = None  # NeMo-RL's training cluster, where build_critic() places the value model
        self.colocated_groups = 2 if self.colocated else 1  # worker groups on train_cluster: policy (+ vLLM)
        self.policy_offloaded = False  # offload_policy() moved the policy's weights off the GPUs (PPO's critic)

    def open_generation(self) -> None:
        if self.generating:
            return
        if self.stale:
            if self.policy_offloaded:  # the refit streams the weights from the GPUs (colocated ZMQ/IPC)
                self.to_inference()
            self.refit(self.policy, self.generation, self.colocated,
                       _refit_buffer_size_gb=self.config["policy"].get("refit_buffer_size_gb"))
            self.refits += 1
            self.stale = False
        else:
            if self.colocated:
                self.policy.offload_after_refit()  # move the optimizer off the GPUs before vLLM wakes
            self.generation.prepare_for_generation()
        self.generating = True

    def close_generation(self) -> None:
        if self.generating:
            self.generation.finish_generation()
            self.generating = False

    def to_training(self) -> None:
        """Megatron weights, gradients and optimizer state back on the GPUs (``prepare_for_training``).

        Needed before ``train`` AND before ``save_checkpoint``: a colocated refit (every generation window,
        so every evaluation) ends with ``offload_after_refit`` (nemo_rl/algorithms/grpo.py:1961-1962), and
        NeMo-RL itself always reloads before saving (grpo.py:2886 ``policy.prepare_for_training()`` right
        before ``policy.save_checkpoint``). Phase order: generation window -> close -> logprob inference ->
        training -> save; an evaluation between training and save re-offloads, so save reloads first.
        """
        self.close_generation()
        self.policy.prepare_for_training()
        self.policy_offloaded = False

    def to_inference(self) -> None:
        """The policy's weights on the GPUs for log-probs or a refit (``prepare_for_lp_inference``)."""
        self.policy.prepare_for_lp_inference()
        self.policy_offloaded = False

    def offload_policy(self) -> None:
        """The policy's weights, gradients and optimizer state off the GPUs before the value model loads, as
        NeMo-RL's ppo.py leaves them there (``finish_inference`` after the log-probs, ppo.py:1204; the value
        model trains before the policy is reloaded, :1255-1287): a colocated critic never shares the GPUs
        with the policy's training state (rise_nemo.planner.memory.critic_terms). The next ``to_training``,
        log-prob pass or refit reloads what it needs."""
        self.close_generation()
        self.policy.offload_after_refit()
        self.policy_offloaded = True


class NemoGenerator:
    """``interfaces.Generator``: chat prompts -> n vLLM samples each, with the sampler's log-probs."""

    def __init__(self, session: NemoSession):
        self.session = session
        gen = session.config["policy"]["generation"]
        self.temperature = float(gen["temperature"])
        self.top_p = float(gen["top_p"])
        self.max_new_tokens = int(gen["max_new_tokens"])
        self.chat_template_kwargs = dict(session.config["policy"].get("tokenizer", {}).get("chat_template_kwargs") or {})
        self.pad_id = int(session.tokenizer.pad_token_id)
        stop = gen.get("stop_token_ids") or [session.tokenizer.eos_token_id]
        self.eos_ids = [int(t) for t in stop if t is not None]
        self.max_model_len = int((gen.get("vllm_cfg") or {}).get("max_model_len") or 0) or None
        # NeMo-RL's async engine streams samples (VllmGeneration.generate_async): streaming.NemoRolloutStream
        self.streams = uses_async_engine(gen)
        # vLLM's continuous batching has no per-call random stream: reproducible samples need a seed per request
        self.seeds_per_request = self.streams

    def encode_prompt(self, messages: list[dict]) -> list[int]:
        text = self.session.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )
        return list(self.session.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _check_params(self, params: SamplingParams) -> bool:
        """vLLM's sampling settings are fixed when NeMo-RL builds the engine; returns greedy."""
        if params.temperature == 0:
            return True
        for name, want, got in (("temperature", self.temperature, params.temperature),
                                ("top_p", self.top_p, params.top_p),
                                ("max_new_tokens", self.max_new_tokens, params.max_new_tokens)):
            if abs(float(want) - float(got)) > 1e-9:
                raise ValueError(
                    f"nemo backend: {name}={got} requested, but vLLM was built with {name}={want} "
                    f"(sampling.{name}); evaluation and training must sample with the same settings"
                )
        return False

    def _check_lengths(self, inputs: Sequence[Sequence[int]]) -> None:
        """vLLM rejects a prompt that fills its max_model_len deep inside the worker (NeMo-RL shortens only the
        response budget), killing the step; say which prompt and which key instead."""
        if self.max_model_len is None:
            return
        longest = max(range(len(inputs)), key=lambda i: len(inputs[i]), default=None)
        if longest is not None and len(inputs[longest]) >= self.max_model_len:
            raise ValueError(
                f"nemo backend: prompt {longest} of this batch has {len(inputs[longest])} tokens, no room left in "
                f"nemo.policy.generation.vllm_cfg.max_model_len={self.max_model_len} (raise "
                "nemo.policy.max_total_sequence_length, or shorten the prompts)")

    def decode_response(self, token_ids: Sequence[int]) -> str:
        """Response token ids -> the response text (raw, like the local backend; JudgeRequest applies
        core's judged_text). Also used to locate token spans."""
        return self.session.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def open_stream(self, on_rollout: OnRollout):
        """interfaces.StreamingGenerator, on NeMo-RL's async engine (streaming.NemoRolloutStream)."""
        if not self.streams:
            raise ValueError("nemo backend: streamed generation needs NeMo-RL's async vLLM engine "
                             "(nemo.policy.generation.vllm_cfg.async_engine: true)")
        from rise_nemo.backends.nemo.streaming import NemoRolloutStream

        return NemoRolloutStream(self, on_rollout)

    def generate(self, prompts: Sequence[list[dict]], n: int, params: SamplingParams,
                 prefixes: Sequence[Sequence[int]] | None = None, *,
                 seeds: Sequence[Sequence[int]] | None = None) -> list[list[Rollout]]:
        if prefixes is not None and len(prefixes) != len(prompts):
            raise ValueError(f"generate: {len(prefixes)} prefixes for {len(prompts)} prompts")
        if seeds is not None and (len(seeds) != len(prompts) or any(len(s) != n for s in seeds)):
            raise ValueError(f"generate: seeds must be {len(prompts)} lists of {n} (one per sample)")
        if self.streams:
            return collect_call(self, prompts, n, params, prefixes, seeds)
        if seeds is not None:
            raise ValueError("nemo backend: per-request seeds (sampling.request_seeds) need NeMo-RL's async vLLM "
                             "engine: set nemo.policy.generation.vllm_cfg.async_engine: true")
        greedy = self._check_params(params)
        prompt_ids = [self.encode_prompt(p) for p in prompts]
        # vLLM takes token ids: a given response prefix is simply more context after the generation prompt.
        inputs = [p + [int(t) for t in g] for p, g in zip(prompt_ids, prefixes)] if prefixes else prompt_ids
        self._check_lengths(inputs)
        data = generation_input(inputs, n, self.pad_id)  # input_ids [P*n, L], input_lengths [P*n]
        self.session.open_generation()
        output = self.session.generation.generate(self.session.to_batched(data), greedy=greedy)
        return rollouts_from_generation(
            output, prompts, prompt_ids, n,
            decode=self.decode_response,
            eos_token_ids=self.eos_ids, prefixes=prefixes,
        )


class NemoPolicy:
    """``interfaces.Policy`` on NeMo-RL's Megatron Policy; one ``Policy.train`` call per step."""

    def __init__(self, session: NemoSession, behaviour_ratio: bool):
        self.session = session
        pcfg = session.config["policy"]
        self.behaviour_ratio = behaviour_ratio
        self.micro_batch = int(pcfg["train_micro_batch_size"])
        self.logprob_batch = int(pcfg.get("logprob_batch_size") or self.micro_batch)
        self.seq_multiple = int(pcfg.get("make_sequence_length_divisible_by") or 1)
        self.pad_id = int(session.tokenizer.pad_token_id)
        # Megatron's LR scheduler counts SAMPLES: warmup/decay = iters x train_global_batch_size (Megatron-
        # Bridge's ConfigContainer; NeMo-RL passes policy.train_global_batch_size, megatron/setup.py:1013) and
        # each train() call advances it by the gbs it was given (megatron_policy_worker.py:801-806). Every
        # step is therefore padded to exactly this many rows and trained with gbs = it: one optimiser step
        # and one scheduler iteration per step, whatever the number of guided rows.
        self.global_batch = int(pcfg["train_global_batch_size"])

    @property
    def dp_size(self) -> int:
        return int(self.session.policy.sharding_annotations.get_axis_size("data_parallel"))

    def _logprob_input(self, data: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int, int]:
        b, t = data["input_ids"].shape
        keys = {k: data[k] for k in ("input_ids", "input_lengths", "token_mask", "sample_mask") if k in data}
        keys.setdefault("token_mask", torch.zeros(b, t))
        keys.setdefault("sample_mask", torch.ones(b))
        padded, _ = pad_train_batch(keys, self.dp_size * self.logprob_batch, self.seq_multiple, self.pad_id)
        return padded, b, t

    def get_logprobs(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        self.session.close_generation()
        self.session.to_inference()
        padded, b, t = self._logprob_input(data)
        out = self.session.policy.get_logprobs(self.session.to_batched(padded))["logprobs"]
        return out[:b, :t].float().cpu()  # [B, T], column 0 = 0 (NeMo-RL's convention = ours)

    def reference_logprobs(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        padded, b, t = self._logprob_input(data)
        out = self.session.policy.get_reference_policy_logprobs(self.session.to_batched(padded))
        return out["reference_logprobs"][:b, :t].float().cpu()

    def train(self, data: Mapping[str, torch.Tensor], loss_fn: LossFn) -> dict[str, float]:
        self.session.close_generation()
        check_train_batch(data)
        batch = dict(data)
        if not loss_needs_prev_logprobs(loss_fn) and "prev_logprobs" not in batch:
            # NeMo-RL's train data carries prev/generation log-probs for every loss; one that never reads them
            # (the SFT baseline's NLL) gets zeros instead of a wasted log-prob pass
            batch["prev_logprobs"] = torch.zeros_like(batch["token_mask"], dtype=torch.float32)
        if loss_needs_reference_logprobs(loss_fn) and "reference_policy_logprobs" not in batch:
            self.session.to_inference()
            batch["reference_policy_logprobs"] = self.reference_logprobs(batch)
        train_data, rows = to_nemo_train_batch(
            batch, self.dp_size, self.micro_batch, self.seq_multiple, self.pad_id, self.behaviour_ratio,
            global_batch_size=self.global_batch,
        )
        gbs = train_data["input_ids"].shape[0]  # == global_batch: ONE optimiser step, ONE scheduler iteration
        self.session.to_training()
        self.session.stale = True
        result = self.session.policy.train(
            self.session.to_batched(train_data), RiseLossFunction(loss_fn), gbs=gbs, mbs=self.micro_batch
        )
        metrics = sum_microbatch_metrics(result.get("all_mb_metrics", {}))
        metrics["policy/grad_norm"] = float(result["grad_norm"])
        metrics["nemo/train_rows"] = float(rows)
        metrics["nemo/padded_rows"] = float(gbs - rows)
        gap = natural_sampling_error(batch)
        if gap is not None:
            metrics["nemo/sampler_logprob_abs_err"] = gap
        return metrics

    # -- checkpoints: NeMo-RL writes sharded Megatron weights + optimizer; orchestration calls these hooks
    def save_checkpoint(self, path: str | Path) -> None:
        path = Path(path)
        self.session.to_training()  # weights may be offloaded after an evaluation's refit
        # The checkpointing block only for NeMo-RL's DTensor v2 worker, which refuses to save without it
        # (automodel/checkpoint.py:280-283); lm_policy.py:1067-1084 raises for any other worker when it carries a
        # model_save_format, as NeMo-RL's base config does.
        config = self.session.config
        dtensor = (config.get("policy") or {}).get("dtensor_cfg") or {}
        v2 = bool(dtensor.get("enabled") and dtensor.get("_v2"))
        extra = {"checkpointing_cfg": config.get("checkpointing")} if v2 else {}
        self.session.policy.save_checkpoint(
            weights_path=str(path / "weights"), optimizer_path=str(path / "optimizer"),
            tokenizer_path=str(path / "tokenizer"), **extra,
        )

    def load_checkpoint(self, path: str | Path) -> None:
        """NeMo-RL loads weights and optimizer when the Policy is built; build_backend(checkpoint=) points it
        at the checkpoint the caller resumes from. This hook only verifies that it is this same one."""
        loaded = getattr(self.session, "resumed_from", None)
        if loaded is None or Path(loaded).resolve() != Path(path).resolve():
            raise RuntimeError(
                f"nemo backend: asked to resume from {path}, but the policy was built from {loaded or 'scratch'}; "
                "NeMo-RL loads checkpoints only when the policy is created (restart the run to resume)"
            )


def collect_call(generator: NemoGenerator, prompts: Sequence[list[dict]], n: int, params: SamplingParams,
                 prefixes: Sequence[Sequence[int]] | None, seeds: Sequence[Sequence[int]] | None) -> list[list[Rollout]]:
    """``generate`` on the async engine: one streamed call, waited for. result[i][j] as ``generate``'s."""
    import queue

    done: queue.Queue = queue.Queue()
    stream = generator.open_stream(lambda tag, slot, j, item: done.put((slot, j, item)))
    try:
        call = stream.call("generate", len(prompts), params)
        for i, prompt in enumerate(prompts):
            call.put(i, GenerationRequest(list(prompt), n, tuple(map(int, seeds[i])) if seeds is not None else None,
                                          tuple(map(int, prefixes[i])) if prefixes is not None else ()))
        out: list[list[Rollout | None]] = [[None] * n for _ in prompts]
        for _ in range(len(prompts) * n):  # NeMo-RL bounds each sample's wait (NRL_VLLM_ASYNC_TIMEOUT_SECONDS)
            slot, j, item = done.get()
            if isinstance(item, BaseException):
                raise item
            out[slot][j] = item
    finally:
        stream.close()
    return out  # type: ignore[return-value]


def natural_sampling_error(batch: Mapping[str, torch.Tensor]) -> float | None:
    """Mean |generation_logprobs - prev_logprobs| over natural response tokens (sampler/trainer gap), a
    cheap diagnostic for FP8 rollouts; None when the batch has no natural token."""
    if "generation_logprobs" not in batch or "prev_logprobs" not in batch:
        return None
    mask = batch["token_mask"].bool() & (batch["kind"] == KIND_NATURAL)[:, None]
    if not bool(mask.any()):
        return None
    return float((batch["generation_logprobs"] - batch["prev_logprobs"]).abs()[mask].mean())


__all__ = ["BatchError", "NemoGenerator", "NemoPolicy", "NemoSession", "collect_call", "natural_sampling_error"]
