"""A method is one registered object (rise_nemo.methods): a toy method registered from this file alone trains
through the real CLI path (config validation, build_trainer, Trainer, checkpoint, resume); a method added as
ONE new file in rise_nemo/methods/ (and nothing else) trains through the CLI; every pairing of a method with a
piece or data of another step kind is refused when the config is loaded, in one line naming the key; and
nothing outside the registry decides by a method's name."""

from __future__ import annotations

import json
import os
import re
import shutil
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
from rise_nemo.methods.registry import (  # noqa: E402
    METHODS,
    REASONING,
    STEP_KINDS,
    ExternalMethod,
    ReasoningMethod,
    register_method,
    unregister_method,
)

REPO = Path(__file__).resolve().parents[1]
TOY = "toy_reinforce"
CALLS: list[dict[str, torch.Tensor]] = []


@REASONING.advantages.register(TOY, "REINFORCE with a batch-mean baseline (test)")
def toy_reinforce_advantages(ctx, problems, groups, scored, batch):
    """REINFORCE with a batch-mean baseline: A = r - mean(r) over the step's valid rollouts (one per row)."""
    rewards = scored.rewards[scored.valid]
    batch["advantages"] = rewards - rewards.mean()
    CALLS.append({"rewards": rewards.clone(), "advantages": batch["advantages"].clone()})
    return {"toy/baseline": float(rewards.mean())}


@pytest.fixture
def toy_method():
    method = register_method(ReasoningMethod(TOY, "REINFORCE, batch-mean baseline (test)", advantage=TOY,
                                             defaults={"sampling.temperature": 0.9}))
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


def test_every_method_names_behaviour_of_its_own_step_kind():
    import rise_nemo.loop.trainer  # noqa: F401  (imports the steps, which implement the declared pieces)

    for kind in STEP_KINDS:  # every declared piece is implemented, every step kind has its step object
        kind.step()
        for registry in (kind.scorers, kind.advantages, kind.hooks):
            for name in registry.names():
                registry.impl(name)
    for method in METHODS.values():
        if isinstance(method, ExternalMethod):
            with pytest.raises(ValueError, match="config key 'method'"):
                method.training_step()
            continue
        method.check_recipe({})  # its pieces are its step kind's and fit together
        assert method.training_step() is method.kind.step()
    assert METHODS["ppo"].critic and METHODS["rrl"].critic and not METHODS["grpo"].critic  # derived from GAE
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope' of the reasoning step"):
        REASONING.advantages.get("nope")


NEW_METHOD_FILE = '''"""REINFORCE with a batch-mean baseline: one file, the whole method (a test writes it)."""

from rise_nemo.methods.registry import REASONING, ReasoningMethod, register_method


@REASONING.advantages.register("file_reinforce", "A = r - mean(r) over the step's valid rollouts")
def file_reinforce_advantages(ctx, problems, groups, scored, batch):
    rewards = scored.rewards[scored.valid]
    batch["advantages"] = rewards - rewards.mean()
    return {"file_reinforce/baseline": float(rewards.mean())}


register_method(ReasoningMethod("file_reinforce", "REINFORCE, batch-mean baseline (one file)",
                                advantage="file_reinforce", defaults={"sampling.temperature": 0.9}))
'''


def test_a_method_added_as_one_new_file_in_methods_trains_through_the_cli(tmp_path):
    """A copy of the package with ONE file added to rise_nemo/methods/ and nothing else changed: `rise-nemo
    train` knows the method (config validation, its default), trains it, checkpoints and writes its metric."""
    copy = tmp_path / "src"
    shutil.copytree(REPO / "rise_nemo", copy / "rise_nemo", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "rise_nemo" / "methods" / "file_reinforce.py").write_text(NEW_METHOD_FILE)
    recipe = _recipe(tmp_path, "run", method="file_reinforce")
    env = {**os.environ, "PYTHONPATH": str(copy), "RISE_NEMO_RECIPES": str(REPO / "recipes")}
    out = subprocess.run([sys.executable, "-m", "rise_nemo.cli", "train", "--config", str(recipe)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2] and all("file_reinforce/baseline" in m for m in metrics)
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["method"] == "file_reinforce" and config["sampling"]["temperature"] == 0.9
    assert (tmp_path / "run" / "checkpoints" / "latest").is_file()
    assert not (REPO / "rise_nemo" / "methods" / "file_reinforce.py").exists()  # the checkout is untouched


# Every way a recipe can pair a method with what another step kind owns: (method, override, key named, words).
CROSS_KIND = [
    ("grpo", "reward.scorer=rubric_judge", "reward.scorer", "'rubric_judge' scores the rubric step"),
    ("ppo", "reward.scorer=no_such", "reward.scorer", "unknown scorer 'no_such'"),
    ("exprl_process", "reward.scorer=verifier", "reward.scorer", "needs per-token advantages"),
    ("rise", "reward.scorer=verifier", "reward.scorer", "runs the rubric step"),
    ("rubric_rl", "reward.scorer=rubric_judge", "reward.scorer", "runs the rubric step"),
    ("sft", "reward.scorer=verifier", "reward.scorer", "runs the sft step"),
    ("opd", "reward.scorer=verifier", "reward.scorer", "takes no scorer"),
]


@pytest.mark.parametrize("method, override, key, words", CROSS_KIND)
def test_a_cross_kind_pairing_is_refused_when_the_config_loads(method, override, key, words):
    from rise_nemo.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError) as exc:
        config_from_dict({"method": method}, [override])
    message = str(exc.value)
    assert "\n" not in message and f"key {key!r}" in message and words in message, message


