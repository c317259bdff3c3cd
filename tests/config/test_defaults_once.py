"""Each default is stated once, in the recipe schema (or the one table it reads): the core objects the
orchestration builds from a recipe take every setting explicitly, so no default of theirs can disagree with
the schema's (RISE-RL's retention masks once did: schema on, core off)."""

from __future__ import annotations

import dataclasses
import inspect

from rise_nemo.config import config_from_dict
from rise_nemo.config.schema import RecipeCfg
from rise_nemo.core.guidance import GuidanceOptions
from rise_nemo.core.loss_defaults import LOSS_DEFAULTS
from rise_nemo.core.losses import clipped_pg_loss, guide_loss
from rise_nemo.core.replay import ReplayBuffer, ValueStabilisation
from rise_nemo.core.schedule import GuidanceSchedule
from rise_nemo.judges.client import RetryPolicy
from rise_nemo.judges.http import HttpJudgeConfig
from rise_nemo.judges.ray_actor import RayJudge
from rise_nemo.methods.registry import DEFAULT_METHOD


def _dataclass_defaults(cls, names=None) -> dict:
    return {f.name: f.default for f in dataclasses.fields(cls)
            if (names is None or f.name in names)
            and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)}


def _signature_defaults(fn, names) -> dict:
    params = inspect.signature(fn).parameters
    return {n: params[n].default for n in names if params[n].default is not inspect.Parameter.empty}


def test_core_objects_built_from_a_recipe_have_no_defaults_of_their_own():
    assert _dataclass_defaults(GuidanceOptions) == {}  # rise.retention / rise.gate
    assert _signature_defaults(GuidanceSchedule.__init__, ("lambda0", "mode", "s_switch", "ema", "tol", "patience",
                                                           "min_steps", "floor")) == {}  # rise.schedule
    assert _dataclass_defaults(ValueStabilisation, ("window", "tolerance", "max_steps", "ema")) == {}  # rrl.stabilise
    assert _dataclass_defaults(ReplayBuffer, ("capacity",)) == {}  # rrl.capacity
    assert _signature_defaults(RayJudge.__init__, ("num_cpus", "timeout_s", "start_timeout_s")) == {}  # judge.ray_*


def test_loss_defaults_are_the_one_table_the_schema_reads():
    cfg = config_from_dict({})
    assert _signature_defaults(clipped_pg_loss, ("clip_low", "clip_high")) == {
        "clip_low": LOSS_DEFAULTS["clip_low"], "clip_high": LOSS_DEFAULTS["clip_high"]}
    assert (cfg.policy_loss.clip_low, cfg.policy_loss.clip_high) == (LOSS_DEFAULTS["clip_low"], LOSS_DEFAULTS["clip_high"])
    assert _signature_defaults(guide_loss, ("gamma", "a_max")) == {"gamma": LOSS_DEFAULTS["gamma"],
                                                                    "a_max": LOSS_DEFAULTS["a_max"]}
    assert (cfg.rise.gamma, cfg.rise.a_max) == (LOSS_DEFAULTS["gamma"], LOSS_DEFAULTS["a_max"])


def test_judge_retry_defaults_are_the_retry_policys():
    policy = HttpJudgeConfig(base_urls=("http://127.0.0.1:1",), model="m").retry_policy()
    assert policy == RetryPolicy()


def test_the_default_method_is_stated_once():
    assert _dataclass_defaults(RecipeCfg, ("method",)) == {"method": DEFAULT_METHOD}
    assert config_from_dict({}).method == DEFAULT_METHOD
