"""Fixtures: the tiny rubric task (tiny_task.py) on a random-init tiny Qwen3, one thread."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tiny_task

import tiny_task  # noqa: E402

from rise_nemo.backends import build_backend  # noqa: E402
from rise_nemo.config import config_from_dict  # noqa: E402
from rise_nemo.judges import build_judge  # noqa: E402
from rise_nemo.loop.trainer import Trainer  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> Path:
    return tiny_task.build_tokenizer(tmp_path_factory.mktemp("tiny_tok"))


@pytest.fixture
def make_trainer(tiny_tokenizer):
    """make_trainer(run_dir, method="rise", overrides=(), stop_after=None, wrap=None) -> Trainer.

    ``wrap(policy, generator, judge) -> (policy, generator, judge)`` lets a test observe the real
    components (recording wrappers that delegate every call)."""

    def factory(run_dir, method="rise", overrides=(), stop_after=None, wrap=None, **recipe_over):
        cfg = config_from_dict(tiny_task.recipe(tiny_tokenizer, run_dir, method, **recipe_over), overrides)
        policy, generator = build_backend(cfg)
        judge = build_judge(cfg.judge)
        if wrap is not None:
            policy, generator, judge = wrap(policy, generator, judge)
        return Trainer(cfg, policy, generator, judge, tiny_task.make_prompts(6), tiny_task.make_prompts(3, 6),
                       stop_after=stop_after)

    return factory
