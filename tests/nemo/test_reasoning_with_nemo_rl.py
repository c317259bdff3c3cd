"""The nemo backend's reasoning seams against NeMo-RL's own code (skipped unless ``nemo_rl`` is importable).

Same setup as test_with_nemo_rl.py (NeMo-RL container, or a v0.7 checkout on PYTHONPATH with its pure-Python
dependencies; docs/nemo_rl.md "Running on NeMo-RL"). Checked here:
- a batch with a given (replayed) response prefix passes NeMo-RL's loss wrapper (logits -> next-token
  log-probs) with exactly zero gradient on the given tokens and non-zero gradient on the sampled ones;
- per-token advantages through the adapter equal NeMo-RL's ClippedPGLossFn with [B, T] advantages;
- NemoCritic's calls bind to the real ``Value`` API (autospec of nemo_rl.models.value.lm_value.Value), the
  value config derived from a recipe carries every key of NeMo-RL's ValueConfig, and ``build_value`` calls
  ``Value(...)`` as ppo.py does;
- the value-loss adapter over a clipped value loss equals NeMo-RL's MseValueLossFn, summed over micro-batches.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from unittest.mock import MagicMock, create_autospec

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from nemo_venv import import_nemo_rl  # noqa: E402

nemo_rl = import_nemo_rl()
pytestmark = pytest.mark.nemo

from cpu_nemo import CpuValue, make_tokenizer  # noqa: E402
from test_reasoning_nemo_cpu import _ppo_batch, clipped_value_loss  # noqa: E402
from test_with_nemo_rl import prepare_fn  # noqa: E402

from rise_nemo.backends.nemo.critic import VALUE_COUNT_KEY, NemoCritic, ValueLossFunction  # noqa: E402
from rise_nemo.backends.nemo.loss import RiseLossFunction  # noqa: E402
from rise_nemo.core.losses import ObjectiveConfig, policy_objective  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
torch.set_num_threads(1)
VOCAB = 24


def _through_nemo(loss_fn, data, logits):
    from nemo_rl.algorithms.loss.wrapper import wrap_loss_fn_with_input_preparation
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    gvt = (data["token_mask"][:, 1:] * data["sample_mask"][:, None]).sum()
    return wrap_loss_fn_with_input_preparation(logits, BatchedDataDict(dict(data)), data["sample_mask"].sum(), gvt,
                                               loss_fn=loss_fn, prepare_fn=prepare_fn())


def _with_counts(batch):
    n_tok = float(batch["token_mask"].sum())
    return {**batch, "natural_token_count": torch.full((batch["input_ids"].shape[0],), n_tok),
            "guided_seq_count": torch.zeros(batch["input_ids"].shape[0])}


def test_given_prefix_gets_zero_gradient_through_nemo_loss_wrapper():
    given = 3
    batch = _with_counts(_ppo_batch(b=4, t=12, given=given))
    batch["advantages"] = torch.tensor([1.0, -0.5, 0.7, -1.2])
    logits = torch.randn(4, 12, VOCAB, generator=torch.Generator().manual_seed(3), requires_grad=True)
    # on-policy (ratio 1, nothing clipped): every sampled token gets a gradient
    current = torch.log_softmax(logits.detach(), -1)[:, :-1].gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    batch["prev_logprobs"] = torch.cat([torch.zeros(4, 1), current], dim=1)
    loss_fn = RiseLossFunction(functools.partial(policy_objective, cfg=ObjectiveConfig(lambda_guide=0.0)))
    loss, _ = _through_nemo(loss_fn, batch, logits)
    (grad,) = torch.autograd.grad(loss, logits)
    # logits[:, t] predict token t+1: prompt 0..3, given tokens 4..6 (predicted at 3..5), sampled 7..10
    assert float(grad[:, 3:3 + given].abs().sum()) == 0.0
    assert torch.all(grad[:, 6:10].abs().sum(-1) > 0)
    # the given tokens still condition the continuation: they are in input_ids the model reads
    assert batch["token_mask"][:, 4:4 + given].sum() == 0 and batch["input_ids"][:, 4:4 + given].ne(0).all()


def test_token_advantages_equal_clipped_pg_loss_with_bt_advantages():
    from nemo_rl.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    batch = _with_counts(_ppo_batch(b=4, t=12, given=2, seed=5))
    objective = functools.partial(policy_objective, cfg=ObjectiveConfig(clip_low=0.2, clip_high=0.28, lambda_guide=0.0))
    logits = torch.randn(4, 12, VOCAB, generator=torch.Generator().manual_seed(1), requires_grad=True)
    theirs = ClippedPGLossFn(ClippedPGLossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28,
                                                 reference_policy_kl_penalty=0.0, token_level_loss=True))
    nemo_data = BatchedDataDict({**batch, "advantages": batch["token_advantages"],
                                 "generation_logprobs": batch["prev_logprobs"]})
    our_loss, _ = _through_nemo(RiseLossFunction(objective), batch, logits)
    their_loss, _ = _through_nemo(theirs, nemo_data, logits)
    assert float(our_loss) == pytest.approx(float(their_loss), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(torch.autograd.grad(our_loss, logits)[0], torch.autograd.grad(their_loss, logits)[0],
                               rtol=1e-4, atol=1e-7)


def _autospec_value(tok, dp=2):
    """An autospec of NeMo-RL's Value (calls with a wrong signature raise TypeError) answering like CpuValue."""
    from nemo_rl.models.value.lm_value import Value

    cpu = CpuValue(len(tok), dp, [])
    value = create_autospec(Value, instance=True)
    value.sharding_annotations = MagicMock()  # an instance attribute of Value (lm_value.py:137), not in the spec
    value.sharding_annotations.get_axis_size.side_effect = lambda name: {"data_parallel": dp}[name]
    for name in ("get_values", "train", "prepare_for_training", "prepare_for_inference", "finish_training",
                 "finish_inference", "save_checkpoint"):
        getattr(value, name).side_effect = getattr(cpu, name)
    return value, cpu


