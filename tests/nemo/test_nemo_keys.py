"""Every key of NeMo-RL v0.7.0's ``MasterConfig`` (GRPO's, which the nemo backend's own loop builds on, and
distillation's) has a rule in rise_nemo.backends.nemo.keys: READ by a NeMo-RL component the backend builds,
DERIVED from a rise_nemo key, or REFUSED with one line naming it. The walk reads NeMo-RL's own config classes
(pydantic models and TypedDicts), so a key NeMo-RL adds shows up here unclassified."""

from __future__ import annotations

import copy
import types
import typing

import pytest
from nemo_venv import import_nemo_rl

pytestmark = pytest.mark.nemo
import_nemo_rl()


def _members(t):
    """The config classes inside an annotation (Optional / Union / NotRequired / Required / Annotated unwrapped)."""
    import typing_extensions as te

    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(t) for m in _members(a)]
    if origin in (te.NotRequired, te.Required, typing.Annotated, typing.NotRequired, typing.Required):
        return _members(typing.get_args(t)[0])
    if isinstance(t, type) and (hasattr(t, "__total__") or hasattr(t, "model_fields")):
        return [t]
    return []


def _fields(cls) -> dict:
    import typing_extensions as te

    if hasattr(cls, "model_fields"):  # pydantic
        return {name: f.annotation for name, f in cls.model_fields.items()}
    return te.get_type_hints(cls)


def master_config_keys(master_cls) -> list[str]:
    """Dotted leaf keys of a NeMo-RL MasterConfig (a subtree typed ``dict`` / ``list`` / scalar is one leaf)."""
    out: list[str] = []

    def walk(annotation, prefix: str, seen: tuple) -> None:
        classes = [c for c in _members(annotation) if c not in seen]
        if not classes:
            out.append(prefix)
            return
        for cls in classes:
            for name, sub in _fields(cls).items():
                walk(sub, f"{prefix}.{name}" if prefix else name, seen + (cls,))

    walk(master_cls, "", ())
    return sorted(set(out))


@pytest.fixture(scope="module")
def masters():
    from nemo_rl.algorithms import distillation, grpo

    return {"grpo": master_config_keys(grpo.MasterConfig), "distillation": master_config_keys(distillation.MasterConfig)}


def test_the_walk_sees_nemo_rl_s_whole_tree(masters):
    for algo, keys in masters.items():
        assert len(keys) > 300, (algo, len(keys))
        assert "policy.megatron_cfg.tensor_model_parallel_size" in keys and "cluster.gpus_per_node" in keys
    assert "loss_fn.ratio_clip_max" in masters["grpo"] and "grpo.normalize_rewards" in masters["grpo"]
    assert "teacher.model_name" in masters["distillation"] and "loss_fn.kl_type" in masters["distillation"]


@pytest.mark.parametrize("algo", ["grpo", "distillation"])
def test_every_master_config_key_is_read_derived_or_refused(masters, algo):
    from rise_nemo.backends.nemo.keys import READ, REFUSED, UNKNOWN, classify

    unclassified = [k for k in masters[algo] if classify(algo, k) is UNKNOWN]
    assert unclassified == []
    kinds = {k: classify(algo, k).kind for k in masters[algo]}
    assert all(classify(algo, k).why for k in masters[algo])  # each rule names its reader or its reason
    # the paths that decide what trains are read; what only NeMo-RL's own GRPO loop reads is refused
    assert kinds["policy.megatron_cfg.tensor_model_parallel_size"] == READ
    if algo == "grpo":
        assert kinds["grpo.normalize_rewards"] == REFUSED and kinds["loss_fn.token_level_loss"] == REFUSED
        assert kinds["logger.wandb.project"] == REFUSED


@pytest.mark.parametrize("algo, recipe", [("grpo", "rise_14b.yaml"), ("distillation", "opd_14b_teacher32b.yaml")])
def test_each_refused_or_derived_key_is_refused_in_one_line_naming_it(masters, algo, recipe):
    """Set under a real recipe's nemo: block, every key NeMo-RL defines that nothing on this path reads (or
    that rise_nemo writes) stops validation with one line naming that key."""
    from pathlib import Path

    import yaml

    from rise_nemo.backends.nemo.config import NemoConfigError, validate_nemo_block
    from rise_nemo.backends.nemo.keys import READ, classify

    base = yaml.safe_load((Path(__file__).resolve().parents[2] / "recipes" / recipe).read_text())
    checked = 0
    for key in masters[algo]:
        if classify(algo, key).kind == READ:
            continue
        tree = copy.deepcopy(base)
        node = tree["nemo"]
        for part in key.split(".")[:-1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[key.rsplit(".", 1)[-1]] = 1
        with pytest.raises(NemoConfigError) as err:
            validate_nemo_block(tree)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"recipe key nemo.{key}"), (key, message)
        checked += 1
    assert checked > 50, checked