def test_a_method_naming_a_piece_of_another_kind_is_refused_at_config_time():
    from rise_nemo.config import ConfigError, config_from_dict

    register_method(ReasoningMethod("bad_pieces", "a reasoning method naming the rubric judge", scorer="rubric_judge"))
    register_method(ReasoningMethod("bad_hooks", "RRL's hooks without a critic", hooks="rrl"))
    try:
        with pytest.raises(ConfigError, match="key 'method': method 'bad_pieces' names scorer 'rubric_judge'"):
            config_from_dict({"method": "bad_pieces"})
        with pytest.raises(ConfigError, match="hooks 'rrl' read the critic's values"):
            config_from_dict({"method": "bad_hooks"})
    finally:
        unregister_method("bad_pieces")
        unregister_method("bad_hooks")


@pytest.mark.parametrize("method, source, words", [("grpo", "persistent", "trains on problems"),
                                                   ("sft", "persistent", "trains on problems"),
                                                   ("rise", "chain_arithmetic", "trains on rubric prompts")])
def test_data_of_another_kind_is_refused_before_anything_is_read(tmp_path, method, source, words):
    from rise_nemo.config import config_from_dict
    from rise_nemo.errors import UserError
    from rise_nemo.loop.run import build_trainer

    cfg = config_from_dict({"method": method, "run": {"dir": str(tmp_path / "run")}}, [f"data.source={source}"])
    with pytest.raises(UserError, match=f"config key 'data.source': '{source}' gives .*; method '{method}' {words}"):
        build_trainer(cfg)
    assert not (tmp_path / "run").exists()


def test_the_issue_example_fails_at_config_time_with_one_line(tmp_path):
    """`rise-nemo train --config grpo_chain_tiny_cpu reward.scorer=rubric_judge`: refused before anything is built
    (it used to die at step 1 with AttributeError)."""
    out = subprocess.run([sys.executable, "-m", "rise_nemo.cli", "train", "--config", "grpo_chain_tiny_cpu",
                          f"run.dir={tmp_path / 'run'}", "reward.scorer=rubric_judge"], capture_output=True, text=True,
                         cwd=REPO, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "command-line override: key 'reward.scorer'" in lines[0], out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "run").exists()


def test_the_method_list_in_the_docs_is_the_registry():
    from rise_nemo.methods.registry import method_table

    text = (REPO / "docs" / "methods.md").read_text()
    assert method_table() in text, ("docs/methods.md \"Method registry\": paste rise_nemo.methods.registry."
                                    "method_table()'s output:\n" + method_table())


def test_no_method_name_or_family_decisions_outside_the_registry():
    """`git grep` of the acceptance: method names are compared only in rise_nemo/methods/ (the registry)."""
    # (coupled / uniform are also guide-loss modes, core.losses' token_weighting: not listed)
    pattern = re.compile(r'[!=]= *"(rrl|ppo|grpo|rise|exprl\w*|sft|self_distillation|rubric_rl|ruscarl|opd)"')
    hits = []
    for path in sorted((REPO / "rise_nemo").rglob("*.py")):
        if path.parent.name == "methods":
            continue
        text = path.read_text()
        hits += [f"{path}: {line.strip()}" for line in text.splitlines()
                 if pattern.search(line)]
        hits += [f"{path}: {line.strip()}" for line in text.splitlines() if ".family" in line]
    assert hits == []
