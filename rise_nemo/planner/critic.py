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
    """NeMo-RL ``ValueConfig`` for the critic: the policy's model, batch shape and training backend, then the
    recipe's ``nemo.value`` overrides (at least the critic's learning rate).

    - Megatron policy: a Megatron value worker with the policy's layout (no DTensor, no reward-model head); FP8
      training off unless the overrides turn it on (the value head's regression target gains nothing from it).
    - DTensor policy (``megatron_cfg.enabled: false``): NeMo-RL's DTensor value worker, which exists in v2 only
      (lm_value.py:102-110 refuses ``_v2: false``), with the policy's DTensor layout, optimizer and scheduler
      and the regression head its v2 worker requires (``reward_model_cfg``, as examples/configs/ppo_math_1B.yaml
      sets it)."""
    cfg = {k: copy.deepcopy(policy[k]) for k in _SHARED_WITH_POLICY if k in policy}
    megatron = cfg.setdefault("megatron_cfg", {})
    dtensor = policy.get("dtensor_cfg") or {}
    if not megatron.get("enabled", True) and dtensor.get("enabled", False):
        cfg["dtensor_cfg"] = {**copy.deepcopy(dtensor), "_v2": True}
        cfg["megatron_cfg"] = {"enabled": False}
        cfg["reward_model_cfg"] = {"enabled": True, "reward_model_type": "regression"}
        for key in ("optimizer", "scheduler"):
            if key in policy:
                cfg[key] = copy.deepcopy(policy[key])
    else:
        cfg["dtensor_cfg"] = {"enabled": False}
        cfg["reward_model_cfg"] = {"enabled": False}
        megatron["enabled"] = True
        if "fp8_cfg" in megatron:
            megatron["fp8_cfg"] = {**megatron["fp8_cfg"], "enabled": False}
    cfg.setdefault("hf_config_overrides", {})
    return _merge(cfg, overrides or {})
