"""Two-stage pipelines (rise_nemo.loop.pipeline, `rise-nemo pipeline`): Stage I then Stage II from
Stage I's final weights, separate run directories, resume in either stage, report over both, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from tiny_task import chain_recipe

from rise_nemo.cli import main
from rise_nemo.errors import UserError
from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.pipeline import load_pipeline, run_pipeline
from rise_nemo.loop.trainer import read_metrics


def _recipe(method: str) -> dict:
    recipe = chain_recipe(method, group_size=3, max_new_tokens=20, steps=2, exprl={"segment_marker": "step"})
    recipe["eval"]["top_p"] = 1.0  # one evaluation protocol for both stages (their sampling.top_p differ)
    return recipe


@pytest.fixture
def pipeline_file(tmp_path):
    (tmp_path / "stage1.yaml").write_text(yaml.safe_dump(_recipe("exprl_process")))
    (tmp_path / "stage2.yaml").write_text(yaml.safe_dump(_recipe("grpo")))
    spec = {"pipeline": {"name": "p", "dir": str(tmp_path / "runs")},
            "stages": [{"name": "stage1", "recipe": "stage1.yaml"},
                       {"name": "stage2", "recipe": "stage2.yaml", "init": "previous",
                        "overrides": {"train.steps": 3, "policy_loss.kl_coef": 0.0}}]}
    path = tmp_path / "pipe.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _weights(run_dir: Path, step: int):
    from rise_nemo.backends.local.policy import load_state

    return load_state(run_dir / "checkpoints" / f"step_{step:06d}" / "policy")["model"]


def test_stage_two_starts_from_stage_one_final_weights_and_the_report_covers_both(pipeline_file, capsys):
    assert main(["pipeline", str(pipeline_file)]) == 0
    root = pipeline_file.parent / "runs"
    s1, s2 = root / "stage1", root / "stage2"
    assert [m["step"] for m in read_metrics(s1)] == [1, 2] and [m["step"] for m in read_metrics(s2)] == [1, 2, 3]
    assert json.loads((s1 / "summary.json").read_text())["method"] == "exprl_process"
    assert json.loads((s2 / "summary.json").read_text())["method"] == "grpo"
    assert (s1 / "eval" / "step_000002.json").is_file() and (s2 / "eval" / "step_000000.json").is_file()
    # Stage I's final evaluation and Stage II's step-0 evaluation are of the same weights and
    # sample the same stream (Stage II's steps continue Stage I's: eval.stream_offset 2), so they agree exactly.
    final1 = json.loads((s1 / "eval" / "step_000002.json").read_text())
    start2 = json.loads((s2 / "eval" / "step_000000.json").read_text())
    assert {k: v for k, v in final1.items() if k != "step"} == {k: v for k, v in start2.items() if k != "step"}
    assert yaml.safe_load((s2 / "config.yaml").read_text())["eval"]["stream_offset"] == 2
    out = capsys.readouterr().out
    assert "report:" in out and (root / "report" / "report.md").is_file()
    report = (root / "report" / "report.md").read_text()
    assert "stage1" in report and "stage2" in report
    assert json.loads((root / "pipeline.json").read_text())["stages"][1]["init"] == "previous"
    assert main(["report", str(root), "--out", str(root / "again")]) == 0  # a pipeline dir = its stages
    assert "stage2" in (root / "again" / "report.md").read_text()
    capsys.readouterr()
    assert main(["eval", str(root), "eval.samples_per_prompt=1"]) == 0  # a pipeline dir = its last stage
    assert f"evaluating its last stage, {s2}" in capsys.readouterr().err
    assert (s2 / "eval" / "cli" / "step_000003.json").is_file()


def test_eval_stream_offsets_follow_the_chain_of_init_previous(tmp_path):
    from rise_nemo.loop.pipeline import eval_stream_offset

    for name, method in (("a", "sft"), ("b", "grpo"), ("c", "grpo")):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(_recipe(method)))
    spec = {"stages": [{"name": "a", "recipe": "a.yaml", "overrides": {"train.steps": 4}},
                       {"name": "b", "recipe": "b.yaml", "init": "previous", "overrides": {"train.steps": 5}},
                       {"name": "c", "recipe": "c.yaml", "init": "previous"},
                       {"name": "d", "recipe": "c.yaml"},
                       {"name": "e", "recipe": "c.yaml", "init": "previous"}]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    p = load_pipeline(tmp_path / "p.yaml")
    assert [eval_stream_offset(p, s) for s in p.stages] == [0, 4, 9, 0, 2]
    assert [eval_stream_offset(p, s, ["train.steps=1"]) for s in p.stages] == [0, 1, 2, 0, 1]  # the command line wins


def test_a_stage_evaluating_differently_is_named_in_a_warning(pipeline_file):
    from rise_nemo.loop.pipeline import eval_differences, stage_config

    p = load_pipeline(pipeline_file)
    s1, s2 = (stage_config(p, s) for s in p.stages)
    assert eval_differences(s1, s2) == []
    s2 = stage_config(p, p.stages[1], ["eval.top_p=0.9", "eval.samples_per_prompt=4"])
    assert eval_differences(s1, s2) == ["top_p 1.0 -> 0.9", "eval.samples_per_prompt 2 -> 4"]


def test_stage_two_init_loads_exactly_stage_one_final_checkpoint(pipeline_file, monkeypatch):
    seen = {}
    real = ckpt.init_policy_from

    def spy(policy, checkpoint):
        real(policy, checkpoint)
        seen["ckpt"] = checkpoint
        seen["weights"] = {k: v.clone() for k, v in policy.model.state_dict().items()}

    monkeypatch.setattr(ckpt, "init_policy_from", spy)
    run_pipeline(load_pipeline(pipeline_file))
    s1 = pipeline_file.parent / "runs" / "stage1"
    assert seen["ckpt"] == ckpt.latest_checkpoint(s1) and seen["ckpt"].name == "step_000002"
    final = _weights(s1, 2)
    assert all(torch.equal(final[k], seen["weights"][k]) for k in final)


def test_resume_in_either_stage_matches_the_uninterrupted_pipeline(pipeline_file, tmp_path):
    full = load_pipeline(pipeline_file, tmp_path / "full")
    run_pipeline(full)
    parts = load_pipeline(pipeline_file, tmp_path / "parts")
    assert run_pipeline(parts, stop_after=1) == 0  # stops in stage 1 after its step 1
    assert not (tmp_path / "parts" / "stage2").exists()
    with pytest.raises(UserError, match=r"not a run directory .*run directories in it: .*parts/stage1$"):
        main_eval_unwrapped(tmp_path / "parts")
    assert run_pipeline(parts, stop_after=2) == 0  # finishes stage 1 (2 steps), stops stage 2 after step 2
    assert [m["step"] for m in read_metrics(tmp_path / "parts" / "stage2")] == [1, 2]
    assert run_pipeline(parts) == 0  # resumes stage 2 from its own checkpoint; stage 1 is skipped

    def rep(run):
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "judge/"))} for m in read_metrics(run)]
    for stage in ("stage1", "stage2"):
        assert rep(tmp_path / "full" / stage) == rep(tmp_path / "parts" / stage)
    a, b = _weights(tmp_path / "full" / "stage2", 3), _weights(tmp_path / "parts" / "stage2", 3)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("stages"), "'stages' must be a non-empty list"),
    (lambda d: d["stages"][0].update(init="previous"), "not on the first stage"),
    (lambda d: d["stages"][1].update(recipe="missing.yaml"), "stages[1].recipe: file not found"),
    (lambda d: d["stages"][1].update(colour="red"), "unknown key(s) ['colour']"),
    (lambda d: d["stages"][1].update(name="stage1"), "must be unique"),
])
def test_bad_pipeline_files_fail_with_one_line_naming_the_key(pipeline_file, edit, message):
    data = yaml.safe_load(pipeline_file.read_text())
    edit(data)
    pipeline_file.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError) as info:
        load_pipeline(pipeline_file)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_cli_reports_a_bad_pipeline_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: []\n")
    assert main(["pipeline", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rise-nemo pipeline:") and "'stages' must be a non-empty list" in err and "\n" not in err
    assert main(["pipeline", str(tmp_path / "missing.yaml")]) == 2


def main_eval_unwrapped(run_dir: Path) -> None:
    """`rise-nemo eval RUN_DIR` without the CLI's error printing (the UserError itself)."""
    import argparse

    from rise_nemo.commands import evaluate

    evaluate.run(argparse.Namespace(items=[str(run_dir)], config=None, checkpoint=None, out=None))


