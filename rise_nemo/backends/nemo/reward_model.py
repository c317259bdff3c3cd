"""The reward-model reward on the nemo backend: NeMo-RL v0.7.0's own ``RewardModelEnvironment``
(nemo_rl/environments/reward_model_environment.py), created by NeMo-RL's ``create_env("reward_model", ...)``.

Why NeMo-RL's environment and not a served classifier: it is NeMo-RL's maintained Bradley-Terry path (DTensor
``Policy.score`` on a ``reward_model_cfg.reward_model_type: bradley_terry`` model, the same model class its
``rm.yaml`` trains), it runs as a Ray actor on its own virtual cluster next to the training cluster, and it
needs no server, port or HTTP client (docs/methods.md "Reward-model reward").

``reward_model_env_config(recipe)`` maps the recipe's ``reward_model:`` block onto NeMo-RL's
``RewardModelEnvironmentConfig`` keys (pinned by tests/nemo/test_reward_model_env.py against the real class).
The environment asserts DTensor, no dynamic batching, no sequence packing, no CPU offload and
``max_grad_norm: None``; the mapping sets exactly those. Its virtual cluster takes ``reward_model.gpus`` GPUs
that the training cluster does not hold (the HH recipes train on 4 of a node's 8 GPUs).

NeMo-RL imports stay inside ``NemoRewardModel`` (this module is importable without NeMo-RL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rise_nemo.recipe_keys import get

PRECISION = {"float32": "float32", "bfloat16": "bfloat16"}


def reward_model_env_config(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """NeMo-RL's RewardModelEnvironmentConfig (+ the ``tokenizer`` / ``max_model_len`` / ``reward_model_cfg``
    keys its constructor and DTensor worker read) from our ``reward_model:`` block."""
    path = get(recipe, "reward_model.path", None)
    if not path:
        raise ValueError("config key 'reward_model.path': is null; set it to the reward model (hub name or path)")
    batch = int(get(recipe, "reward_model.batch_size", 8, int))
    return {
        "enabled": True,
        "model_name": str(path),
        "tokenizer": {"name": str(path)},
        "precision": PRECISION[str(get(recipe, "reward_model.dtype", "float32", str))],
        "batch_size": batch,
        "checkpoint_path": None,
        "max_model_len": int(get(recipe, "reward_model.max_length", 2048, int)),
        "logprob_batch_size": batch,
        "offload_optimizer_for_logprob": False,
        "resources": {"gpus_per_node": int(get(recipe, "reward_model.gpus", 1, int)), "num_nodes": 1},
        "dtensor_cfg": {"_v2": True, "enabled": True, "sequence_parallel": False, "tensor_parallel_size": 1,
                        "context_parallel_size": 1, "custom_parallel_plan": None, "cpu_offload": False,
                        "activation_checkpointing": False},
        "reward_model_cfg": {"enabled": True, "reward_model_type": "bradley_terry"},
        "dynamic_batching": {"enabled": False},
        "sequence_packing": {"enabled": False},
        "max_grad_norm": None,
    }


class NemoRewardModel:
    """``score(conversations) -> list[float]`` through NeMo-RL's RewardModelEnvironment Ray actor."""

    def __init__(self, recipe: Mapping[str, Any]):
        import ray
        from nemo_rl.environments.utils import create_env

        self._ray = ray
        self.config = reward_model_env_config(recipe)
        self.actor = create_env("reward_model", self.config)
        self.calls = 0
        self.truncated = 0  # NeMo-RL's environment renders and scores; it reports no truncation

    def score(self, conversations: Sequence[Sequence[Mapping[str, str]]]) -> list[float]:
        logs = [[{"role": str(m["role"]), "content": str(m["content"])} for m in c] for c in conversations]
        if not logs:
            return []
        ret = self._ray.get(self.actor.step.remote(logs, [{} for _ in logs]))
        self.calls += len(logs)
        return [float(x) for x in ret.rewards]

    def close(self) -> None:
        try:
            self._ray.get(self.actor.shutdown.remote())
        finally:
            self._ray.kill(self.actor)


def build_reward_model(cfg: Any) -> NemoRewardModel:
    from rise_nemo.backends.nemo import plain_recipe

    return NemoRewardModel(plain_recipe(cfg))
