"""A method is one registered object (rise_nemo.methods): a toy method registered from this file alone trains
through the real CLI path (config validation, build_trainer, Trainer, checkpoint, resume), and nothing outside
the registry decides by a method's name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).parent / "orchestration"))  # tiny_task
from tiny_task import chain_recipe  # noqa: E402

from rise_nemo.cli import main  # noqa: E402
from rise_nemo.loop.trainer import read_metrics, reproducible_metrics  # noqa: E402
from rise_nemo.methods import (  # noqa: E402
    ADVANTAGES,
    HOOKS,
    LOSSES,
    METHODS,
    SCORERS,
    STEPS,
    Method,
    register_advantage,
    register_method,
    unregister_method,
)

REPO = Path(__file__).resolve().parents[1]
TOY = "toy_reinforce"
CALLS: list[dict[str, torch.Tensor]] = []


@register_advantage(TOY)
def toy_reinforce_advantages(ctx, problems, groups, scored, batch):
    """REINFORCE with a batch-mean baseline: A = r - mean(r) over the step's valid rollouts (one per row)."""
    rewards = scored.rewards[scored.valid]
    batch["advantages"] = rewards - rewards.mean()
    CALLS.append({"rewards": rewards.clone(), "advantages": batch["advantages"].clone()})
    return {"toy/baseline": float(rewards.mean())}


@pytest.fixture
def toy_method():
    method = register_method(Method(TOY, "REINFORCE, batch-mean baseline (test)", step="reasoning",
                                     advantage=TOY, defaults={"sampling.temperature": 0.9}))
    CALLS.clear()
    yield method
    unregister_method(TOY)


def _recipe(tmp_path: Path, name: str, method: str = TOY) -> Path:
    tree = chain_recipe(method, tmp_path / name, group_size=3, max_new_tokens=16, steps=2)
    tree["eval"] = {"every": 0, "at_start": False, "samples_per_prompt": 2}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_a_toy_method_registered_here_trains_checkpoints_and_resumes_through_the_cli(tmp_path, toy_method):
    assert main(["train", "--config", str(_recipe(tmp_path, "full"))]) == 0
    full = read_metrics(tmp_path / "full")
    assert [m["step"] for m in full] == [1, 2]
    assert len(CALLS) == 2  # the trainer asked the method for its advantage estimator on every step
    for call, m in zip(CALLS, full):
        assert torch.allclose(call["advantages"], call["rewards"] - call["rewards"].mean())
        assert m["toy/baseline"] == pytest.approx(float(call["rewards"].mean()))
        assert m["loss/pg"] is not None
    config = yaml.safe_load((tmp_path / "full" / "config.yaml").read_text())
    assert config["method"] == TOY and config["sampling"]["temperature"] == 0.9  # the method's own default
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary["method"] == TOY and summary["steps"] == 2

    # Stopped after step 1 (checkpoint), then resumed: the same metrics as the uninterrupted run.
    recipe = _recipe(tmp_path, "resumed")
    assert main(["train", "--config", str(recipe), "--stop-after", "1"]) == 0
    assert [m["step"] for m in read_metrics(tmp_path / "resumed")] == [1]
    assert (tmp_path / "resumed" / "checkpoints").is_dir()
    assert main(["train", "--config", str(recipe)]) == 0
    resumed = read_metrics(tmp_path / "resumed")
    assert [reproducible_metrics(m) for m in resumed] == [reproducible_metrics(m) for m in full]


def test_an_unknown_method_fails_with_one_line_naming_the_key(tmp_path):
    recipe = _recipe(tmp_path, "nope", method="no_such_method")
    out = subprocess.run([sys.executable, "-m", "rise_nemo.cli", "train", "--config", str(recipe)],
                         capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "'method'" in lines[0] and "no_such_method" in lines[0], out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "nope").exists()


def test_every_method_names_registered_behaviour():
    import rise_nemo.loop.trainer  # noqa: F401  (registers the built-in behaviour)

    for method in METHODS.values():
        if method.step is None:
            with pytest.raises(ValueError, match="config key 'method'"):
                method.training_step()
            continue
        assert method.step in STEPS.names(), method
        assert method.loss in LOSSES.names() and method.hooks in HOOKS.names(), method
        if method.step != "sft":  # SFT samples nothing: no scorer, no advantages
            assert method.scorer in SCORERS.names() and method.advantage in ADVANTAGES.names(), method
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        ADVANTAGES.get("nope")


def test_no_method_name_or_family_decisions_outside_the_registry():
    """`git grep` of the acceptance: method names are compared only in rise_nemo/methods.py."""
    # (coupled / uniform are also guide-loss modes, core.losses' token_weighting: not listed)
    pattern = re.compile(r'[!=]= *"(rrl|ppo|grpo|rise|exprl\w*|sft|self_distillation|rubric_rl|ruscarl|opd)"')
    hits = []
    for path in sorted((REPO / "rise_nemo").rglob("*.py")):
        if path.name == "methods.py" and path.parent.name == "rise_nemo":
            continue
        text = path.read_text()
        hits += [f"{path}: {line.strip()}" for line in text.splitlines()
                 if pattern.search(line)]
        hits += [f"{path}: {line.strip()}" for line in text.splitlines() if ".family" in line]
    assert hits == []
