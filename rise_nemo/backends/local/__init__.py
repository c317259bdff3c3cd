"""Local backend: Hugging Face transformers in one process (CPU, or one CUDA GPU when present).

Usage::

    from rise_nemo.backends.local import build
    policy, generator = build({"tokenizer": "builtin:persistent_task", "lr": 1e-3, "seed": 0})
    rollouts = generator.generate([[{"role": "user", "content": "hi"}]], n=8, params=SamplingParams())
    lp = policy.get_logprobs({"input_ids": ids, "input_lengths": lengths})   # [B, T], col 0 = 0
    metrics = policy.train(batch, loss_fn)      # one AdamW step; summed loss_fn metrics + grad_norm
    state = policy.state_dict(); policy.load_state_dict(state)   # weights + AdamW + sampling RNG
    policy.save_checkpoint(dir); policy.load_checkpoint(dir)     # the same state as <dir>/state.pt

``build(cfg)`` takes the recipe's ``local:`` block (any Mapping, OmegaConf included; the factory's
``build_backend(recipe)`` calls it with ``recipe.local``); its keys and
defaults are documented in ``rise_nemo.backends.local.config`` and unknown keys raise LocalConfigError
naming the key. The policy and generator share one model (``policy.engine is generator.engine``): a
generation after ``train`` samples from the updated weights.

Extras beyond interfaces.Policy / Generator (used by the warm starts, pipeline stages and checkpoints):
``generator.encode_response(text)`` (ids + EOS), ``policy.reset_optimizer(lr=None)``,
``policy.begin_stage(checkpoint=None)``, ``policy.save_pretrained(path)``, ``policy.tokenizer``,
``policy.engine.fingerprint()``.
"""

from __future__ import annotations

from collections.abc import Mapping

from rise_nemo.backends.local.config import LocalConfig, LocalConfigError, parse_local_config
from rise_nemo.backends.local.critic import LocalCritic
from rise_nemo.backends.local.engine import LocalEngine
from rise_nemo.backends.local.generator import LocalGenerator
from rise_nemo.backends.local.policy import LocalPolicy

__all__ = [
    "LocalConfig",
    "LocalConfigError",
    "LocalCritic",
    "LocalEngine",
    "LocalGenerator",
    "LocalPolicy",
    "build",
    "build_backend",
    "build_critic",
    "parse_local_config",
]


def build(cfg: Mapping | LocalConfig | None) -> tuple[LocalPolicy, LocalGenerator]:
    """(policy, generator) sharing one model, from the recipe's ``local:`` block."""
    config = cfg if isinstance(cfg, LocalConfig) else parse_local_config(cfg)
    engine = LocalEngine(config)
    return LocalPolicy(engine), LocalGenerator(engine)


def build_backend(cfg, *, checkpoint=None, train_prompts=None) -> tuple[LocalPolicy, LocalGenerator]:
    """rise_nemo.backends' factory signature: ``build(cfg.local)``. ``checkpoint`` and ``train_prompts`` are
    not needed here (the state is restored by the policy's ``load_checkpoint`` hook)."""
    return build(cfg.local)


def build_critic(cfg, policy: LocalPolicy, *, checkpoint=None) -> LocalCritic:
    """A LocalCritic on the policy's engine (a copy of its body + value head), lr ``ppo.critic_lr``; its
    state is restored by its ``load_checkpoint`` hook."""
    return LocalCritic(policy.engine, lr=float(cfg.ppo.critic_lr))


def build_reward_model(cfg):
    """The recipe's ``reward_model:`` block as a LocalRewardModel (CPU, in this process)."""
    from rise_nemo.backends.local.reward_model import build_reward_model as build

    return build(cfg)