def test_critic_calls_bind_to_the_real_value_api(tmp_path):
    from nemo_rl.models.policy.lm_policy import Policy

    from rise_nemo.backends.nemo.runtime import NemoSession

    tok = make_tokenizer()
    value, cpu = _autospec_value(tok)
    policy = create_autospec(Policy, instance=True)  # the critic offloads it through NeMo-RL's own method
    session = NemoSession(policy, None, tok, {"policy": {"generation": {"colocated": {"enabled": True}}}},
                          refit=lambda *a, **k: None)
    critic = NemoCritic(session, value, {"train_micro_batch_size": 1, "make_sequence_length_divisible_by": 2,
                                          "train_global_batch_size": 8})
    batch = _ppo_batch(b=3, t=10)
    values = critic.get_values(batch)
    assert values.shape == (3, 10) and torch.all(values[:, 0] == 0)
    metrics = critic.train(batch, functools.partial(clipped_value_loss, clip=0.2))
    assert "critic/value_loss" in metrics and value.train.call_args.kwargs["gbs"] == 8
    critic.save_checkpoint(tmp_path / "critic")
    assert value.save_checkpoint.call_args.kwargs["weights_path"].endswith("critic/weights")
    assert [c[0] for c in value.method_calls][-3:] == ["prepare_for_training", "save_checkpoint", "finish_training"]
    assert [c[0] for c in policy.method_calls] == ["offload_after_refit"] * 3  # before values, training, saving


def test_value_config_from_the_ppo_recipe_is_a_full_value_config(tmp_path, monkeypatch):
    from nemo_rl.algorithms import grpo
    from nemo_rl.models.value.config import ValueConfig

    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.config import build_master_config
    from rise_nemo.config.loader import load_config
    from rise_nemo.planner.critic import value_config

    nemo_dir = Path(nemo_rl.__file__).resolve().parents[1]
    if not (nemo_dir / "examples" / "configs").exists():
        pytest.skip("NeMo-RL example configs not found next to nemo_rl")
    monkeypatch.setenv("NEMO_RL_DIR", str(nemo_dir))
    recipe = plain_recipe(load_config(REPO / "recipes" / "ppo_math_7b.yaml"))
    master = grpo.MasterConfig(**build_master_config(recipe, str(tmp_path)))
    cfg = value_config(master.policy, master.value)
    assert ValueConfig.__required_keys__ <= set(cfg), ValueConfig.__required_keys__ - set(cfg)
    assert cfg["megatron_cfg"]["enabled"] and not cfg["dtensor_cfg"]["enabled"]
    assert cfg["megatron_cfg"]["optimizer"]["lr"] == 1.5e-6 and master.policy["megatron_cfg"]["optimizer"]["lr"] == 5e-7
    assert cfg["model_name"] == "Qwen/Qwen2.5-Math-7B"


def test_build_value_calls_value_like_ppo_setup(monkeypatch, tmp_path):
    import nemo_rl.models.value.lm_value as lm_value

    from rise_nemo.backends.nemo.critic import build_value

    cls = create_autospec(lm_value.Value)
    monkeypatch.setattr(lm_value, "Value", cls)
    policy = create_autospec(__import__("nemo_rl.models.policy.lm_policy", fromlist=["Policy"]).Policy, instance=True)
    (tmp_path / "critic" / "optimizer").mkdir(parents=True)
    value = build_value("cluster", "tok", {"model_name": "m"}, tmp_path / "critic", policy=policy)
    kwargs = cls.call_args.kwargs
    assert kwargs["weights_path"] == str(tmp_path / "critic" / "weights") and kwargs["init_optimizer"] is True
    assert kwargs["optimizer_path"] == str(tmp_path / "critic" / "optimizer")
    value.finish_training.assert_called_once()
    assert [c[0] for c in policy.method_calls] == ["offload_after_refit", "prepare_for_training"]


