"""The nemo backend against NeMo-RL's own code (skipped unless ``nemo_rl`` is importable).

Setup: inside the NeMo-RL container (``pytest tests/nemo``), or on a CPU machine with a NeMo-RL v0.7 source
checkout on PYTHONPATH and its pure-Python dependencies installed (see docs/nemo_rl.md "Running on NeMo-RL").

- the loss adapter through NeMo-RL's input preparation (logits -> next-token log-probs) equals NeMo-RL's
  ClippedPGLossFn on a natural-only batch (same clip, token-level, KL 0), in value and gradient;
- the adapter unpickles in a fresh process with NeMo-RL's enums;
- ``build_backend()`` merges a recipe into a real NeMo-RL example config and passes NeMo-RL's MasterConfig, then the
  RISE loop runs on mocked NeMo-RL policy/generation the way NeMo-RL's tests/unit/algorithms/test_grpo.py
  drives grpo_train (MagicMock objects, refit_policy_generation patched on the grpo module);
- the rubric environment runs as a Ray actor inside NeMo-RL's run_multi_turn_rollout.
"""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
from pathlib import Path
from unittest.mock import MagicMock

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from nemo_venv import import_nemo_rl  # noqa: E402

nemo_rl = import_nemo_rl()
pytestmark = pytest.mark.nemo

from cpu_nemo import Bigram, CpuVllm, make_prompts, make_tokenizer, write_jsonl  # noqa: E402

from rise_nemo.backends.nemo.loss import RiseLossFunction  # noqa: E402
from rise_nemo.core.losses import ObjectiveConfig, policy_objective  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)


def prepare_fn():
    """NeMo-RL's prepare_loss_input; its non-parallel path moves tensors to CUDA, so on a CPU-only machine
    the same computation (log-softmax over the vocabulary, gather the next token) is done here."""
    from nemo_rl.algorithms.loss import prepare_loss_input

    if torch.cuda.is_available():
        return prepare_loss_input

    def cpu_prepare(logits, data, loss_fn, **_):
        logp = torch.log_softmax(logits.float(), dim=-1)[:, :-1]
        return {"next_token_logprobs": logp.gather(-1, data["input_ids"][:, 1:, None]).squeeze(-1)}, data

    return cpu_prepare


def _natural_batch(b=6, t=16, vocab=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    token_mask = torch.zeros(b, t)
    for i in range(b):
        token_mask[i, 3 + i % 3: t - i % 4] = 1
    data = {
        "input_ids": torch.randint(0, vocab, (b, t), generator=g),
        "input_lengths": torch.full((b,), t),
        "token_mask": token_mask,
        "sample_mask": torch.ones(b),
        "kind": torch.zeros(b, dtype=torch.long),
        "advantages": torch.randn(b, generator=g),
        "prev_logprobs": -torch.rand(b, t, generator=g) * 2 - 1,
        "generation_logprobs": -torch.rand(b, t, generator=g) * 2 - 1,
    }
    n_tok = float(token_mask[:, 1:].sum())
    data["natural_token_count"] = torch.full((b,), n_tok)
    data["guided_seq_count"] = torch.zeros(b)
    return data


@pytest.mark.parametrize("kl", [0.0, 0.001, 0.3])
def test_adapter_equals_clipped_pg_loss_through_nemo_input_preparation(kl):
    """KL 0 and k3 KL penalties (NeMo-RL's KL carries exp(logp - logp.detach()) and clamps;
    at 0.3 some tokens hit the output clamp) through NeMo-RL's own input preparation, in value and gradient."""
    from nemo_rl.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
    from nemo_rl.algorithms.loss.interfaces import LossInputType, LossType
    from nemo_rl.algorithms.loss.wrapper import wrap_loss_fn_with_input_preparation
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    data = _natural_batch()
    vocab = 32
    g = torch.Generator().manual_seed(7)
    data["reference_policy_logprobs"] = -torch.rand(data["input_ids"].shape, generator=g) * 16 - 0.1
    logits = torch.randn(*data["input_ids"].shape, vocab, generator=torch.Generator().manual_seed(1), requires_grad=True)
    ours = RiseLossFunction(functools.partial(policy_objective, cfg=ObjectiveConfig(clip_low=0.2, clip_high=0.28,
                                                                                   lambda_guide=0.0, kl_coef=kl)))
    assert ours.input_type is LossInputType.LOGPROB and ours.loss_type is LossType.TOKEN_LEVEL
    theirs = ClippedPGLossFn(ClippedPGLossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28,
                                                 reference_policy_kl_penalty=kl, token_level_loss=True))
    nemo_data = BatchedDataDict({**data, "advantages": data["advantages"][:, None].expand_as(data["token_mask"]).clone()})
    gvt = (data["token_mask"][:, 1:] * data["sample_mask"][:, None]).sum()
    gvs = data["sample_mask"].sum()

    def run(fn, d):
        # Megatron's post-processor passes logits [B, S, V]; prepare_loss_input turns them into next-token
        # log-probs [B, S-1] for LOGPROB losses.
        return wrap_loss_fn_with_input_preparation(logits, BatchedDataDict(dict(d)), gvs, gvt, loss_fn=fn,
                                                   prepare_fn=prepare_fn())

    our_loss, our_metrics = run(ours, BatchedDataDict(data))
    their_loss, _ = run(theirs, nemo_data)
    assert float(our_loss) == pytest.approx(float(their_loss), rel=1e-5, abs=1e-7)
    g_ours, = torch.autograd.grad(our_loss, logits)
    g_theirs, = torch.autograd.grad(their_loss, logits)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-4, atol=1e-7)
    assert our_metrics["loss"] == pytest.approx(float(our_loss))


