"""Backend factory: ``build_backend(cfg) -> (Policy, Generator)`` and ``build_critic(cfg, policy) -> Critic``,
dispatching on ``cfg.backend``.

Backends are imported lazily so that choosing ``local`` never imports NeMo-RL and choosing ``nemo``
never needs transformers' tiny-model helpers. Every backend module exposes the same two functions, taking
the whole validated recipe:

    build_backend(cfg, *, checkpoint=None, train_prompts=None) -> (Policy, Generator)
    build_critic(cfg, policy, *, checkpoint=None) -> Critic

``checkpoint`` is the run's checkpoint directory the caller will resume from (or evaluate): a backend
that can load weights only when it builds its model (NeMo-RL) loads them there; the caller then calls the
models' ``load_checkpoint`` hooks either way. ``train_prompts`` is the training set (NeMo-RL's setup
wants a dataset). The caller -- the orchestration -- supplies both: no backend imports it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: `rise-nemo plan` validates nemo: blocks here without importing torch
    from rise_nemo.interfaces import Critic, Generator, Policy

BACKEND_MODULES: dict[str, str] = {
    "local": "rise_nemo.backends.local",
    "nemo": "rise_nemo.backends.nemo",
}


def require_backend_extras(name: str) -> None:
    """`pip install rise_nemo` alone has no transformers: a missing extra is a UserError naming it."""
    if name == "local":
        from rise_nemo.errors import require_extra

        require_extra("local", "transformers", "tokenizers", "safetensors", what="the local backend")


def nemo_rl_missing(exc: ImportError) -> Exception:
    """NeMo-RL is never a pip dependency: its ImportError (the first thing the nemo backend's build does) as
    a one-line UserError naming what to install and ``$NEMO_RL_DIR``."""
    from rise_nemo.errors import UserError

    cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
    reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    where = os.environ.get("NEMO_RL_DIR")
    where = f"NEMO_RL_DIR={where}" if where else "NEMO_RL_DIR is unset; the container's is /opt/nemo-rl"
    return UserError(
        f"backend: nemo needs NeMo-RL v0.7.0, which this Python cannot import ({reason}): run inside the "
        f"NeMo-RL container, or install a NeMo-RL v0.7.0 checkout and its dependencies "
        f"(pip install -e \"$NEMO_RL_DIR\"; {where}); `rise-nemo plan` checks a recipe without it"
    )


def backend_module(cfg: Any) -> ModuleType:
    """The module of ``cfg.backend`` (its extras checked first)."""
    name = cfg.backend
    if name not in BACKEND_MODULES:
        raise ValueError(f"config key 'backend': unknown backend {name!r}; expected one of {sorted(BACKEND_MODULES)}")
    require_backend_extras(name)
    return importlib.import_module(BACKEND_MODULES[name])


def build_backend(cfg: Any, *, checkpoint: str | Path | None = None,
                  train_prompts: Sequence[Any] | None = None) -> tuple[Policy, Generator]:
    module = backend_module(cfg)
    try:
        policy, generator = module.build_backend(cfg, checkpoint=checkpoint, train_prompts=train_prompts)
    except ImportError as exc:
        if cfg.backend != "nemo":
            raise
        raise nemo_rl_missing(exc) from None
    return policy, generator


def build_critic(cfg: Any, policy: Policy, *, checkpoint: str | Path | None = None) -> Critic:
    """The value model of PPO-family methods (local: a LocalCritic on the policy's body, lr ``ppo.critic_lr``;
    nemo: NeMo-RL's ``Value`` from the recipe's ``nemo.value`` block)."""
    return backend_module(cfg).build_critic(cfg, policy, checkpoint=checkpoint)


def build_reward_model(cfg: Any) -> Any:
    """The Bradley-Terry reward model of the recipe's ``reward_model:`` block (interfaces.RewardModel): local,
    a sequence classifier on CPU in this process (backends.local.reward_model); nemo, NeMo-RL's
    RewardModelEnvironment actor (backends.nemo.reward_model)."""
    module = backend_module(cfg)
    try:
        return module.build_reward_model(cfg)
    except ImportError as exc:
        if cfg.backend != "nemo":
            raise
        raise nemo_rl_missing(exc) from None