def test_value_loss_adapter_equals_mse_value_loss_summed_over_microbatches():
    from nemo_rl.algorithms.loss.interfaces import LossInputType, LossType
    from nemo_rl.algorithms.loss.loss_functions import MseValueLossConfig, MseValueLossFn

    batch = _ppo_batch(b=4, t=10, seed=2)
    batch[VALUE_COUNT_KEY] = torch.full((4,), float(batch["token_mask"].sum()))
    values = torch.randn(4, 10, generator=torch.Generator().manual_seed(4), requires_grad=True)
    ours = ValueLossFunction(functools.partial(clipped_value_loss, clip=0.2))
    assert ours.input_type is LossInputType.LOGIT and ours.loss_type is LossType.TOKEN_LEVEL
    theirs = MseValueLossFn(MseValueLossConfig(scale=1.0, cliprange=0.2))
    gvt = (batch["token_mask"] * batch["sample_mask"][:, None]).sum()
    total_ours = total_theirs = 0.0
    for rows in (slice(0, 2), slice(2, 4)):  # two micro-batches, each normalised by the global count
        mb = {k: v[rows] for k, v in batch.items()}
        total_ours = total_ours + ours(values[rows], mb)[0]
        total_theirs = total_theirs + theirs(values[rows], mb, batch["sample_mask"].sum(), gvt)[0]
    assert float(total_ours) == pytest.approx(float(total_theirs), rel=1e-6)
    torch.testing.assert_close(torch.autograd.grad(total_ours, values)[0], torch.autograd.grad(total_theirs, values)[0])


@pytest.mark.parametrize("name", ["ppo_math_7b.yaml", "grpo_math_qwen3_4b.yaml", "exprl_outcome_qwen3_4b.yaml",
                                  "exprl_process_qwen3_4b.yaml", "exprl_stage2_qwen3_4b.yaml", "rrl_math_7b.yaml",
                                  "ppo_apps_deepseek_coder_6.7b.yaml", "rrl_apps_deepseek_coder_6.7b.yaml"])
def test_reasoning_recipes_pass_nemo_rl_master_config(name, tmp_path, monkeypatch):
    """The two reasoning recipes merged over their NeMo-RL example config pass NeMo-RL's GRPO MasterConfig
    and keep their layout (the same check test_with_nemo_rl.py runs for the other recipes)."""
    from test_with_nemo_rl import test_recipes_pass_nemo_rl_master_config as check

    check(name, tmp_path, monkeypatch)


def _packed(batch, lengths, seed=6):
    """A packed value-head output [1, sum(lengths)] (one sequence after another, right-shifted as the Megatron
    value worker's prepare_fn leaves it) and NeMo-RL's cu_seqlens for it."""
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    values = torch.randn(1, int(cu[-1]), generator=torch.Generator().manual_seed(seed), requires_grad=True)
    return values, cu


def test_value_loss_through_the_real_sequence_packing_wrapper():
    """With sequence packing (ppo_math_7b / rrl_math_7b turn it on, value_config copies it
    to the critic) the Megatron value worker wraps the loss in NeMo-RL's SequencePackingLossWrapper
    (megatron_value_worker.py:149-151), whose prepare_fn returns ``{"logits": values}`` (:315), and the wrapper
    calls ``loss_fn(data=, global_valid_seqs=, global_valid_toks=, **loss_input)`` (wrapper.py:136-141). The
    real wrapper runs here with NeMo-RL's real ``prepare_loss_input`` (its LOGIT branch returns the same
    ``{"logits": ...}``; the worker's own prepare_fn cannot be imported without megatron-core). Before the fix
    our value loss took ``next_token_logprobs`` and raised TypeError. It must equal MseValueLossFn through the
    same wrapper, in value and gradient, and report num_valid_samples as NeMo-RL's losses do."""
    from nemo_rl.algorithms.loss import SequencePackingLossWrapper, prepare_loss_input
    from nemo_rl.algorithms.loss.loss_functions import MseValueLossConfig, MseValueLossFn
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    lengths = [10, 7, 9]
    batch = _ppo_batch(b=3, t=10, seed=2)
    batch["input_lengths"] = torch.tensor(lengths)
    for i, n in enumerate(lengths):
        batch["token_mask"][i, n:] = 0  # right padding
    batch["sample_mask"] = torch.tensor([1.0, 0.0, 1.0])
    gvt = (batch["token_mask"] * batch["sample_mask"][:, None]).sum()
    batch[VALUE_COUNT_KEY] = torch.full((3,), float(gvt))
    values, cu = _packed(batch, lengths)
    results = []
    for loss_fn in (ValueLossFunction(functools.partial(clipped_value_loss, clip=0.2)),
                    MseValueLossFn(MseValueLossConfig(scale=1.0, cliprange=0.2))):
        wrapper = SequencePackingLossWrapper(loss_fn=loss_fn, prepare_fn=prepare_loss_input, cu_seqlens_q=cu)
        loss, metrics = wrapper(values, BatchedDataDict(dict(batch)), batch["sample_mask"].sum(), gvt)
        results.append((loss, metrics, torch.autograd.grad(loss, values)[0]))
    (ours, our_metrics, our_grad), (theirs, their_metrics, their_grad) = results
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)
    torch.testing.assert_close(our_grad, their_grad)
    assert our_metrics["num_valid_samples"] == their_metrics["num_valid_samples"] == 3.0  # rows, not sample_mask


