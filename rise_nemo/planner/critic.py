"""The critic's NeMo-RL ``ValueConfig``, derived from the recipe's policy block: the planner sizes it
(``layout.read_layout``) and the nemo backend builds it (``rise_nemo.backends.nemo.critic``). Plain dicts, no
NeMo-RL import."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

# Keys of NeMo-RL's ValueConfig (nemo_rl/models/value/config.py) taken from the policy's config: the critic
# is the same model family on the same GPUs, with its own optimizer (set in the recipe's nemo.value block).
_SHARED_WITH_POLICY = ("model_name", "tokenizer", "train_global_batch_size", "train_micro_batch_size",
                       "logprob_batch_size", "max_total_sequence_length", "make_sequence_length_divisible_by",
                       "precision", "max_grad_norm", "dynamic_batching", "sequence_packing", "megatron_cfg",
                       "hf_config_overrides")


def _merge(base: dict, override: Mapping[str, Any]) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def value_config(policy: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """NeMo-RL ``ValueConfig`` for the critic: the policy's model, batch shape and Megatron layout, a
    Megatron value worker (no DTensor, no reward-model head), then the recipe's ``nemo.value`` overrides
    (at least the critic's optimizer lr). FP8 training is switched off for the critic unless the
    overrides turn it on: the value head's regression target gains nothing from it."""
    cfg = {k: copy.deepcopy(policy[k]) for k in _SHARED_WITH_POLICY if k in policy}
    cfg["dtensor_cfg"] = {"enabled": False}
    cfg["reward_model_cfg"] = {"enabled": False}
    megatron = cfg.setdefault("megatron_cfg", {})
    megatron["enabled"] = True
    if "fp8_cfg" in megatron:
        megatron["fp8_cfg"] = {**megatron["fp8_cfg"], "enabled": False}
    cfg.setdefault("hf_config_overrides", {})
    return _merge(cfg, overrides or {})
