"""The rubric environment as a NeMo-RL Ray actor. Imports nemo_rl and ray: import this module only where
NeMo-RL is installed (``register_rubric_environment`` does it for you).

NeMo-RL creates environments with ``create_env(name, env_config)``, which looks the actor class up by the
name given to ``register_env`` and its Python executable in ``ACTOR_ENVIRONMENT_REGISTRY``, then calls
``Actor.options(runtime_env=...).remote(env_config)``. ``env_config`` here is the judge block of a recipe
(``{"type": "rule"}`` or an HTTP judge config) plus an optional ``reward_clip_min``.
"""

from __future__ import annotations

from typing import Any

import ray
from nemo_rl.distributed.batched_data_dict import BatchedDataDict
from nemo_rl.environments.interfaces import EnvironmentInterface, EnvironmentReturn

from rise_nemo.backends.nemo.environment import RubricEnvironmentCore
from rise_nemo.judges import build_judge

ACTOR_FQN = "rise_nemo.backends.nemo.env_actor.RubricJudgeEnvironment"


class RubricJudgeEnvironmentImpl(EnvironmentInterface):
    """Plain class (testable without a Ray cluster); ``RubricJudgeEnvironment`` is its Ray actor."""

    def __init__(self, env_config: dict[str, Any]):
        cfg = dict(env_config or {})
        clip_min = cfg.pop("reward_clip_min", None)
        cfg.pop("num_workers", None)  # NeMo-RL env configs often carry it; the judge manages its own concurrency
        self.core = RubricEnvironmentCore(build_judge(cfg or {"type": "rule"}), clip_min)

    def step(self, message_log_batch, metadata) -> EnvironmentReturn:
        observations, meta, stops, rewards, terminateds, answers = self.core.step(message_log_batch, metadata)
        return EnvironmentReturn(observations, meta, stops, rewards, terminateds, answers)

    def global_post_process_and_metrics(self, batch: BatchedDataDict) -> tuple[BatchedDataDict, dict]:
        rewards = batch["rewards"] if batch["rewards"].ndim == 1 else batch["rewards"][:, 0]
        return batch, self.core.batch_metrics(rewards)

    def shutdown(self) -> None:
        close = getattr(self.core.judge, "close", None)
        if callable(close):
            close()


RubricJudgeEnvironment = ray.remote(max_restarts=-1, max_task_retries=-1, max_concurrency=16)(
    RubricJudgeEnvironmentImpl
)


def register(name: str = "rubric") -> str:
    """Register the actor with NeMo-RL under ``name`` (idempotent); returns the actor's FQN."""
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments.utils import ENV_REGISTRY, register_env

    # The judge needs only rise_nemo's own dependencies: the container's system Python suffices.
    ACTOR_ENVIRONMENT_REGISTRY.setdefault(ACTOR_FQN, PY_EXECUTABLES.SYSTEM)
    if name not in ENV_REGISTRY:
        register_env(name, ACTOR_FQN)
    elif ENV_REGISTRY[name]["actor_class_fqn"] != ACTOR_FQN:
        raise ValueError(f"NeMo-RL environment name {name!r} is already registered to {ENV_REGISTRY[name]}")
    return ACTOR_FQN