# -- bad pipeline files and stage overrides ------------------------------------------------------------------

def test_a_bad_stage_override_names_the_file_and_stage_and_leaves_no_directory(pipeline_file, capsys):
    data = yaml.safe_load(pipeline_file.read_text())
    data["stages"][1]["overrides"]["train.stepz"] = 3
    pipeline_file.write_text(yaml.safe_dump(data, sort_keys=False))
    root = pipeline_file.parent / "runs"
    assert main(["pipeline", str(pipeline_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{pipeline_file}: stages[1] (stage2, recipe stage2.yaml): override 'train.stepz=3'" in err, err
    assert "\n" not in err and "command-line" not in err
    assert not root.exists()  # checked before the pipeline directory (or stage 1) was created
    data["stages"][1]["overrides"].pop("train.stepz")
    pipeline_file.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["pipeline", str(pipeline_file), "--dir", str(root), "sampling.groupsize=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "stages[0] (stage1" in err and "command-line override 'sampling.groupsize=2'" in err, err
    assert not root.exists()


def test_a_pipeline_by_name_and_a_copied_pipeline_file_find_the_shipped_recipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shipped = load_pipeline("exprl_pipeline_tiny_cpu")  # a name, as train and plan accept
    assert shipped.source.name == "exprl_pipeline_tiny_cpu.yaml" and shipped.stages[0].recipe.is_file()
    copy = tmp_path / "mine.yaml"
    copy.write_text(shipped.source.read_text())
    mine = load_pipeline(copy)
    assert [s.recipe for s in mine.stages] == [s.recipe for s in shipped.stages]
    with pytest.raises(UserError, match="pipeline 'nonesuch' not found"):
        load_pipeline("nonesuch")


def test_an_old_key_in_a_stage_override_names_the_pipeline_stage_and_new_key(pipeline_file, capsys):
    data = yaml.safe_load(pipeline_file.read_text())
    data["stages"][1]["overrides"]["grpo.kl_coef"] = 0.0
    pipeline_file.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["pipeline", str(pipeline_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{pipeline_file}: stages[1] (stage2, recipe stage2.yaml): override 'grpo.kl_coef=0.0': "
                        "key 'grpo.kl_coef' was renamed to 'policy_loss.kl_coef'"), err
    assert "\n" not in err
