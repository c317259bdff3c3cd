"""Planner: layout checks and memory estimate on in-memory recipe trees, plus the CLI's exit codes."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rise_nemo.planner import RecipeKeyError, format_report, plan_recipe
from rise_nemo.planner.memory import activation_bytes_per_token_layer, stage_params
from rise_nemo.planner.models import QWEN3

REPO = Path(__file__).resolve().parents[2]


def tiny_tree(**nemo_policy_overrides) -> dict:
    """A small self-contained NeMo-RL recipe tree: Qwen3-8B on 1 node, no judge."""
    tree = {
        "run": {"name": "t"}, "backend": "nemo",
        "sampling": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 1024},
        "nemo": {
            "plan": {"nodes": 1},
            "cluster": {"num_nodes": 1, "gpus_per_node": 8},
            "policy": {
                "model_name": "Qwen/Qwen3-8B", "train_micro_batch_size": 1, "max_total_sequence_length": 2048,
                "make_sequence_length_divisible_by": 2,
                "megatron_cfg": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                                 "context_parallel_size": 1, "sequence_parallel": True},
                "generation": {"backend": "vllm", "colocated": {"enabled": True},
                               "vllm_cfg": {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.5,
                                            "max_model_len": 2048}},
            },
        },
    }
    tree["nemo"]["policy"]["megatron_cfg"].update(nemo_policy_overrides)
    return tree


def issues(tree, **kw) -> list[str]:
    return [str(i) for i in plan_recipe(tree, **kw).issues]


def test_valid_tree_fits():
    report = plan_recipe(tiny_tree())
    assert report.ok, report.issues
    assert report.layout.policy.dp == 4
    assert 0 < report.peak_gib < 141


@pytest.mark.parametrize("change, key, fragment", [
    ({"tensor_model_parallel_size": 3}, "tensor_model_parallel_size", "does not divide the 8 training GPUs"),
    ({"tensor_model_parallel_size": 16}, "tensor_model_parallel_size", "spans more than one 8-GPU node"),
    ({"pipeline_model_parallel_size": 5}, "pipeline_model_parallel_size", "does not divide"),
    ({"tensor_model_parallel_size": 1}, "sequence_parallel", "needs tensor_model_parallel_size > 1"),
])
def test_broken_layouts_name_the_key(change, key, fragment):
    found = issues(tiny_tree(**change))
    assert any(key in i and fragment in i for i in found), found


def test_heads_and_kv_heads_divisibility():
    tree = tiny_tree(tensor_model_parallel_size=8)  # 8B: 32 heads, 8 KV heads -> ok
    tree["nemo"]["policy"]["make_sequence_length_divisible_by"] = 8
    assert plan_recipe(tree).ok
    tree["nemo"]["cluster"]["gpus_per_node"] = 16
    tree["nemo"]["policy"]["megatron_cfg"]["tensor_model_parallel_size"] = 16
    tree["nemo"]["policy"]["make_sequence_length_divisible_by"] = 16
    assert any("8 KV heads" in i for i in issues(tree))


def test_batch_and_sequence_checks():
    tree = tiny_tree()
    tree["sampling"]["prompts_per_step"] = 3  # 24 rows, DP 4 x mbs 1 -> ok; mbs 5 -> not
    tree["nemo"]["policy"]["train_micro_batch_size"] = 5
    assert any(i.startswith("sampling.prompts_per_step") for i in issues(tree))
    tree = tiny_tree()
    tree["sampling"]["max_new_tokens"] = 4096
    assert any("max_total_sequence_length" in i and "no room" in i for i in issues(tree))
    tree = tiny_tree()
    tree["nemo"]["policy"]["make_sequence_length_divisible_by"] = 1
    assert any("make_sequence_length_divisible_by" in i for i in issues(tree))


def test_vllm_checks():
    tree = tiny_tree()
    tree["nemo"]["policy"]["generation"]["vllm_cfg"]["tensor_parallel_size"] = 16
    assert any("does not fit one 8-GPU node" in i for i in issues(tree))
    tree = tiny_tree()
    tree["nemo"]["policy"]["generation"]["vllm_cfg"]["gpu_memory_utilization"] = 0.05  # no room for KV
    assert any("cannot hold one 2048-token sequence" in i for i in issues(tree))
    tree = tiny_tree()
    tree["nemo"]["policy"]["generation"]["vllm_cfg"]["precision"] = "fp8"
    assert any(i.startswith("nemo.adapter.importance_sampling") for i in issues(tree))


def test_vllm_precision_float32_plans_with_four_bytes_a_weight():
    """float32 vLLM (CPU functional runs) is a known precision: planned, its weights counted at 4 bytes."""
    tree = tiny_tree()
    tree["nemo"]["policy"]["generation"]["vllm_cfg"]["precision"] = "float32"
    assert not issues(tree)
    weights = {t.label: t.gib for t in plan_recipe(tree).terms if t.label.startswith("vLLM weights")}
    tree["nemo"]["policy"]["generation"]["vllm_cfg"]["precision"] = "bfloat16"
    bf16 = {t.label: t.gib for t in plan_recipe(tree).terms if t.label.startswith("vLLM weights")}
    assert list(weights) == ["vLLM weights (fp32, TP 1)"]
    assert weights["vLLM weights (fp32, TP 1)"] == pytest.approx(2 * bf16["vLLM weights (bf16, TP 1)"])
    tree["nemo"]["policy"]["generation"]["vllm_cfg"]["precision"] = "int4"
    assert any(i.startswith("nemo.policy.generation.vllm_cfg.precision") and "int4" in i for i in issues(tree))


def test_dtensor_policy_is_laid_out_from_dtensor_cfg():
    """megatron_cfg.enabled false + dtensor_cfg.enabled (NeMo-RL's rule): the DTensor TP is checked, and a
    Megatron block left in the recipe (inherited from a Megatron recipe) is ignored, as NeMo-RL ignores it."""
    tree = tiny_tree(tensor_model_parallel_size=16, enabled=False)  # would fail as a Megatron layout
    tree["nemo"]["policy"]["dtensor_cfg"] = {"enabled": True, "tensor_parallel_size": 1}
    assert not issues(tree)
    tree["nemo"]["policy"]["dtensor_cfg"]["tensor_parallel_size"] = 16
    assert any(i.startswith("nemo.policy.dtensor_cfg.tensor_parallel_size") for i in issues(tree))


def test_fp8_checks():
    tree = tiny_tree(fp8_cfg={"enabled": True, "fp8": "e5m2", "fp8_recipe": "blockwise"})
    found = issues(tree)
    assert any("fp8_cfg.fp8" in i and "e5m2" in i for i in found)
    assert any("NVTE_FP8_BLOCK_SCALING_FP32_SCALES" in i for i in found)


def test_memory_overflow_names_largest_term():
    tree = tiny_tree(tensor_model_parallel_size=2)
    tree["nemo"]["policy"]["max_total_sequence_length"] = 65536
    tree["nemo"]["policy"]["generation"]["vllm_cfg"]["max_model_len"] = 65536
    report = plan_recipe(tree)
    over = [str(i) for i in report.issues if "per GPU >" in str(i)]
    assert over and "largest term: activations" in over[0]
    assert over[0].startswith("nemo.policy.megatron_cfg.activation_checkpointing")
    tree["nemo"]["policy"]["megatron_cfg"]["activation_checkpointing"] = True
    recomputed = plan_recipe(tree)

    def activations(r):
        return next(t.gib for t in r.terms if t.label.startswith("activations"))

    assert activations(recomputed) < activations(report) / 10  # 36 layers kept as inputs + 1 full layer
    tree["nemo"]["policy"]["megatron_cfg"]["recompute_granularity"] = "selective"  # flash attn: no saving
    assert activations(plan_recipe(tree)) == pytest.approx(activations(report))


def test_memory_terms_scale_as_documented():
    m = QWEN3["qwen3-14b"]
    # heaviest PP stage: 20 layers + one embedding-sized matrix (+ final norm)
    assert stage_params(m, 2) == 20 * m.layer_params + m.embedding_params + m.hidden
    # sequence parallel shards the 4h residual-stream terms over TP as well
    assert activation_bytes_per_token_layer(m, 4, True) < activation_bytes_per_token_layer(m, 4, False)
    a = plan_recipe(tiny_tree()).phase_total("training")
    b = plan_recipe(tiny_tree(tensor_model_parallel_size=4)).phase_total("training")
    assert b < a


def test_nodes_override_and_missing_keys():
    tree = tiny_tree()
    tree["nemo"]["plan"]["judge"] = {"model": "qwen3-32b", "nodes": 1, "tensor_parallel_size": 4}
    tree["nemo"]["plan"]["nodes"] = 2
    assert plan_recipe(tree).ok
    assert plan_recipe(tree, nodes=3).layout.policy.world == 16
    with pytest.raises(RecipeKeyError, match="leave no training node"):
        plan_recipe(tree, nodes=1)
    tree["nemo"]["plan"]["nodes"] = 3  # disagrees with cluster.num_nodes + judge
    assert any(i.startswith("nemo.cluster.num_nodes") for i in issues(tree))
    broken = copy.deepcopy(tree)
    del broken["nemo"]["policy"]["model_name"]
    with pytest.raises(RecipeKeyError, match="nemo.policy.model_name is missing"):
        plan_recipe(broken)
    broken = copy.deepcopy(tree)
    broken["nemo"]["policy"]["megatron_cfg"]["tensor_model_parallel_size"] = "two"
    with pytest.raises(RecipeKeyError, match="tensor_model_parallel_size must be int"):
        plan_recipe(broken)
    with pytest.raises(RecipeKeyError, match="backend"):
        plan_recipe({**tree, "backend": "local"})


def test_format_report_shows_peak_and_largest_term():
    text = format_report(plan_recipe(tiny_tree()), "t")
    assert "peak per GPU:" in text and "largest term:" in text and "OK:" in text


def _cli(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "rise_nemo.cli", "plan", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_cli_exit_codes_and_no_torch(tmp_path):
    ok = _cli("rise_14b")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "peak per GPU" in ok.stdout
    imported = {line.split("|")[-1].strip() for line in ok.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "nemo_rl" not in imported
    small = _cli("recipes/rise_14b.yaml", "--gpu-mem-gib", "40")
    assert small.returncode == 1 and "CANNOT RUN" in small.stdout
    bad = yaml.safe_load((REPO / "recipes" / "rise_14b.yaml").read_text())
    bad["nemo"]["policy"]["megatron_cfg"]["tensor_model_parallel_size"] = 3
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    broken = _cli(str(path))
    assert broken.returncode == 1
    assert "nemo.policy.megatron_cfg.tensor_model_parallel_size" in broken.stdout
    missing = _cli(str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_global_batch_must_hold_every_row_of_a_step():
    """The nemo backend pads every step to train_global_batch_size rows (Megatron's scheduler
    advances by the gbs of each train call), so it must hold natural + privileged rows."""
    tree = tiny_tree()
    tree["method"] = "rise"
    tree["rise"] = {"privileged_group_size": 8}
    tree["nemo"]["policy"]["train_global_batch_size"] = 64  # 8 x 8 natural only
    assert any(i.startswith("nemo.policy.train_global_batch_size") and "128 training rows" in i for i in issues(tree))
    tree["nemo"]["policy"]["train_global_batch_size"] = 128
    assert not any("training rows" in i for i in issues(tree))
    tree["method"] = "rubric_rl"  # no privileged rows
    tree["nemo"]["policy"]["train_global_batch_size"] = 64
    assert not any("training rows" in i for i in issues(tree))


def test_global_batch_larger_than_a_step_is_noted_not_refused():
    """A non-guided method under a guided recipe's global batch runs, but half its rows would be padding:
    `plan` says so (a note naming the key and the right value) without failing."""
    tree = tiny_tree()
    tree["method"] = "rubric_rl"
    tree["nemo"]["policy"]["train_global_batch_size"] = 128  # 8 x 8 natural rows per step
    report = plan_recipe(tree)
    assert report.ok
    assert len(report.notes) == 1 and "train_global_batch_size 128" in report.notes[0]
    assert "padded with 64 masked rows" in report.notes[0] and "set it to 64" in report.notes[0]
    assert "note: nemo.policy.train_global_batch_size" in format_report(report)
    tree["nemo"]["policy"]["train_global_batch_size"] = 64
    assert plan_recipe(tree).notes == []


def test_cli_errors_name_the_recipe_once(capsys):
    """`plan nonesuch` said "nonesuch: recipe 'nonesuch' not found"."""
    from rise_nemo.cli import main

    assert main(["plan", "nonesuch_recipe"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("nonesuch_recipe") == 1 and "not found" in err, err
    assert main(["plan", "rise_14b", "sampling.groupsize=2"]) == 2  # a message without the recipe gets it in front
    err = capsys.readouterr().err.strip()
    assert err.startswith("rise-nemo plan: rise_14b: command-line override 'sampling.groupsize=2'"), err


def test_critic_phase_is_the_value_model_alone():
    """The nemo backend offloads the policy (weights, grads, optimizer) before the value model
    loads, as NeMo-RL's ppo.py does (rise_nemo.backends.nemo.runtime.NemoSession.offload_policy), so the
    planner's critic phase is the value model's training state plus the idle processes of the policy and vLLM
    (CUDA context + NCCL buffers): no policy weights."""
    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.config.loader import load_config
    from rise_nemo.planner import memory

    report = plan_recipe(plain_recipe(load_config(REPO / "recipes" / "ppo_math_7b.yaml")))
    critic = [t for t in report.terms if t.phase == "critic"]
    idle = [t for t in critic if "idle" in t.label]
    assert [t.label.split(" process")[0] for t in idle] == ["policy", "vLLM"]
    assert not [t for t in critic if t.label.startswith("policy") and t not in idle], [t.label for t in critic]
    assert report.phase_total("critic") == pytest.approx(
        sum(t.gib for t in critic if t not in idle) + 2 * memory.IDLE_PROCESS_GIB)


@pytest.mark.parametrize("recipe, processes", [
    ("ppo_math_7b", ["policy", "vLLM", "value model"]),
    ("rise_14b", ["policy", "vLLM"]),
    ("opd_14b_teacher32b", ["policy", "vLLM", "teacher"]),
])
def test_every_phase_counts_the_other_colocated_processes(recipe, processes):
    """Each GPU of a colocated layout holds one worker process per group (NeMo-RL's placement); in every phase
    the processes that are not working keep their CUDA context and NCCL buffers there (an estimate)."""
    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.config.loader import load_config
    from rise_nemo.planner import format_report
    from rise_nemo.planner.report import colocated_processes

    report = plan_recipe(plain_recipe(load_config(REPO / "recipes" / f"{recipe}.yaml")))
    assert colocated_processes(report.layout) == processes
    for phase in ("training", "generation"):
        idle = sorted(t.label.split(" process")[0] for t in report.terms if t.phase == phase and "idle" in t.label)
        working = "policy" if phase == "training" else "vLLM"
        assert idle == sorted(p for p in processes if p != working), (phase, idle)
    text = format_report(report)
    assert f"on each training GPU: {' + '.join(processes)} ({len(processes)} worker processes" in text
    assert "(estimate)" in text
    if "value model" in processes:
        assert "critic (value model): qwen2.5-math-7b" in text and "one worker on each of the 8 training GPUs" in text
