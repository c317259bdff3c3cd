"""Our ``reward_model:`` block mapped onto NeMo-RL v0.7.0's RewardModelEnvironment config, pinned against NeMo-RL's
own classes (skipped unless ``nemo_rl`` is importable; ``make test-nemo`` runs it).

- every key we write is one NeMo-RL declares (``RewardModelEnvironmentConfig``, the ``PolicyConfig`` the
  environment hands its ``Policy``) or one its own example (examples/configs/grpo_rm_1B.yaml
  ``env.reward_model``) sets; every key that example sets, we set; a required key is missing only where
  that example leaves it out too;
- the nested blocks match ``DTensorConfig`` / ``RewardModelConfig`` / ``TokenizerConfig``;
- the values satisfy the assertions of ``RewardModelEnvironment.__init__`` (Bradley-Terry, DTensor, no
  dynamic batching / sequence packing / CPU offload / activation checkpointing, ``max_grad_norm`` None);
- ``create_env("reward_model", ...)`` resolves to that class.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from nemo_venv import import_nemo_rl  # noqa: E402

nemo_rl = import_nemo_rl()
pytestmark = pytest.mark.nemo

from rise_nemo.backends.nemo.reward_model import reward_model_env_config  # noqa: E402

RECIPE = {"reward_model": {"path": "Skywork/Skywork-Reward-V2-Qwen3-0.6B", "dtype": "bfloat16", "batch_size": 4,
                           "max_length": 2048, "gpus": 1}}


def _annotations(cls) -> set[str]:
    out: set[str] = set()
    for klass in reversed(cls.__mro__):
        out |= set(getattr(klass, "__annotations__", {}))
    return out


def _example_env_block() -> dict:
    root = Path(os.environ.get("NEMO_RL_DIR") or Path(nemo_rl.__file__).resolve().parents[1])
    example = yaml.safe_load((root / "examples" / "configs" / "grpo_rm_1B.yaml").read_text())
    return example["env"]["reward_model"]


def test_keys_are_nemo_rls():
    from nemo_rl.environments.reward_model_environment import RewardModelEnvironmentConfig
    from nemo_rl.models.policy import DTensorConfig, PolicyConfig, RewardModelConfig, TokenizerConfig

    env = reward_model_env_config(RECIPE)
    example = {k for k in _example_env_block() if k != "processor"}  # the data processor is the task's, not ours
    declared = _annotations(RewardModelEnvironmentConfig) | _annotations(PolicyConfig)
    assert set(env) <= declared | example, set(env) - declared - example
    assert example <= set(env), example - set(env)
    # Required keys we leave out are exactly those NeMo-RL's own example leaves out (``generation``: no vLLM).
    required = set(getattr(RewardModelEnvironmentConfig, "__required_keys__", ()))
    assert required - set(env) <= required - set(_example_env_block()), required - set(env)
    assert set(env["dtensor_cfg"]) <= _annotations(DTensorConfig)
    assert set(getattr(DTensorConfig, "__required_keys__", ())) <= set(env["dtensor_cfg"])
    assert set(env["reward_model_cfg"]) == _annotations(RewardModelConfig)
    assert set(env["tokenizer"]) <= _annotations(TokenizerConfig)


def test_values_pass_the_environments_assertions():
    env = reward_model_env_config(RECIPE)
    assert env["reward_model_cfg"] == {"enabled": True, "reward_model_type": "bradley_terry"}
    assert not env["dynamic_batching"]["enabled"] and not env["sequence_packing"]["enabled"]
    d = env["dtensor_cfg"]
    assert d["enabled"] and not d["cpu_offload"] and not d["activation_checkpointing"]
    assert env["max_grad_norm"] is None
    assert env["resources"] == {"gpus_per_node": 1, "num_nodes": 1}
    assert (env["model_name"], env["tokenizer"]["name"], env["precision"], env["max_model_len"]) == (
        RECIPE["reward_model"]["path"], RECIPE["reward_model"]["path"], "bfloat16", 2048)


def test_create_env_resolves_to_nemo_rls_reward_model_environment():
    from nemo_rl.environments.utils import ENV_REGISTRY

    assert ENV_REGISTRY["reward_model"]["actor_class_fqn"] == (
        "nemo_rl.environments.reward_model_environment.RewardModelEnvironment")
