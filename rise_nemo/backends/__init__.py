"""Backend factory: ``build_backend(cfg) -> (Policy, Generator)`` dispatching on ``cfg.backend``.

Backends are imported lazily so that choosing ``local`` never imports NeMo-RL and choosing ``nemo``
never needs transformers' tiny-model helpers. Each backend module exposes ``build(cfg)`` taking the
recipe's own block for ``local`` (``build(cfg.local)``, see rise_nemo.backends.local) and the whole
validated recipe for ``nemo`` (it needs ``nemo`` plus ``grpo``/``run``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from rise_nemo.interfaces import Critic, Generator, Policy
from rise_nemo.orchestration.checkpoint import RISE_NEMO_LAYOUT, CheckpointLayout

BACKEND_MODULES: dict[str, str] = {
    "local": "rise_nemo.backends.local",
    "nemo": "rise_nemo.backends.nemo",
}


def require_backend_extras(name: str) -> None:
    """`pip install rise_nemo` alone has no transformers: a missing extra is a UserError naming it."""
    if name == "local":
        from rise_nemo.errors import require_extra

        require_extra("local", "transformers", "tokenizers", "safetensors", what="the local backend")


def build_backend(cfg: Any, checkpoint: Path | None = None) -> tuple[Policy, Generator]:
    """``checkpoint``: the one the caller will restore (a resume's latest, `rise-nemo eval --checkpoint`),
    None for the initial policy. The nemo backend is BUILT from it (NeMo-RL loads weights only when a
    Policy is created); the local backend builds the initial model and is restored afterwards through
    ``CheckpointLayout.load`` / ``orchestration.checkpoint.load_checkpoint``."""
    name = cfg.backend
    if name not in BACKEND_MODULES:
        raise ValueError(f"config key 'backend': unknown backend {name!r}; expected one of {sorted(BACKEND_MODULES)}")
    require_backend_extras(name)
    module = importlib.import_module(BACKEND_MODULES[name])
    build = getattr(module, "build", None)
    if build is None:
        raise ImportError(f"{BACKEND_MODULES[name]} does not define build(cfg)")
    policy, generator = build(cfg.local) if name == "local" else build(cfg, checkpoint=checkpoint)
    return policy, generator


def checkpoint_layout(cfg: Any) -> CheckpointLayout:
    """Where a run of this recipe keeps its checkpoints: rise_nemo's own, except the nemo backend's
    on-policy distillation, which NeMo-RL's loop checkpoints (rise_nemo.backends.nemo.checkpoints)."""
    if cfg.backend == "nemo":
        from rise_nemo.backends.nemo import plain_recipe
        from rise_nemo.backends.nemo.checkpoints import checkpoint_layout as nemo_layout

        return nemo_layout(plain_recipe(cfg))
    return RISE_NEMO_LAYOUT


def build_critic(cfg: Any, policy: Policy) -> Critic:
    """The value model of PPO-family methods for ``cfg.backend``: the backend module's
    ``build_critic(cfg, policy)`` (local: rise_nemo.backends.local.LocalCritic, settings in ``ppo``)."""
    name = cfg.backend
    module = importlib.import_module(BACKEND_MODULES[name])
    build = getattr(module, "build_critic", None)
    if build is None:
        raise NotImplementedError(f"backend {name!r} provides no critic yet (method {cfg.method!r} needs one)")
    return build(cfg, policy)