def test_adapter_unpickles_with_nemo_enums_in_a_fresh_process(tmp_path):
    fn = RiseLossFunction(functools.partial(policy_objective, cfg=ObjectiveConfig()))
    path = tmp_path / "loss.pkl"
    path.write_bytes(pickle.dumps(fn))
    code = (
        "import pickle, sys\n"
        "from nemo_rl.algorithms.loss.interfaces import LossInputType, LossType\n"
        f"fn = pickle.loads(open({str(path)!r}, 'rb').read())\n"
        "assert fn.input_type is LossInputType.LOGPROB and fn.loss_type is LossType.TOKEN_LEVEL\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def _mock_generation(vllm: CpuVllm):
    """MagicMock with VllmGeneration's spec whose generate answers like the real engine (shapes matter)."""
    from nemo_rl.models.generation.vllm import VllmGeneration

    gen = MagicMock(spec=VllmGeneration)
    vllm.awake = True
    gen.generate.side_effect = lambda data, greedy=False: vllm.generate(data, greedy)
    return gen


def _mock_policy(dp: int):
    """Like test_grpo's mock policy; get_logprobs/train answer with the right shapes, train runs the loss
    through NeMo-RL's input preparation on random logits (so the adapter meets NeMo-RL's real code)."""
    from nemo_rl.algorithms.loss.wrapper import wrap_loss_fn_with_input_preparation

    policy = MagicMock()
    policy.sharding_annotations.get_axis_size.return_value = dp
    policy.get_logprobs.side_effect = lambda data, **k: {"logprobs": torch.zeros(data["input_ids"].shape)}

    def train(data, loss_fn, gbs=None, mbs=None, **k):
        vocab = int(data["input_ids"].max()) + 1
        logits = torch.randn(*data["input_ids"].shape, vocab, requires_grad=True)
        mask = data["token_mask"][:, 1:] * data["sample_mask"][:, None]
        loss, metrics = wrap_loss_fn_with_input_preparation(logits, data, data["sample_mask"].sum(), mask.sum(),
                                                            loss_fn=loss_fn, prepare_fn=prepare_fn())
        loss.backward()
        return {"loss": loss.detach(), "grad_norm": torch.tensor(1.0),
                "all_mb_metrics": {k2: [v] for k2, v in metrics.items()}}

    policy.train.side_effect = train
    return policy


def test_build_and_rise_loop_on_mocked_nemo_rl(tmp_path, monkeypatch):
    from nemo_rl.algorithms import grpo as grpo_mod
    from nemo_rl.algorithms.loss.interfaces import LossInputType
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    import rise_nemo.backends.nemo as nemo_backend
    from rise_nemo.config.loader import load_config
    from rise_nemo.judges import build_judge
    from rise_nemo.loop.data import load_prompts
    from rise_nemo.loop.trainer import Trainer

    nemo_dir = Path(nemo_rl.__file__).resolve().parents[1]
    if not (nemo_dir / "examples" / "configs" / "grpo_math_1B_megatron.yaml").exists():
        pytest.skip("NeMo-RL example configs not found next to nemo_rl (need a source checkout or the container)")
    monkeypatch.setenv("NEMO_RL_DIR", str(nemo_dir))
    tok = make_tokenizer()
    vllm = CpuVllm(len(tok), 10, tok.pad_token_id, tok.eos_token_id, [])
    vllm.model = Bigram(len(tok))
    generation, policy = _mock_generation(vllm), _mock_policy(dp=2)
    seen: dict = {}

    def fake_setup(master_config, tokenizer, dataset, val_dataset, policy_factory=None, **k):
        seen["master"], seen["dataset"], seen["factory"] = master_config, dataset, policy_factory
        return (policy, generation, None, (None, None), None, None, None, None, None, None, master_config, {}, {})

    refits = []
    monkeypatch.setattr(grpo_mod, "setup", fake_setup)
    monkeypatch.setattr(grpo_mod, "refit_policy_generation", lambda *a, **k: refits.append(1))
    monkeypatch.setattr("nemo_rl.distributed.virtual_cluster.init_ray", lambda *a, **k: None)
    monkeypatch.setattr("nemo_rl.algorithms.utils.get_tokenizer", lambda *a, **k: tok)

    train = write_jsonl(tmp_path / "train.jsonl", make_prompts(4))
    evalp = write_jsonl(tmp_path / "eval.jsonl", make_prompts(2, 4))
    cfg = load_config(REPO / "recipes" / "rise_4b.yaml", [
        f"run.dir={tmp_path / 'run'}", "sampling.prompts_per_step=2", "sampling.group_size=4", "sampling.max_new_tokens=10",
        "rise.privileged_group_size=4", "rise.schedule.mode=fixed", "reward.overlong_buffer=0", "train.steps=2", "train.progress=false",
        "train.tensorboard=false", "eval.every=0", "eval.at_start=false", f"data.train_path={train}",
        f"data.eval_path={evalp}", "judge={type: rule}",
    ])
    train_prompts, eval_prompts = load_prompts(cfg)
    policy_if, generator_if = nemo_backend.build_backend(cfg, train_prompts=train_prompts)

    master = seen["master"]
    assert isinstance(master, grpo_mod.MasterConfig)  # NeMo-RL's pydantic config accepted the merge
    assert master.policy["megatron_cfg"]["tensor_model_parallel_size"] == 2
    assert master.policy["generation"]["max_new_tokens"] == 10 and master.grpo["num_generations_per_prompt"] == 4
    assert master.loss_fn.reference_policy_kl_penalty == 0.0
    assert master.policy["megatron_cfg"]["fp8_cfg"]["fp8_recipe"] == "blockwise"
    assert len(seen["dataset"]) == 4 and seen["dataset"][0]["task_name"] == "rubric"
    assert master.grpo["max_num_steps"] == 2 and master.grpo["max_num_epochs"] == 2  # scheduler = train.steps

    trainer = Trainer(cfg, policy_if, generator_if, build_judge(cfg.judge), train_prompts, eval_prompts,
                      run_dir=tmp_path / "run")
    assert trainer.run() == 0
    assert len(refits) == 2 + 1  # one per training step + the final evaluation's window
    assert policy.train.call_count == 2
    data, loss_fn = policy.train.call_args.args[:2]
    assert isinstance(data, BatchedDataDict) and isinstance(loss_fn, RiseLossFunction)
    assert loss_fn.input_type is LossInputType.LOGPROB
    assert policy.train.call_args.kwargs["gbs"] == data["input_ids"].shape[0]
    names = [c[0] for c in generation.method_calls]
    assert names.count("generate") >= 4 and "finish_generation" in names


def test_rubric_environment_inside_nemo_rollout(tmp_path):
    import ray
    from nemo_rl.data.collate_fn import rl_collate_fn
    from nemo_rl.environments.utils import create_env
    from nemo_rl.experience.rollouts import run_multi_turn_rollout
    from private_ray import init_local

    from rise_nemo.backends.nemo import register_rubric_environment
    from rise_nemo.backends.nemo.environment import rubric_datum
    from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoSession
    from rise_nemo.core.rewards import rubric_reward
    from rise_nemo.interfaces import JudgeRequest
    from rise_nemo.judges.rule import RuleJudge

    # always a private cluster on 127.0.0.1, never one another process on the machine started
    init_local(num_cpus=2, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    try:
        tok = make_tokenizer()
        session = NemoSession(None, None, tok, {"policy": {"generation": {
            "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 10, "colocated": {"enabled": True}}}},
            refit=lambda *a, **k: None)
        encode = NemoGenerator(session).encode_prompt
        prompts = make_prompts(4)
        batch = rl_collate_fn([rubric_datum(p, encode, i) for i, p in enumerate(prompts)])
        register_rubric_environment("rubric")
        env = create_env("rubric", {"type": "rule"})
        vllm = CpuVllm(len(tok), 10, tok.pad_token_id, tok.eos_token_id, [])
        vllm.awake = True
        out, metrics = run_multi_turn_rollout(vllm, batch, tok, {"rubric": env}, max_seq_len=256, max_rollout_turns=1)
        judge = RuleJudge()
        for i, p in enumerate(prompts):
            response = out["message_log"][i][1]["content"]
            verdicts = judge.judge([JudgeRequest(list(p.messages), response, p.rubric)])[0]
            want = float(rubric_reward(torch.tensor(verdicts), torch.tensor(p.rubric.weights)))
            assert float(out["total_reward"][i]) == pytest.approx(want)
        assert metrics  # NeMo-RL computed its rollout metrics over our rewards
    finally:
        ray.shutdown()


@pytest.mark.parametrize("overrides, refused", [
    (["rise.pipeline=true"], "rise.pipeline: true"),
    (["sampling.request_seeds=true"], "sampling.request_seeds: true"),
    (["rise.pipeline=true", "sampling.request_seeds=true"], "sampling.request_seeds: true (a seed per request) and "
                                                             "rise.pipeline: true"),
])
def test_keys_only_the_async_engine_serves_are_refused_at_the_master_config(overrides, refused, tmp_path,
                                                                             monkeypatch):
    """rise_14b on NeMo-RL's synchronous vLLM engine (its base config's default) with a key only the async engine
    serves: refused when the master config is built, before any worker starts, naming both keys. It used to fail on
    the first step, once the cluster was built and the models loaded. With the async engine the same keys pass."""
    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.config import NemoConfigError, build_master_config
    from rise_nemo.config.loader import load_config

    monkeypatch.setenv("NEMO_RL_DIR", str(Path(nemo_rl.__file__).resolve().parents[1]))
    recipe = plain_recipe(load_config(REPO / "recipes" / "rise_14b.yaml", overrides))
    with pytest.raises(NemoConfigError, match="async_engine is false") as err:
        build_master_config(recipe, str(tmp_path))
    assert refused in str(err.value) and "nemo.policy.generation.vllm_cfg.async_engine: true" in str(err.value)
    build_master_config(plain_recipe(load_config(REPO / "recipes" / "rise_14b.yaml", overrides + [
        "++nemo.policy.generation.vllm_cfg.async_engine=true"])), str(tmp_path))
    # auto (the default) picks what the engine can do; a method without the rubric step does not read rise.pipeline
    build_master_config(plain_recipe(load_config(REPO / "recipes" / "rise_14b.yaml")), str(tmp_path))
    build_master_config(plain_recipe(load_config(REPO / "recipes" / "opd_14b_teacher32b.yaml",
                                                 ["rise.pipeline=true"])), str(tmp_path))


@pytest.mark.parametrize("name", ["rise_4b.yaml", "rise_14b.yaml", "ruscarl_14b.yaml", "opd_14b_teacher32b.yaml",
                                  "opd_4b_teacher14b.yaml"])
def test_recipes_pass_nemo_rl_master_config(name, tmp_path, monkeypatch):
    """Every recipe's nemo: block merged over its NeMo-RL example config is accepted by NeMo-RL's own
    MasterConfig (GRPO or distillation) and keeps the recipe's layout."""
    from nemo_rl.algorithms import distillation, grpo

    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.config import algorithm, build_master_config
    from rise_nemo.config.loader import load_config

    nemo_dir = Path(nemo_rl.__file__).resolve().parents[1]
    if not (nemo_dir / "examples" / "configs").exists():
        pytest.skip("NeMo-RL example configs not found next to nemo_rl")
    monkeypatch.setenv("NEMO_RL_DIR", str(nemo_dir))
    recipe = plain_recipe(load_config(REPO / "recipes" / name))
    tree = build_master_config(recipe, str(tmp_path))
    cls = distillation.MasterConfig if algorithm(recipe) == "distillation" else grpo.MasterConfig
    master = cls(**tree)
    mc = master.policy["megatron_cfg"]
    want = recipe["nemo"]["policy"]["megatron_cfg"]
    assert (mc["tensor_model_parallel_size"], mc["pipeline_model_parallel_size"], mc["sequence_parallel"]) == (
        want["tensor_model_parallel_size"], want["pipeline_model_parallel_size"], want["sequence_parallel"])
    assert master.policy["generation"]["max_new_tokens"] == recipe["sampling"]["max_new_tokens"]
    assert master.cluster["num_nodes"] == recipe["nemo"]["cluster"]["num_nodes"]
    if algorithm(recipe) == "distillation":
        assert master.teacher["megatron_cfg"]["tensor_model_parallel_size"] == (
            recipe["nemo"]["teacher"]["megatron_cfg"]["tensor_model_parallel_size"])


def test_distill_entry_point_drives_nemo_distillation(tmp_path, monkeypatch):
    """OPD: rise_nemo hands NeMo-RL's distillation setup/train our rubric datums and the rubric environment."""
    from nemo_rl.algorithms import distillation

    from rise_nemo.cli import main as cli_main

    nemo_dir = Path(nemo_rl.__file__).resolve().parents[1]
    if not (nemo_dir / "examples" / "configs" / "distillation_math_megatron.yaml").exists():
        pytest.skip("NeMo-RL example configs not found next to nemo_rl")
    monkeypatch.setenv("NEMO_RL_DIR", str(nemo_dir))
    tok = make_tokenizer()
    seen: dict = {}

    def fake_setup(master, tokenizer, train, val):
        seen["master"], seen["train"], seen["val"] = master, train, val
        return ("student", "teacher", "generation", None, "dl", "vdl", "loss", "logger", "ckpt", "state", master)

    monkeypatch.setattr(distillation, "setup", fake_setup)
    monkeypatch.setattr(distillation, "distillation_train", lambda *a: seen.__setitem__("train_args", a))
    monkeypatch.setattr("nemo_rl.distributed.virtual_cluster.init_ray", lambda *a, **k: None)
    monkeypatch.setattr("nemo_rl.algorithms.utils.get_tokenizer", lambda *a, **k: tok)
    monkeypatch.setattr("nemo_rl.environments.utils.create_env", lambda name, cfg: seen.setdefault("env", (name, cfg)))
    train = write_jsonl(tmp_path / "train.jsonl", make_prompts(5))
    evalp = write_jsonl(tmp_path / "eval.jsonl", make_prompts(2, 5))
    rc = cli_main(["distill", "--config", str(REPO / "recipes" / "opd_4b_teacher14b.yaml"), f"run.dir={tmp_path / 'run'}",
                   f"data.train_path={train}", f"data.eval_path={evalp}", "judge={type: rule}"])
    assert rc == 0
    assert isinstance(seen["master"], distillation.MasterConfig)
    assert len(seen["train"]) == 512 and len(seen["val"]) == 2  # padded to one batch of num_prompts_per_step
    assert seen["env"][0] == "rubric" and seen["env"][1]["type"] == "rule"
    args = seen["train_args"]
    assert args[:3] == ("student", "teacher", "generation") and set(args[7]) == {"rubric"}
    # the recipe next to NeMo-RL's checkpoints, for `rise-nemo eval RUN_DIR`
    assert "algorithm: distillation" in (tmp_path / "run" / "config.yaml").read_text()


# ----------------------------------------------------------------------------------------------------------
# The cluster-path defects checked against NeMo-RL's real code (the CPU versions, with stand-ins,
# are in test_cluster_path.py).


def _megatron_like_policy_dir(root: Path, with_optimizer: bool, component: str = "policy") -> Path:
    """A policy (or value) checkpoint as the Megatron worker leaves it: optimizer state embedded in
    weights/iter_0000000/common.pt, no optimizer directory (megatron_policy_worker.py:1704-1724; the value
    worker saves the same way, megatron_value_worker.py:964-1010)."""
    common = root / component / "weights" / "iter_0000000" / "common.pt"
    common.parent.mkdir(parents=True)
    torch.save({"iteration": 0, **({"optimizer": {"param_groups": []}} if with_optimizer else {})}, common)
    return root


def test_resume_paths_equal_nemo_rl_checkpoint_manager(tmp_path):
    """Item 1: our resume rule gives what NeMo-RL's CheckpointManager.get_resume_paths gives."""
    import warnings

    from nemo_rl.utils.checkpoint import CheckpointManager

    from rise_nemo.backends.nemo import resume_paths

    dtensor = tmp_path / "dtensor"
    (dtensor / "policy" / "optimizer").mkdir(parents=True)
    for step_dir in (_megatron_like_policy_dir(tmp_path / "megatron", True),
                     _megatron_like_policy_dir(tmp_path / "no_optim", False), dtensor):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = CheckpointManager.get_resume_paths(step_dir)
        ours = resume_paths(step_dir / "policy")
        assert ours == tuple(None if p is None else str(p) for p in theirs), step_dir
    assert resume_paths(tmp_path / "megatron" / "policy")[1] is not None  # load_optim on resume


def _session_with_real_refit(monkeypatch):
    """NemoSession on MagicMock policy/vLLM with NeMo-RL's real refit_policy_generation (colocated)."""
    from nemo_rl.algorithms import grpo as grpo_mod

    from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoPolicy, NemoSession

    class _Ray:
        @staticmethod
        def get(x):
            return [True]

    monkeypatch.setattr(grpo_mod, "ray", _Ray)
    tok = make_tokenizer()
    vllm = CpuVllm(len(tok), 10, tok.pad_token_id, tok.eos_token_id, [])
    generation = _mock_generation(vllm)
    policy = MagicMock()
    policy.sharding_annotations.get_axis_size.return_value = 2
    cfg = {"policy": {"train_micro_batch_size": 2, "logprob_batch_size": 2, "train_global_batch_size": 32,
                      "make_sequence_length_divisible_by": 4, "tokenizer": {"name": "w"}, "refit_buffer_size_gb": 1,
                      "generation": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 10,
                                     "colocated": {"enabled": True}, "stop_token_ids": None}}}
    session = NemoSession(policy, generation, tok, cfg, refit=grpo_mod.refit_policy_generation)
    return session, NemoPolicy(session, behaviour_ratio=False), NemoGenerator(session), policy


def test_save_after_real_refit_reloads_weights_first(tmp_path, monkeypatch):
    """Item 2: NeMo-RL's refit ends with policy.offload_after_refit (grpo.py:1961-1962); saving after an
    evaluation's window must call prepare_for_training first, as grpo_train does (grpo.py:2886)."""
    from rise_nemo.interfaces import SamplingParams

    session, policy_if, generator, policy = _session_with_real_refit(monkeypatch)
    generator.generate([list(p.messages) for p in make_prompts(2)], 2, SamplingParams(10, 1.0, 1.0))
    policy_if.save_checkpoint(tmp_path / "policy")
    names = [c[0] for c in policy.method_calls]
    assert "offload_after_refit" in names  # the real refit offloaded Megatron
    last_offload = max(i for i, n in enumerate(names) if n == "offload_after_refit")
    assert names.index("prepare_for_training", last_offload) < names.index("save_checkpoint", last_offload)


@pytest.mark.parametrize("name", ["opd_14b_teacher32b.yaml", "opd_4b_teacher14b.yaml"])
def test_opd_master_config_checkpoints(name, tmp_path, monkeypatch):
    """Item 3: NeMo-RL's distillation MasterConfig accepts the derived checkpointing block and its
    CheckpointManager is built from it (enabled, save_period, newest keep_top_k, no metric)."""
    from nemo_rl.algorithms import distillation
    from nemo_rl.utils.checkpoint import CheckpointManager

    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.config import build_master_config
    from rise_nemo.config.loader import load_config

    nemo_dir = Path(nemo_rl.__file__).resolve().parents[1]
    if not (nemo_dir / "examples" / "configs").exists():
        pytest.skip("NeMo-RL example configs not found next to nemo_rl")
    monkeypatch.setenv("NEMO_RL_DIR", str(nemo_dir))
    recipe = plain_recipe(load_config(REPO / "recipes" / name))
    master = distillation.MasterConfig(**build_master_config(recipe, str(tmp_path)))
    ck = master.checkpointing
    assert ck["enabled"] is True and ck["metric_name"] is None
    assert ck["save_period"] == recipe["train"]["checkpoint_every"]
    assert ck["keep_top_k"] == recipe["train"]["keep_checkpoints"]
    manager = CheckpointManager(ck)
    assert manager.keep_top_k == recipe["train"]["keep_checkpoints"] and manager.metric_name is None


def test_behaviour_ratio_reference_through_clipped_pg_loss():
    """Item 4: NeMo-RL's ClippedPGLossFn takes prev_logprobs as pi_old. A coupled privileged row (sampled under
    the hinted prompt, placeholder sampler log-probs 0.0) must keep the trainer's log-probs as its reference,
    so with the current policy = the old policy every ratio is exactly 1 (before: exp(log p) < 1, clipped)."""
    from nemo_rl.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
    from nemo_rl.algorithms.loss.wrapper import wrap_loss_fn_with_input_preparation
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    from rise_nemo.backends.nemo.batch import to_nemo_train_batch

    data = _natural_batch(b=4)
    logits = torch.randn(*data["input_ids"].shape, 32, generator=torch.Generator().manual_seed(2))
    curr, _ = prepare_fn()(logits, BatchedDataDict(dict(data)), None)
    curr = torch.cat([torch.zeros(4, 1), curr["next_token_logprobs"]], dim=1)  # our convention, column 0 = 0
    data["prev_logprobs"] = curr.clone()  # the trainer's recomputed log-probs = the current policy
    data["generation_logprobs"] = curr.clone()
    data["generation_logprobs"][1] = 0.0  # row 1: coupled privileged row, placeholder sampler log-probs
    data["sampled_under_train_prompt"] = torch.tensor([1.0, 0.0, 1.0, 1.0])
    for k in ("natural_token_count", "guided_seq_count"):
        del data[k]
    train, _ = to_nemo_train_batch(data, 1, 1, 1, 0, behaviour_ratio=True, global_batch_size=4)
    train["advantages"] = train["advantages"][:, None].expand_as(train["token_mask"]).clone()
    mask = train["token_mask"][:, 1:] * train["sample_mask"][:, None]
    loss_fn = ClippedPGLossFn(ClippedPGLossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28,
                                                  reference_policy_kl_penalty=0.0, token_level_loss=True))
    _, metrics = wrap_loss_fn_with_input_preparation(logits, BatchedDataDict(train), train["sample_mask"].sum(),
                                                     mask.sum(), loss_fn=loss_fn, prepare_fn=prepare_fn())
    assert float(metrics["probs_ratio_min"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["probs_ratio_max"]) == pytest.approx(1.0, abs=1e-5)


def test_real_policy_train_gets_a_constant_gbs(monkeypatch):
    """Item 6: NeMo-RL's Policy.train forwards gbs to the workers, whose LR scheduler steps by it once per call
    (megatron_policy_worker.py:801-806) against warmup = iters x train_global_batch_size; our steps, with
    different row counts, must all train with gbs == train_global_batch_size, sharded by NeMo-RL itself."""
    from nemo_rl.models.policy.lm_policy import Policy

    from rise_nemo.backends.nemo.runtime import NemoPolicy, NemoSession

    real = Policy.__new__(Policy)
    real.cfg = {"train_global_batch_size": 32, "train_micro_batch_size": 2}
    real.use_dynamic_batches, real.use_sequence_packing, real.flops_tracker = False, False, None
    real.sharding_annotations = MagicMock()
    real.sharding_annotations.get_axis_size.return_value = 2
    seen = []

    def run_sharded(method, data, common_kwargs, **k):
        seen.append((common_kwargs["gbs"], [int(s["input_ids"].shape[0]) for s in data]))
        return []

    real.worker_group = MagicMock()
    real.worker_group.run_all_workers_sharded_data.side_effect = run_sharded
    real.worker_group.get_all_worker_results.return_value = [
        {"global_loss": torch.tensor(0.0), "grad_norm": torch.tensor(1.0), "all_mb_metrics": {"loss": [0.0]}}]
    tok = make_tokenizer()
    cfg = {"policy": {"train_micro_batch_size": 2, "logprob_batch_size": 2, "train_global_batch_size": 32,
                      "make_sequence_length_divisible_by": 4, "tokenizer": {"name": "w"},
                      "generation": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 10,
                                     "colocated": {"enabled": True}, "stop_token_ids": None}}}
    session = NemoSession(real, MagicMock(), tok, cfg, refit=lambda *a, **k: None)
    monkeypatch.setattr(real, "prepare_for_training", lambda *a, **k: None, raising=False)
    policy_if = NemoPolicy(session, behaviour_ratio=False)
    for rows in (8, 20, 12):
        data = _natural_batch(b=rows)
        for k in ("natural_token_count", "guided_seq_count", "generation_logprobs"):
            del data[k]
        policy_if.train(data, functools.partial(policy_objective, cfg=ObjectiveConfig()))
    assert [gbs for gbs, _ in seen] == [32, 32, 32]  # one scheduler iteration per step
    assert all(shards == [16, 16] for _, shards in seen)  # NeMo-RL's own DP sharding of the padded batch


def _opd_recipe_paths(tmp_path, monkeypatch):
    nemo_dir = Path(nemo_rl.__file__).resolve().parents[1]
    if not (nemo_dir / "examples" / "configs" / "distillation_math_megatron.yaml").exists():
        pytest.skip("NeMo-RL example configs not found next to nemo_rl")
    monkeypatch.setenv("NEMO_RL_DIR", str(nemo_dir))
    return [f"run.dir={tmp_path / 'opd'}", "judge={type: rule}",
            f"data.train_path={write_jsonl(tmp_path / 'train.jsonl', make_prompts(4))}",
            f"data.eval_path={write_jsonl(tmp_path / 'eval.jsonl', make_prompts(2, 4))}"]


def test_opd_eval_takes_the_checkpoint_nemo_rl_resumes_from(tmp_path, monkeypatch):
    """Item 3's end goal: NeMo-RL's own CheckpointManager, configured from the OPD recipe (the distillation
    MasterConfig rise_nemo builds), saves steps the way distillation_train does; `rise-nemo eval`'s layout
    lists the same finished checkpoints and picks the one NeMo-RL's get_latest_checkpoint_path resumes from.
    (keep_checkpoints=0, "keep all", used to give keep_top_k=None, which NeMo-RL's MasterConfig refuses.)"""
    from nemo_rl.algorithms import distillation
    from nemo_rl.utils.checkpoint import CheckpointManager

    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.checkpoints import NEMO_RL_LAYOUT, nemo_rl_step
    from rise_nemo.backends.nemo.config import build_master_config
    from rise_nemo.config.loader import load_config
    from rise_nemo.loop.checkpoint import checkpoint_layout

    cfg = load_config(REPO / "recipes" / "opd_4b_teacher14b.yaml", _opd_recipe_paths(tmp_path, monkeypatch)
                      + ["train.keep_checkpoints=0"])
    run_dir = tmp_path / "opd"
    master = distillation.MasterConfig(**build_master_config(plain_recipe(cfg), str(run_dir)))
    manager = CheckpointManager(master.checkpointing)
    for step in (2, 9, 10, 12):
        path = Path(manager.init_tmp_checkpoint(step, {"total_steps": step}, master))
        (path / "policy" / "weights").mkdir(parents=True)
        if step != 12:  # 12: killed before finalize_checkpoint
            manager.finalize_checkpoint(path)
    assert checkpoint_layout(cfg) is NEMO_RL_LAYOUT
    latest = NEMO_RL_LAYOUT.latest(run_dir)
    assert latest == Path(manager.get_latest_checkpoint_path()) == run_dir / "nemo_rl_checkpoints" / "step_10"
    assert [s for s, _ in NEMO_RL_LAYOUT.list(run_dir)] == [2, 9, 10] and nemo_rl_step(latest) == 10
    assert all(NEMO_RL_LAYOUT.is_complete(p) for _, p in NEMO_RL_LAYOUT.list(run_dir))


def test_opd_student_built_from_the_checkpoint_with_nemo_rl_signatures(tmp_path, monkeypatch):
    """build() on an OPD recipe builds the student for evaluation as distillation.setup does, against
    NeMo-RL's real classes (autospec: every call must match the real signature): Megatron Policy loading
    <checkpoint>/policy/weights without optimizer, colocated VllmGeneration with the policy's model name,
    refit info exchanged; the session refits through grpo.refit_policy_generation."""
    from unittest.mock import create_autospec

    import nemo_rl.distributed.virtual_cluster as vc
    import nemo_rl.models.generation.vllm as vllm_mod
    import nemo_rl.models.policy.lm_policy as lm_policy

    import rise_nemo.backends.nemo as nemo_backend
    from rise_nemo.config.loader import load_config

    cfg = load_config(REPO / "recipes" / "opd_4b_teacher14b.yaml", _opd_recipe_paths(tmp_path, monkeypatch))
    checkpoint = tmp_path / "opd" / "nemo_rl_checkpoints" / "step_50"
    (checkpoint / "policy" / "weights").mkdir(parents=True)
    (checkpoint / "training_info.json").write_text('{"total_steps": 50}')
    mocks = {"cluster": create_autospec(vc.RayVirtualCluster), "vllm": create_autospec(vllm_mod.VllmGeneration),
             "policy": create_autospec(lm_policy.Policy)}
    monkeypatch.setattr(vc, "RayVirtualCluster", mocks["cluster"])
    monkeypatch.setattr(vllm_mod, "VllmGeneration", mocks["vllm"])
    monkeypatch.setattr(lm_policy, "Policy", mocks["policy"])
    monkeypatch.setattr(vc, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr("nemo_rl.algorithms.utils.get_tokenizer", lambda *a, **k: make_tokenizer())
    policy_if, generator = nemo_backend.build_backend(cfg, checkpoint=checkpoint)

    kwargs = mocks["policy"].call_args.kwargs
    assert kwargs["weights_path"] == str(checkpoint / "policy" / "weights") and kwargs["optimizer_path"] is None
    assert kwargs["init_optimizer"] is False and kwargs["init_reference_model"] is False
    assert kwargs["config"]["model_name"] == "Qwen/Qwen3-4B" and kwargs["config"]["megatron_cfg"]["train_iters"] == 50
    gen_cfg = mocks["vllm"].call_args.kwargs["config"]
    assert gen_cfg["model_name"] == "Qwen/Qwen3-4B" and gen_cfg["colocated"]["enabled"] is True
    cluster_kwargs = mocks["cluster"].call_args.kwargs
    assert cluster_kwargs["bundle_ct_per_node_list"] == [8] and cluster_kwargs["num_gpus_per_node"] == 8
    student, vllm = mocks["policy"].return_value, mocks["vllm"].return_value
    vllm.prepare_refit_info.assert_called_once_with(student.prepare_refit_info.return_value)
    from nemo_rl.algorithms import grpo as grpo_mod

    assert policy_if.session.refit is grpo_mod.refit_policy_generation
    policy_if.load_checkpoint(checkpoint / "policy")  # eval's check that this is the checkpoint it built from
    with pytest.raises(RuntimeError, match="built from"):
        policy_if.load_checkpoint(checkpoint.parent / "step_40" / "policy")


def test_grpo_policy_built_from_the_checkpoint_it_is_given(tmp_path, monkeypatch):
    """Resume and eval on a GRPO-family run: build_backend(cfg, checkpoint=) hands grpo.setup a policy factory that
    builds NeMo-RL's Policy from that checkpoint (an earlier one included), not the run's latest."""
    from nemo_rl.algorithms import grpo as grpo_mod

    import rise_nemo.backends.nemo as nemo_backend
    from rise_nemo.config.loader import load_config

    nemo_dir = Path(nemo_rl.__file__).resolve().parents[1]
    if not (nemo_dir / "examples" / "configs" / "grpo_math_1B_megatron.yaml").exists():
        pytest.skip("NeMo-RL example configs not found next to nemo_rl")
    monkeypatch.setenv("NEMO_RL_DIR", str(nemo_dir))
    seen: dict = {}
    tok = make_tokenizer()
    vllm = CpuVllm(len(tok), 10, tok.pad_token_id, tok.eos_token_id, [])

    def fake_setup(master_config, tokenizer, dataset, val_dataset, policy_factory=None, **k):
        seen["factory"] = policy_factory
        return (_mock_policy(dp=2), _mock_generation(vllm), None, (None, None), None, None, None, None, None, None,
                master_config, {}, {})

    monkeypatch.setattr(grpo_mod, "setup", fake_setup)
    monkeypatch.setattr("nemo_rl.distributed.virtual_cluster.init_ray", lambda *a, **k: None)
    monkeypatch.setattr("nemo_rl.algorithms.utils.get_tokenizer", lambda *a, **k: tok)
    cfg = load_config(REPO / "recipes" / "rise_4b.yaml", [
        f"run.dir={tmp_path / 'run'}", "judge={type: rule}",
        f"data.train_path={write_jsonl(tmp_path / 'train.jsonl', make_prompts(4))}",
        f"data.eval_path={write_jsonl(tmp_path / 'eval.jsonl', make_prompts(2, 4))}"])
    for step in (1, 2):
        _megatron_like_policy_dir(tmp_path / "run" / "checkpoints" / f"step_{step:06d}", with_optimizer=True)
    chosen = tmp_path / "run" / "checkpoints" / "step_000001"
    policy_if, _ = nemo_backend.build_backend(cfg, checkpoint=chosen, train_prompts=make_prompts(4))
    from nemo_rl.models.policy.lm_policy import Policy

    factory, built = seen["factory"], {}
    assert factory.func is nemo_backend._policy_with_resume and factory.args[0] is Policy
    factory.func(lambda **k: built.update(k), *factory.args[1:], cluster="c")  # the real factory, Policy recorded
    assert built["weights_path"] == str(chosen / "policy" / "weights")
    assert built["optimizer_path"] == str(chosen / "policy" / "optimizer")  # Megatron's embedded optimizer: load it
    assert policy_if.session.resumed_from == chosen / "policy"
    nemo_backend.build_backend(cfg, checkpoint=None, train_prompts=make_prompts(4))
    assert seen["factory"].args[1] is None  # the initial policy


@pytest.mark.parametrize("v2", [None, False])
def test_dtensor_recipe_names_the_v2_worker_it_inherits(v2, tmp_path, monkeypatch):
    """NeMo-RL's base config sets dtensor_cfg._v2: true, so a recipe that only turns DTensor
    on gets the v2 worker, which needs nemo_automodel (absent in this venv and in many containers) and failed
    inside a Ray worker. build_master_config now refuses it naming the key; ``_v2: false`` (the v1 worker,
    the one that executes on CPU) passes NeMo-RL's MasterConfig."""
    import importlib.util

    from nemo_rl.algorithms import grpo

    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.config import NemoConfigError, build_master_config
    from rise_nemo.config.loader import load_config

    # what this test is about: a venv without nemo_automodel (make test-nemo puts the Automodel source on
    # PYTHONPATH for the v2 workers, so its absence is simulated where config.py looks for it)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "nemo_automodel" else real_find_spec(name, *a, **k))
    monkeypatch.setenv("NEMO_RL_DIR", str(Path(nemo_rl.__file__).resolve().parents[1]))
    overrides = ["nemo.policy.dtensor_cfg.enabled=true", "nemo.policy.megatron_cfg.enabled=false"]
    if v2 is not None:
        overrides.append(f"++nemo.policy.dtensor_cfg._v2={str(v2).lower()}")
    recipe = plain_recipe(load_config(REPO / "recipes" / "grpo_math_qwen3_4b.yaml", overrides))
    if v2 is None:
        with pytest.raises(NemoConfigError, match=r"nemo\.policy\.dtensor_cfg\._v2: true .* needs nemo_automodel"):
            build_master_config(recipe, str(tmp_path))
    else:
        master = grpo.MasterConfig(**build_master_config(recipe, str(tmp_path)))
        assert master.policy["dtensor_cfg"]["enabled"] and master.policy["dtensor_cfg"]["_v2"] is False


@pytest.mark.parametrize("policy_keys, refused", [
    ({"train_micro_batch_size": 4, "sequence_packing": {"enabled": False}}, "train_micro_batch_size is 4"),
    ({"train_micro_batch_size": 1, "sequence_packing": {"enabled": False}, "dynamic_batching": {"enabled": True}},
     "dynamic batching is on"),
    ({"train_micro_batch_size": 1, "sequence_packing": {"enabled": False}, "dynamic_batching": {"enabled": False}},
     None),
    ({"train_micro_batch_size": 4, "sequence_packing": {"enabled": True}}, None),
])
def test_dtensor_top_p_with_multi_row_micro_batches_is_refused(policy_keys, refused, tmp_path, monkeypatch):
    """ppo_math_7b samples at top_p 0.9. On a DTensor policy (TP 1) NeMo-RL v0.7.0's loss recomputes log-probs
    under it through a view of a non-contiguous slice, which raised "view size is not compatible" in the first
    train call of make test-nemo's v2 critic steps whenever a micro-batch held several rows. build_master_config
    refuses those layouts naming sampling.top_p, and passes the ones that execute (a row per micro-batch, or
    packing) through NeMo-RL's own MasterConfig."""
    from nemo_rl.algorithms import grpo

    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.config import NemoConfigError, build_master_config
    from rise_nemo.config.loader import load_config

    monkeypatch.setenv("NEMO_RL_DIR", str(Path(nemo_rl.__file__).resolve().parents[1]))
    recipe = plain_recipe(load_config(REPO / "recipes" / "ppo_math_7b.yaml", [
        "nemo.policy.dtensor_cfg.enabled=true", "++nemo.policy.dtensor_cfg._v2=false",
        "nemo.policy.megatron_cfg.enabled=false"]))
    assert recipe["sampling"]["top_p"] < 1.0  # the premise: the shipped recipe filters
    for key, value in policy_keys.items():
        recipe["nemo"]["policy"][key] = value
    if refused:
        with pytest.raises(NemoConfigError, match=rf"recipe key sampling\.top_p: 0\.9 .*{refused}"):
            build_master_config(recipe, str(tmp_path))
    else:
        master = grpo.MasterConfig(**build_master_config(recipe, str(tmp_path)))
        assert master.policy["generation"]["top_p"] == recipe["sampling"]["top_p"]


def test_master_config_names_the_key_a_merge_cannot_take(tmp_path, monkeypatch):
    """A recipe value of the wrong shape for NeMo-RL's base config (a mapping where grpo_math_1B.yaml has a list)
    fails with the recipe key, not an omegaconf traceback."""
    from rise_nemo.backends import nemo as nemo_backend
    from rise_nemo.backends.nemo.config import NemoConfigError, build_master_config
    from rise_nemo.config.loader import load_config

    monkeypatch.setenv("NEMO_RL_DIR", str(Path(nemo_rl.__file__).resolve().parents[1]))
    tree = nemo_backend.plain_recipe(load_config(REPO / "recipes" / "rise_4b.yaml"))
    tree["nemo"]["base"] = "grpo_math_1B.yaml"
    tree["nemo"]["policy"]["scheduler"] = {"name": "torch.optim.lr_scheduler.ConstantLR"}
    with pytest.raises(NemoConfigError, match=r"recipe key nemo\.policy\.scheduler: Cannot merge"):
        build_master_config(tree, str(tmp_path))


@pytest.mark.parametrize("stand_in, real", [
    ("CpuVllm", "nemo_rl.models.generation.vllm.VllmGeneration"),
    ("CpuMegatronPolicy", "nemo_rl.models.policy.lm_policy.Policy"),
    ("CpuValue", "nemo_rl.models.value.lm_value.Value"),
])
def test_stand_ins_keep_the_real_calling_convention(stand_in, real):
    """make test drives the orchestration over tests/nemo/cpu_nemo.py's stand-ins (milliseconds, no NeMo-RL);
    make test-nemo executes the real VllmGeneration / Policy (test_train_executes_on_nemo.py) but not the
    Megatron policy or the value worker. Pin each stand-in to the real class: every public method the stand-in
    has exists there and accepts the same call (positional names, keywords), and the generation output carries
    GenerationOutputSpec's required keys and no key it does not declare."""
    import importlib
    import inspect

    import cpu_nemo

    module, name = real.rsplit(".", 1)
    real_cls = getattr(importlib.import_module(module), name)
    fake_cls = getattr(cpu_nemo, stand_in)
    for meth, fn in inspect.getmembers(fake_cls, inspect.isfunction):
        if meth.startswith("_"):
            continue
        assert hasattr(real_cls, meth), f"{stand_in}.{meth}: NeMo-RL's {name} has no such method"
        fake_params = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
        real_sig = inspect.signature(getattr(real_cls, meth))
        # the call our backend makes on the stand-in (every named parameter, as keywords) binds on the real one
        real_sig.bind(None, **{p.name: None for p in fake_params[1:] if p.kind is not p.VAR_POSITIONAL})
    if stand_in == "CpuVllm":
        from nemo_rl.models.generation.interfaces import GenerationOutputSpec

        tok = make_tokenizer()
        vllm = CpuVllm(len(tok), 4, tok.pad_token_id, tok.eos_token_id, [])
        vllm.prepare_for_generation()
        out = vllm.generate({"input_ids": torch.tensor([[5, 6, 7]]), "input_lengths": torch.tensor([3])})
        required = GenerationOutputSpec.__required_keys__ - {"__extra__"}  # __extra__: "more keys may follow"
        assert required <= set(out) <= set(GenerationOutputSpec.__annotations__), (required, set(out))
