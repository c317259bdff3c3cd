"""Every NeMo-RL recipe loads through the config loader, passes the nemo backend's checks and `plan` at its
documented node count; deliberately broken copies fail with a message naming the key."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from rise_nemo.backends.nemo import check_recipe
from rise_nemo.backends.nemo.config import NemoConfigError, nemo_overrides, validate_nemo_block
from rise_nemo.config.loader import ConfigError, load_config
from rise_nemo.planner import plan_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
NEMO_RECIPES = sorted(p.name for p in RECIPES.glob("*.yaml")
                      if (yaml.safe_load(p.read_text()) or {}).get("backend") == "nemo"
                      or "rise_14b.yaml" in str((yaml.safe_load(p.read_text()) or {}).get("defaults", "")))
# The recipes this test must see (a recipe silently dropping out of the glob would hide a break).
EXPECTED = {"rise_4b.yaml", "rise_14b.yaml", "rubric_rl_14b.yaml", "ruscarl_14b.yaml", "rise_14b_coupled.yaml",
            "rise_14b_uniform.yaml", "opd_14b_teacher32b.yaml", "opd_4b_teacher14b.yaml", "ppo_math_7b.yaml",
            "grpo_math_qwen3_4b.yaml", "exprl_outcome_qwen3_4b.yaml", "exprl_process_qwen3_4b.yaml",
            "exprl_stage2_qwen3_4b.yaml", "rrl_math_7b.yaml", "ppo_apps_deepseek_coder_6.7b.yaml",
            "rrl_apps_deepseek_coder_6.7b.yaml", "ppo_hh_llama2_7b.yaml", "rrl_hh_llama2_7b.yaml"}
DOCUMENTED_NODES = {"rise_4b.yaml": 2, "rise_14b.yaml": 2, "rubric_rl_14b.yaml": 2, "ruscarl_14b.yaml": 2,
                    "rise_14b_coupled.yaml": 2, "rise_14b_uniform.yaml": 2, "opd_14b_teacher32b.yaml": 3,
                    "opd_4b_teacher14b.yaml": 2, "ppo_math_7b.yaml": 1, "grpo_math_qwen3_4b.yaml": 1,
                    "exprl_outcome_qwen3_4b.yaml": 2, "exprl_process_qwen3_4b.yaml": 2, "exprl_stage2_qwen3_4b.yaml": 1,
                    "rrl_math_7b.yaml": 1, "ppo_apps_deepseek_coder_6.7b.yaml": 1,
                    "rrl_apps_deepseek_coder_6.7b.yaml": 1, "ppo_hh_llama2_7b.yaml": 1, "rrl_hh_llama2_7b.yaml": 1}


def load(name: str, *overrides: str) -> dict:
    return OmegaConf.to_container(load_config(RECIPES / name, list(overrides)), resolve=True)


def test_all_nemo_recipes_are_covered():
    assert EXPECTED <= set(NEMO_RECIPES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recipe_loads_validates_and_plans(name):
    tree = load(name)
    assert tree["backend"] == "nemo"
    check_recipe(tree)  # nemo block + plan at the recipe's own node count
    report = plan_recipe(tree)
    assert report.ok and report.layout.nodes_total == DOCUMENTED_NODES[name]
    # no shipped recipe pads its steps: train_global_batch_size is exactly what a step can train on
    assert report.notes == [], report.notes
    assert report.peak_gib < 141
    # the header comment documents the node count the planner uses
    assert f"Nodes: {DOCUMENTED_NODES[name]} x 8 H200" in (RECIPES / name).read_text() or "defaults:" in (
        RECIPES / name).read_text()


@pytest.mark.parametrize("name,rows", [("rubric_rl_14b.yaml", 512), ("ruscarl_14b.yaml", 512), ("rise_14b.yaml", 1024)])
def test_global_batch_is_the_rows_of_one_step(name, rows):
    """Rubric-RL and RuscaRL train 64 x 8 natural rows only; inheriting rise_14b's 1024 (64 x (8 + 8))
    would pad every step with 512 masked rows."""
    assert load(name)["nemo"]["policy"]["train_global_batch_size"] == rows


def test_paper_hyperparameters_in_rise_14b():
    t = load("rise_14b.yaml")
    assert (t["sampling"]["prompts_per_step"], t["sampling"]["group_size"]) == (64, 8)
    assert (t["policy_loss"]["clip_low"], t["policy_loss"]["clip_high"], t["policy_loss"]["kl_coef"], t["policy_loss"]["entropy_coef"]) == (
        0.2, 0.28, 0.0, 0.0)
    assert t["sampling"]["max_new_tokens"] == 8192
    assert (t["reward"]["overlong_buffer"], t["reward"]["overlong_factor"]) == (4096, 0.5)
    assert (t["rise"]["gamma"], t["rise"]["top_m"], t["rise"]["privileged_group_size"]) == (0.1, 5, 8)
    assert t["nemo"]["policy"]["megatron_cfg"]["optimizer"]["lr"] == 1e-6
    mc = t["nemo"]["policy"]["megatron_cfg"]
    assert mc["sequence_parallel"] and mc["tensor_model_parallel_size"] > 1 and mc["pipeline_model_parallel_size"] > 1
    assert mc["fp8_cfg"] == {"enabled": True, "fp8": "e4m3", "fp8_recipe": "blockwise", "fp8_param": False}
    assert t["nemo"]["policy"]["generation"]["vllm_cfg"]["precision"] == "fp8"
    assert t["nemo"]["adapter"]["importance_sampling"] == "behaviour_ratio"
    assert {"rubric_rl_14b.yaml": "rubric_rl", "ruscarl_14b.yaml": "ruscarl", "rise_14b_coupled.yaml": "coupled",
            "rise_14b_uniform.yaml": "uniform"} == {n: load(n)["method"] for n in
                                                    ("rubric_rl_14b.yaml", "ruscarl_14b.yaml",
                                                     "rise_14b_coupled.yaml", "rise_14b_uniform.yaml")}


def test_judge_endpoints_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RISE_JUDGE_URLS", '["http://j0:8000/v1", "http://j0:8001/v1"]')
    monkeypatch.setenv("RISE_JUDGE_MODEL", "my-judge")
    t = load("rise_14b.yaml")
    assert t["judge"]["base_urls"] == ["http://j0:8000/v1", "http://j0:8001/v1"]
    assert t["judge"]["model"] == "my-judge"


def test_derived_values_are_written_into_nemo_tree(tmp_path):
    t = load("ruscarl_14b.yaml")
    tree = nemo_overrides(t, str(tmp_path))
    assert tree["policy"]["generation"]["max_new_tokens"] == 8192
    assert tree["grpo"]["num_prompts_per_step"] == 64 and tree["grpo"]["num_generations_per_prompt"] == 8
    assert tree["loss_fn"]["reference_policy_kl_penalty"] == 0.001
    assert tree["grpo"]["skip_reference_policy_logprobs_calculation"] is False
    assert not {"plan", "adapter", "base", "algorithm"} & set(tree)
    # evaluation is rise_nemo's: NeMo-RL's validation stays off whatever its base config says (grpo_math_1B.yaml
    # has val_period 10, and grpo.setup, given no validation set, asserts; every recipe that did not repeat
    # these three keys failed before NeMo-RL started)
    assert (tree["grpo"]["val_period"], tree["grpo"]["val_at_start"], tree["grpo"]["val_at_end"]) == (0, False, False)


@pytest.mark.parametrize("name, prompts", [("opd_14b_teacher32b.yaml", 600), ("opd_14b_teacher32b.yaml", 5000),
                                           ("opd_4b_teacher14b.yaml", 512)])
def test_opd_runs_train_steps_whatever_the_prompt_count(name, prompts, tmp_path):
    """NeMo-RL's distillation loop runs while total_steps < max_num_steps AND current_epoch < max_num_epochs
    (distillation.py:717), an epoch being floor(prompts / num_prompts_per_step) batches (drop_last), and sizes
    the LR schedule as min(max_num_steps, max_num_epochs x batches) (:571-576). Its base config's
    max_num_epochs: 10 used to end opd_14b_teacher32b (512 prompts per step, 50 steps) after 10 steps for
    1,023 prompts or fewer, with the schedule sized for 10; the derived epoch limit lets train.steps bind."""
    t = load(name)
    tree = nemo_overrides(t, str(tmp_path))
    steps, per_step = t["train"]["steps"], t["nemo"]["distillation"]["num_prompts_per_step"]
    batches = max(1, prompts // per_step)  # nemo_dataset repeats a short prompt set to one full batch
    dist = tree["distillation"]
    assert dist["max_num_steps"] == steps
    assert min(dist["max_num_steps"], dist["max_num_epochs"] * batches) == steps
    for key in ("max_num_epochs", "max_num_steps", "seed"):
        with pytest.raises(NemoConfigError, match=rf"nemo\.distillation\.{key} is set from"):
            validate_nemo_block(_broken(name, lambda t, k=key: t["nemo"]["distillation"].__setitem__(k, 10)))


def _set(tree: dict, dotted: str, value) -> None:
    node = tree
    for part in dotted.split(".")[:-1]:
        node = node.setdefault(part, {})
    node[dotted.rsplit(".", 1)[-1]] = value


@pytest.mark.parametrize("recipe, key, fragment", [
    # NeMo-RL's ClippedPGLossFn is built by grpo.setup but never called: our policy_loss: trains
    ("rise_14b.yaml", "loss_fn.ratio_clip_max", "nemo.loss_fn.ratio_clip_max is set from policy_loss.clip_high"),
    ("rise_14b.yaml", "loss_fn.use_importance_sampling_correction",
     "is set from nemo.adapter.importance_sampling"),
    ("rise_14b.yaml", "loss_fn.token_level_loss", "nemo.loss_fn.token_level_loss is not used on backend nemo"),
    ("rise_14b.yaml", "grpo.normalize_rewards", "nemo.grpo.normalize_rewards is not used on backend nemo"),
    ("rise_14b.yaml", "logger.wandb_enabled", "is set from train.tensorboard / train.wandb"),
    ("rise_14b.yaml", "logger.wandb.project", "nemo.logger.wandb.project is not used on backend nemo"),
    ("rise_14b.yaml", "data.shuffle", "prompts come from the recipe's data: block"),
    ("rise_14b.yaml", "env.math.num_workers", "rewards come from the recipe's judge"),
    ("rise_14b.yaml", "checkpointing.save_optimizer", "rise_nemo writes <run dir>/checkpoints itself"),
    ("rise_14b.yaml", "value.megatron_cfg.optimizer.lr", "only a method with a critic (ppo, rrl)"),
    ("rise_14b.yaml", "teacher.model_name", "only a distillation recipe"),
    ("rise_14b.yaml", "no_such_block.x", "nemo.no_such_block.x is not used on backend nemo"),
    ("opd_14b_teacher32b.yaml", "data.shuffle", "prompts come from the recipe's data: block"),
    ("opd_14b_teacher32b.yaml", "logger.log_dir", "nemo.logger.log_dir is set from run.dir"),
])
def test_nemo_keys_nothing_reads_are_refused(recipe, key, fragment):
    """Every key under nemo: is read by a NeMo-RL component the backend builds, derived from ours, or refused
    naming the key (rise_nemo.backends.nemo.keys). rise_14b.yaml repeated loss_fn.ratio_clip_* "kept consistent":
    editing them changed nothing (policy_loss.clip_high trains) and `rise-nemo plan` said OK."""
    with pytest.raises(NemoConfigError, match=re.escape(fragment)):
        validate_nemo_block(_broken(recipe, lambda t: _set(t["nemo"], key, 1)))


@pytest.mark.parametrize("recipe, key", [("opd_14b_teacher32b.yaml", "logger.wandb_enabled"),
                                         ("opd_14b_teacher32b.yaml", "loss_fn.kl_type"),
                                         ("rise_14b.yaml", "policy.generation.vllm_cfg.gpu_memory_utilization"),
                                         ("ppo_math_7b.yaml", "value.megatron_cfg.optimizer.lr"),
                                         ("rise_14b.yaml", "cluster.master_port_range_low"),
                                         ("rise_14b.yaml", "checkpointing.save_consolidated")])
def test_nemo_keys_a_component_reads_pass(recipe, key):
    validate_nemo_block(_broken(recipe, lambda t: _set(t["nemo"], key, 1)))


def test_plan_refuses_a_key_nothing_reads_in_one_line():
    import contextlib
    import io

    from rise_nemo.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["plan", "rise_14b", "++nemo.loss_fn.ratio_clip_max=0.35"])
    assert rc == 2
    assert err.getvalue().strip().splitlines() == [
        "rise-nemo plan: rise_14b: recipe key nemo.loss_fn.ratio_clip_max is set from policy_loss.clip_high; "
        "set it there, not under nemo:"]


@pytest.mark.parametrize("mutate, fragment", [
    (lambda t: t["nemo"].__delitem__("value"), "nemo.value is missing: method 'ppo' trains a value model"),
    (lambda t: t["nemo"]["policy"]["generation"]["colocated"].__setitem__("enabled", False),
     "nemo.policy.generation.colocated.enabled: false, but method 'ppo' trains a value model"),
])
def test_critic_layout_is_refused_naming_the_key(mutate, fragment):
    with pytest.raises(NemoConfigError, match=fragment.replace(".", r"\.").replace("(", r"\(")):
        validate_nemo_block(_broken("ppo_math_7b.yaml", mutate))


def _broken(name: str, mutate) -> dict:
    tree = copy.deepcopy(load(name))
    mutate(tree)
    return tree


@pytest.mark.parametrize("mutate, fragment", [
    (lambda t: t["nemo"]["policy"]["generation"].__setitem__("temperature", 0.7),
     "nemo.policy.generation.temperature is set from sampling.temperature"),
    (lambda t: t["nemo"].__setitem__("adapter", {"importance_sampling": "tis"}),
     "nemo.adapter.importance_sampling: 'tis'"),
    (lambda t: t["nemo"].__setitem__("algorithm", "ppo"), "nemo.algorithm: 'ppo'"),
    (lambda t: t["nemo"]["policy"].__delitem__("model_name"), "nemo.policy.model_name is missing"),
    (lambda t: t["nemo"]["policy"]["generation"].__setitem__("backend", "sglang"), "vllm only"),
    (lambda t: t["nemo"].setdefault("grpo", {}).__setitem__("val_period", 5),
     "nemo.grpo.val_period is set from eval.every"),
    (lambda t: t.__setitem__("nemo", {}), "recipe key nemo: missing or empty"),
    (lambda t: t["nemo"]["policy"]["generation"]["vllm_cfg"].__setitem__("kv_cache_dtype", "fp8"),
     "kv_cache_dtype: fp8 KV cache is not supported"),
    # the async engine seeds every request through our worker; NeMo-RL's ModelOpt worker (quant_cfg) cannot
    (lambda t: t["nemo"]["policy"]["generation"]["vllm_cfg"].__setitem__("async_engine", True)
     or t["nemo"]["policy"]["generation"].__setitem__("quant_cfg", {"algorithm": "fp8"}),
     "nemo.policy.generation.vllm_cfg.async_engine and nemo.policy.generation.quant_cfg"),
])
def test_broken_nemo_block_fails_with_the_key(mutate, fragment):
    with pytest.raises(NemoConfigError, match=fragment.replace(".", r"\.").replace("(", r"\(")):
        validate_nemo_block(_broken("rise_14b.yaml", mutate))


@pytest.mark.parametrize("mutate, fragment", [
    (lambda t: t["nemo"]["policy"]["megatron_cfg"].__setitem__("tensor_model_parallel_size", 3),
     "nemo.policy.megatron_cfg.tensor_model_parallel_size: TP 3 does not divide qwen3-14b's 40 attention heads"),
    (lambda t: t["nemo"]["policy"]["megatron_cfg"].__setitem__("pipeline_model_parallel_size", 3),
     "nemo.policy.megatron_cfg.pipeline_model_parallel_size: PP 3 does not divide qwen3-14b's 40 layers"),
    (lambda t: t["nemo"]["policy"]["megatron_cfg"]["env_vars"].pop("NVTE_FP8_BLOCK_SCALING_FP32_SCALES"),
     "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"),
    (lambda t: t["nemo"]["policy"]["megatron_cfg"].__setitem__("pipeline_model_parallel_size", 1)
     or t["nemo"]["policy"]["megatron_cfg"].__setitem__("tensor_model_parallel_size", 1)
     or t["nemo"]["policy"].__setitem__("max_total_sequence_length", 40000)
     or t["nemo"]["policy"]["generation"]["vllm_cfg"].__setitem__("max_model_len", 40000),
     "training phase needs"),
])
def test_broken_layout_fails_plan_with_the_key(mutate, fragment):
    with pytest.raises(NemoConfigError) as err:
        check_recipe(_broken("rise_14b.yaml", mutate))
    assert fragment in str(err.value)


def test_launch_size_overrides_documented_nodes():
    """A launcher sets nemo.cluster.num_nodes to its allocation: the run is checked at that size."""
    check_recipe(load("rise_14b.yaml", "nemo.cluster.num_nodes=2"))  # TP 4 x PP 2 x DP 2 on 16 GPUs
    report = plan_recipe(load("rise_14b.yaml", "nemo.cluster.num_nodes=2"))
    assert any(str(i).startswith("nemo.cluster.num_nodes") for i in report.issues)  # `plan` flags the doc drift
    with pytest.raises(NemoConfigError, match="does not divide the 24 training GPUs"):
        check_recipe(load("rise_14b.yaml", "nemo.cluster.num_nodes=3",
                          "nemo.policy.megatron_cfg.pipeline_model_parallel_size=4"))


def test_loader_rejects_unknown_top_level_key(tmp_path):
    bad = yaml.safe_load((RECIPES / "rise_14b.yaml").read_text())
    bad["sampling"]["group_sizes"] = 8
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match="sampling.group_sizes"):
        load_config(path)


def test_reasoning_baseline_recipes():
    """PPO (RRL paper settings) and sparse GRPO on math: methods, sampling settings, critic, no judge node."""
    ppo, grpo = load("ppo_math_7b.yaml"), load("grpo_math_qwen3_4b.yaml")
    assert (ppo["method"], grpo["method"]) == ("ppo", "grpo")
    assert (ppo["data"]["format"], grpo["data"]["format"]) == ("math", "math")
    g, s = ppo["policy_loss"], ppo["sampling"]
    assert (g["kl_coef"], s["temperature"], s["top_p"], s["max_new_tokens"]) == (0.001, 0.8, 0.9, 2048)
    assert ppo["nemo"]["policy"]["megatron_cfg"]["optimizer"]["lr"] == 5e-7
    assert ppo["nemo"]["value"]["megatron_cfg"]["optimizer"]["lr"] == 1.5e-6
    assert "value" not in grpo["nemo"] and grpo["policy_loss"]["kl_coef"] == 0.0
    report = plan_recipe(ppo)
    assert report.layout.critic is not None and "critic" in report.phases
    assert report.layout.critic.model.name == "qwen2.5-math-7b" and report.layout.judge is None
    # the critic is a second full model with its own optimizer: its phase holds as much as the policy's
    # weights + grads + optimizer, plus the resident policy
    trains = {t.label: t.gib for t in report.terms if t.phase == "training"}
    critic = {t.label: t.gib for t in report.terms if t.phase == "critic"}
    assert critic["critic weights (bf16)"] == trains["policy weights (bf16)"]
    assert critic["optimizer states (/DP 4)"] == trains["optimizer states (/DP 4)"]
    assert report.phase_total("critic") > report.phase_total("training") - trains["logits + grad (fp32, last stage)"]
    # a critic that cannot fit is reported against the critic's key
    huge = copy.deepcopy(ppo)
    huge["nemo"]["value"]["megatron_cfg"]["tensor_model_parallel_size"] = 3
    bad = plan_recipe(huge)
    assert any(i.key == "nemo.value.megatron_cfg.tensor_model_parallel_size" for i in bad.issues), bad.issues


def test_rrl_recipe_is_the_ppo_baseline_plus_replay():
    """RRL on MATH: the PPO baseline's model, layout and paper settings, plus the paper's replay settings."""
    ppo, rrl = load("ppo_math_7b.yaml"), load("rrl_math_7b.yaml")
    assert rrl["method"] == "rrl" and rrl["backend"] == "nemo"
    g, s = rrl["policy_loss"], rrl["sampling"]
    assert (g["kl_coef"], s["temperature"], s["top_p"], s["max_new_tokens"]) == (0.001, 0.8, 0.9, 2048)
    assert rrl["nemo"]["policy"]["megatron_cfg"]["optimizer"]["lr"] == 5e-7
    assert rrl["nemo"]["value"]["megatron_cfg"]["optimizer"]["lr"] == 1.5e-6
    assert {k: v for k, v in rrl.items() if k not in ("run", "method", "rrl")} == {
        k: v for k, v in ppo.items() if k not in ("run", "method", "rrl")}
    r = rrl["rrl"]
    assert (r["beta"], r["capacity"], r["state_sources"], r["granularity"]) == (0.4, 5, ["policy", "canonical"], "line")
    assert plan_recipe(rrl).layout.critic is not None


def test_exprl_recipes_carry_the_issue_settings():
    o, p, s2 = load("exprl_outcome_qwen3_4b.yaml"), load("exprl_process_qwen3_4b.yaml"), load("exprl_stage2_qwen3_4b.yaml")
    for t in (o, p, s2):
        assert t["nemo"]["policy"]["model_name"] == "Qwen/Qwen3-4B-Instruct-2507"
        assert t["nemo"]["policy"]["megatron_cfg"]["optimizer"]["lr"] == 1e-6
        assert (t["sampling"]["max_new_tokens"], t["sampling"]["temperature"]) == (16384, 0.8)
    for t in (o, p):
        assert t["judge"]["model"] == "Qwen/Qwen3-4B-Instruct-2507" and t["judge"]["type"] == "http"
        assert t["nemo"]["plan"]["judge"]["model"] == "Qwen/Qwen3-4B-Instruct-2507"  # its own vLLM node
        assert t["nemo"]["plan"]["judge"]["nodes"] == 1 and t["policy_loss"]["kl_coef"] == 0.001
        assert t["sampling"]["prompts_per_step"] == 36
        assert t["nemo"]["policy"]["train_global_batch_size"] == 36 * t["sampling"]["group_size"]
    assert (o["method"], o["sampling"]["group_size"], o["policy_loss"]["clip_low"], o["policy_loss"]["clip_high"]) == (
        "exprl_outcome", 10, 0.2, 0.28)
    assert (p["method"], p["sampling"]["group_size"], p["policy_loss"]["clip_low"], p["policy_loss"]["clip_high"]) == (
        "exprl_process", 16, 0.2, 0.26)
    assert (s2["method"], s2["sampling"]["group_size"], s2["sampling"]["prompts_per_step"], s2["policy_loss"]["kl_coef"],
            s2["train"]["steps"]) == ("grpo", 32, 32, 0.0, 500)


def test_apps_recipes_are_the_math_setup_on_code():
    """RRL and its PPO baseline on APPS with DeepSeek-Coder-6.7B-Instruct: the paper's settings of the
    math recipes, the APPS format (graded by the sandboxed unit-test reward), the coder model, replay as RRL."""
    ppo, rrl, math = (load(n) for n in ("ppo_apps_deepseek_coder_6.7b.yaml", "rrl_apps_deepseek_coder_6.7b.yaml",
                                         "ppo_math_7b.yaml"))
    assert (ppo["method"], rrl["method"]) == ("ppo", "rrl")
    for tree in (ppo, rrl):
        assert tree["data"]["format"] == "apps" and all(tree[b] == math[b] for b in ("sampling", "policy_loss"))
        assert tree["nemo"]["policy"]["model_name"] == "deepseek-ai/deepseek-coder-6.7b-instruct"
        assert tree["nemo"]["value"] == math["nemo"]["value"]
        report = plan_recipe(tree)
        assert report.layout.critic.model.name == "deepseek-coder-6.7b" and report.layout.judge is None
    assert rrl["rrl"] == load("rrl_math_7b.yaml")["rrl"]
    assert {k: v for k, v in rrl.items() if k not in ("rrl", "method", "run")} == {
        k: v for k, v in ppo.items() if k not in ("rrl", "method", "run")}


def test_hh_recipes_are_the_math_setup_on_hh_with_a_reward_model():
    """RRL and its PPO baseline on HH-RLHF with Llama-2-7B: the paper's PPO settings of the math recipes, the
    HH format, the reward model's raw score as the reward (NeMo-RL's RewardModelEnvironment, mapped from the
    reward_model: block), training on 4 GPUs so the node's others hold the reward model, replay as RRL with
    token states."""
    from rise_nemo.backends.nemo.reward_model import reward_model_env_config

    ppo, rrl, math = (load(n) for n in ("ppo_hh_llama2_7b.yaml", "rrl_hh_llama2_7b.yaml", "ppo_math_7b.yaml"))
    assert (ppo["method"], rrl["method"]) == ("ppo", "rrl")
    for tree in (ppo, rrl):
        assert tree["data"]["format"] == "hh_rlhf"
        assert all(tree[b] == math[b] for b in ("sampling", "policy_loss", "advantage"))
        assert tree["reward"]["scorer"] == "reward_model" and tree["reward_model"]["normalize"] == "none"
        assert tree["nemo"]["policy"]["model_name"] == "meta-llama/Llama-2-7b-hf"
        assert tree["nemo"]["value"] == math["nemo"]["value"]
        report = plan_recipe(tree)
        assert report.layout.critic.model.name == "llama-2-7b" and report.layout.judge is None
        env = reward_model_env_config(tree)
        assert tree["nemo"]["cluster"]["gpus_per_node"] + env["resources"]["gpus_per_node"] <= 8
        assert env["model_name"] == tree["reward_model"]["path"] and env["precision"] == "bfloat16"
    assert {k: v for k, v in rrl["rrl"].items() if k != "granularity"} == {
        k: v for k, v in load("rrl_math_7b.yaml")["rrl"].items() if k != "granularity"}
    assert rrl["rrl"]["granularity"] == "token"
    assert {k: v for k, v in rrl.items() if k not in ("rrl", "method", "run")} == {
        k: v for k, v in ppo.items() if k not in ("rrl", "method", "run")}


def test_hh_prompt_template_renders_hh_transcripts():
    """The policy sees an HH dialogue exactly as the HH transcripts write it, ending with "Assistant:"."""
    from jinja2 import Template

    from rise_nemo.data.hh_rlhf import split_transcript

    text = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: Tell me a joke\n\nAssistant: No."
    prefix, messages, _ = split_transcript(text)
    template = load("ppo_hh_llama2_7b.yaml")["nemo"]["policy"]["tokenizer"]["chat_template"]
    assert Template(template).render(messages=list(messages), add_generation_prompt=True) == prefix


def test_shape_mismatch_names_the_key_omegaconf_does_not():
    """OmegaConf's merge says only "Cannot merge DictConfig with ListConfig"; build_master_config reports the
    recipe key (a DTensor scheduler written as a mapping over NeMo-RL's list of schedulers)."""
    from rise_nemo.backends.nemo.config import shape_mismatch

    base = {"policy": {"scheduler": [{"name": "LinearLR"}], "optimizer": {"kwargs": {"lr": 1.0}}}}
    assert shape_mismatch(base, {"policy": {"scheduler": {"name": "ConstantLR"}}}) == "policy.scheduler"
    assert shape_mismatch(base, {"policy": {"optimizer": [1]}}) == "policy.optimizer"
    assert shape_mismatch(base, {"policy": {"scheduler": [{"name": "X"}], "optimizer": {"kwargs": {"lr": 2}}}}) is None