def test_policy_loss_reports_num_valid_samples_like_clipped_pg_loss():
    """NeMo-RL's DTensor policy worker reads ``loss_metrics["num_valid_samples"]`` after every
    micro-batch (dtensor_policy_worker.py:916; KeyError without it) and keeps the micro-batch's metrics only
    when it is > 0 (:934). Through the real input preparation our adapter reports what ClippedPGLossFn does."""
    from nemo_rl.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    batch = _with_counts(_ppo_batch(b=4, t=12, given=2, seed=5))
    batch["sample_mask"] = torch.tensor([1.0, 1.0, 0.0, 1.0])
    logits = torch.randn(4, 12, VOCAB, generator=torch.Generator().manual_seed(1))
    objective = functools.partial(policy_objective, cfg=ObjectiveConfig(clip_low=0.2, clip_high=0.28, lambda_guide=0.0))
    theirs = ClippedPGLossFn(ClippedPGLossConfig(ratio_clip_min=0.2, ratio_clip_max=0.28,
                                                 reference_policy_kl_penalty=0.0, token_level_loss=True))
    _, ours = _through_nemo(RiseLossFunction(objective), batch, logits)
    _, their_metrics = _through_nemo(theirs, BatchedDataDict({**batch, "advantages": batch["token_advantages"],
                                                              "generation_logprobs": batch["prev_logprobs"]}), logits)
    assert ours["num_valid_samples"] == their_metrics["num_valid_samples"] == 3.0


@pytest.mark.parametrize("layout", ["megatron", "megatron_no_optimizer", "dtensor"])
def test_critic_resumes_with_the_paths_nemo_rl_resumes_value_from(layout, monkeypatch, tmp_path):
    """The Megatron value worker keeps its optimizer (and LR schedule) inside ``weights/``
    (megatron_value_worker.py:964-1010); NeMo-RL's resume rule checks ``weights/iter_0000000/common.pt``
    (CheckpointManager.get_resume_paths(..., model_component="value"), checkpoint.py:150-193). build_value used
    to look only for ``<critic>/optimizer`` and so restarted Adam and the warmup on every resume. The Value it
    builds must get exactly the paths NeMo-RL's own rule gives for the same layout."""
    import warnings

    import nemo_rl.models.value.lm_value as lm_value
    from nemo_rl.utils.checkpoint import CheckpointManager
    from test_with_nemo_rl import _megatron_like_policy_dir

    from rise_nemo.backends.nemo.critic import build_value

    if layout == "dtensor":
        (tmp_path / "value" / "weights").mkdir(parents=True)
        (tmp_path / "value" / "optimizer").mkdir()
    else:
        _megatron_like_policy_dir(tmp_path, layout == "megatron", component="value")
    cls = create_autospec(lm_value.Value)
    monkeypatch.setattr(lm_value, "Value", cls)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_value("cluster", "tok", {"model_name": "m"}, tmp_path / "value")
        theirs = CheckpointManager.get_resume_paths(tmp_path, model_component="value")
    kwargs = cls.call_args.kwargs
    assert (kwargs["weights_path"], kwargs["optimizer_path"]) == tuple(None if p is None else str(p) for p in theirs)
    assert (kwargs["optimizer_path"] is None) == (layout == "megatron_no_optimizer")


def test_whiten_equals_nemo_rl_gae_normalisation():
    """Our GAE advantage whitening is NeMo-RL's ``_reward_whiten`` (masked_var with Bessel's correction)."""
    from nemo_rl.algorithms.advantage_estimator import GeneralizedAdvantageEstimator

    from rise_nemo.core.value import whiten

    g = torch.Generator().manual_seed(3)
    x, mask = torch.randn(4, 9, generator=g), (torch.rand(4, 9, generator=g) > 0.4).float()
    theirs = GeneralizedAdvantageEstimator._reward_whiten(None, x, mask) * mask
    torch.testing.assert_close(whiten(x, mask), theirs, rtol=1e-5, atol=1e-6)
