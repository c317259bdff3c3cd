"""Contracts between the layers (docs/CONTRACTS.md): checkpoint hooks declared by the interfaces, one factory
signature for both backends. The layers' import directions are tests/test_layers.py's."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

from rise_nemo.interfaces import Critic, Policy
from rise_nemo.loop import checkpoint as ckpt

PACKAGE = Path(__file__).resolve().parents[1] / "rise_nemo"


# -- checkpoint hooks ----------------------------------------------------------------------------------------

def test_interfaces_declare_directory_checkpoint_hooks_and_no_state_dict():
    for proto in (Policy, Critic):
        for hook in ("save_checkpoint", "load_checkpoint"):
            assert list(inspect.signature(getattr(proto, hook)).parameters) == ["self", "path"], (proto, hook)
        assert not hasattr(proto, "state_dict") and not hasattr(proto, "load_state_dict")


def test_no_backend_stubs_a_hook_with_not_implemented():
    stubs = [str(p.relative_to(PACKAGE.parent)) for p in sorted((PACKAGE / "backends").rglob("*.py"))
             if "NotImplementedError" in p.read_text()]
    assert stubs == []


def test_backends_implement_the_hooks():
    from rise_nemo.backends.local import LocalCritic, LocalPolicy
    from rise_nemo.backends.nemo.critic import NemoCritic
    from rise_nemo.backends.nemo.runtime import NemoPolicy

    for cls in (LocalPolicy, LocalCritic, NemoPolicy, NemoCritic):
        for hook in ("save_checkpoint", "load_checkpoint"):
            assert hook in vars(cls), (cls.__name__, hook)


class HookOnly:
    """A model that knows nothing but the interfaces' hooks (no state_dict): what it saves, it reloads."""

    def __init__(self, value: float):
        self.value, self.saved_to, self.loaded_from = value, None, None

    def save_checkpoint(self, path: Path) -> None:
        self.saved_to = Path(path)
        self.saved_to.mkdir()
        torch.save({"value": self.value}, self.saved_to / "mine.pt")

    def load_checkpoint(self, path: Path) -> None:
        self.loaded_from = Path(path)
        self.value = torch.load(self.loaded_from / "mine.pt")["value"]


def test_orchestration_checkpoints_policy_and_critic_through_their_hooks(tmp_path):
    policy, critic = HookOnly(1.0), HookOnly(2.0)
    final = ckpt.save_checkpoint(tmp_path, 3, policy, {"step": 3}, critic=critic)
    assert policy.saved_to.name == "policy" and critic.saved_to.name == "critic"  # hooks got their own dirs
    assert (final / "policy" / "mine.pt").is_file() and (final / "critic" / "mine.pt").is_file()
    fresh_policy, fresh_critic = HookOnly(0.0), HookOnly(0.0)
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path), fresh_policy, critic=fresh_critic)
    assert state == {"step": 3} and (fresh_policy.value, fresh_critic.value) == (1.0, 2.0)
    assert fresh_critic.loaded_from == final / "critic"


def test_a_checkpoint_without_the_critic_says_so(tmp_path):
    ckpt.save_checkpoint(tmp_path, 1, HookOnly(1.0), {"step": 1})
    from rise_nemo.backends.local.policy import load_state

    class LocalLike(HookOnly):
        def load_checkpoint(self, path):
            load_state(path)

    with pytest.raises(FileNotFoundError, match="trains a critic but the checkpoint has none"):
        ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path), HookOnly(0.0), critic=LocalLike(0.0))


# -- one factory signature ----------------------------------------------------------------------------------

def test_both_backends_share_the_factory_signature():
    import rise_nemo.backends as factory
    import rise_nemo.backends.local as local
    import rise_nemo.backends.nemo as nemo

    for name in ("build_backend", "build_critic"):
        want = inspect.signature(getattr(factory, name)).parameters
        for module in (local, nemo):
            got = inspect.signature(getattr(module, name)).parameters
            assert [(p.name, p.kind) for p in got.values()] == [(p.name, p.kind) for p in want.values()], (
                module.__name__, name)


def test_factory_hands_the_whole_recipe_and_the_resume_checkpoint_to_the_backend(monkeypatch, tmp_path):
    import sys
    import types

    import rise_nemo.backends as factory

    seen = {}
    fake = types.ModuleType("fake_backend")
    fake.build_backend = lambda cfg, *, checkpoint=None, train_prompts=None: seen.update(
        backend=(cfg, checkpoint, train_prompts)) or ("policy", "generator")
    fake.build_critic = lambda cfg, policy, *, checkpoint=None: seen.update(critic=(cfg, policy, checkpoint)) or "critic"
    monkeypatch.setitem(sys.modules, "fake_backend", fake)
    monkeypatch.setitem(factory.BACKEND_MODULES, "fake", "fake_backend")
    cfg = types.SimpleNamespace(backend="fake")
    assert factory.build_backend(cfg, checkpoint=tmp_path, train_prompts=["p"]) == ("policy", "generator")
    assert factory.build_critic(cfg, "policy", checkpoint=tmp_path) == "critic"
    assert seen == {"backend": (cfg, tmp_path, ["p"]), "critic": (cfg, "policy", tmp_path)}
