"""One method registry, one set of loss defaults and rules."""

from __future__ import annotations

import dataclasses

import pytest

from rise_nemo.config import ConfigError, config_from_dict
from rise_nemo.config.schema import RecipeCfg
from rise_nemo.core.losses import ObjectiveConfig
from rise_nemo.methods.registry import METHODS as REGISTRY


def test_schema_methods_come_from_the_registry():
    for name in REGISTRY:
        assert config_from_dict({"method": name}).method == name
    with pytest.raises(ConfigError, match="'method'"):
        config_from_dict({"method": "nope"})


def test_method_defaults_apply_unless_the_recipe_sets_the_key():
    ppo = config_from_dict({"method": "ppo"})
    assert (ppo.policy_loss.kl_coef, ppo.sampling.temperature, ppo.sampling.top_p) == (0.001, 0.8, 0.9)
    assert config_from_dict({"method": "ppo", "policy_loss": {"kl_coef": 0.0}}).policy_loss.kl_coef == 0.0
    rise = config_from_dict({"method": "rise"})
    assert (rise.policy_loss.kl_coef, rise.sampling.temperature, rise.sampling.top_p) == (0.0, 1.0, 1.0)


def test_loss_defaults_and_rules_are_the_objectives():
    cfg = config_from_dict({})
    obj = ObjectiveConfig()
    assert (cfg.policy_loss.clip_low, cfg.policy_loss.clip_high, cfg.policy_loss.kl_coef, cfg.policy_loss.entropy_coef) == (
        obj.clip_low, obj.clip_high, obj.kl_coef, obj.entropy_coef)
    assert (cfg.rise.lambda_guide, cfg.rise.gamma, cfg.rise.a_max) == (obj.lambda_guide, obj.gamma, obj.a_max)
    assert config_from_dict({"rise": {"a_max": 0.0}}).rise.a_max == 0.0  # a_max >= 0 in both places
    ObjectiveConfig(a_max=0.0)
    with pytest.raises(ConfigError, match="rise.a_max"):
        config_from_dict({"rise": {"a_max": -0.1}})
    with pytest.raises(ValueError, match="a_max"):
        ObjectiveConfig(a_max=-0.1)
    with pytest.raises(ConfigError, match="policy_loss.kl_coef"):  # rejected at load, not after the first generation
        config_from_dict({"policy_loss": {"kl_coef": -1.0}})


def test_the_unused_optim_block_is_gone():
    assert "optim" not in {f.name for f in dataclasses.fields(RecipeCfg)}
    with pytest.raises(ConfigError, match="unknown key 'optim'"):
        config_from_dict({"optim": {"lr": 1e-6}})
