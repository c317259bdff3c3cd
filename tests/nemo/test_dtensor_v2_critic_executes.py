"""NeMo-RL v0.7.0's REAL DTensor v2 value worker (the critic of PPO/RRL on ``dtensor_cfg``) EXECUTES on CPU,
driven through rise_nemo's critic: ``build_value`` (NeMo-RL's ``Value`` on a ``RayVirtualCluster``) and
``NemoCritic`` (value padding, ``ValueLossFunction`` around the core's clipped value loss, the global count
column, checkpoint layout), with the Automodel source NeMo-RL pins on PYTHONPATH (``$NEMO_AUTOMODEL_DIR``).

What is checked independently of our code: the values equal plain transformers' (a one-label token-classification
head on the same model, right-shifted as NeMo-RL documents) on the worker's OWN weights, read back from the
checkpoint it saved (the head is initialised by the worker, not in the model directory); one step of our value
loss moves the values towards the returns; a Value built from the checkpoint computes the trained values and
continues the LR schedule (a restarted schedule would report the first step's learning rate again).
CUDA-only assumptions are patched in tests/nemo/cpu_harness.py (the ``ray_private`` fixture, conftest.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from nemo_venv import import_nemo_rl

pytestmark = pytest.mark.nemo
import_nemo_rl()

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "judges"))

ROWS, WIDTH = 6, 12
LR, WARMUP = 1e-2, 10  # LinearLR from 0.1 x LR: every scheduler step changes the rate


def _policy_config(model_dir: Path) -> dict:
    """NeMo-RL's grpo_math_1B policy block on the DTensor v2 worker (NeMo-RL's default), tiny model, fp32."""
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    from rise_nemo.backends.nemo.config import nemo_rl_dir

    register_omegaconf_resolvers()
    policy = OmegaConf.to_container(load_config(nemo_rl_dir({}) / "examples" / "configs" / "grpo_math_1B.yaml").policy,
                                    resolve=True)
    policy.update(
        model_name=str(model_dir), tokenizer={"name": str(model_dir), "chat_template_kwargs": None},
        train_global_batch_size=8, train_micro_batch_size=2, logprob_batch_size=2,
        max_total_sequence_length=32, precision="float32", make_sequence_length_divisible_by=1,
    )
    policy["dtensor_cfg"].update(_v2=True, enabled=True, cpu_offload=False, activation_checkpointing=False)
    policy["megatron_cfg"] = {"enabled": False}
    policy["sequence_packing"]["enabled"] = False
    policy["dynamic_batching"]["enabled"] = False
    policy["optimizer"]["kwargs"].update(lr=LR, weight_decay=0.0, foreach=False, fused=False)
    policy["scheduler"] = [{"name": "torch.optim.lr_scheduler.LinearLR",
                            "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": WARMUP}},
                           {"milestones": []}]
    return policy


def _checkpointing() -> dict:
    from nemo_rl.utils.config import load_config

    from rise_nemo.backends.nemo.config import nemo_rl_dir

    return dict(load_config(nemo_rl_dir({}) / "examples" / "configs" / "grpo_math_1B.yaml").checkpointing)


def _build(model_dir: Path, resume: Path | None, name: str):
    from cpu_nemo import CpuMegatronPolicy
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
    from transformers import AutoTokenizer

    from rise_nemo.backends.nemo.critic import NemoCritic, build_value, value_config
    from rise_nemo.backends.nemo.runtime import NemoSession

    policy_config = _policy_config(model_dir)
    config = value_config(policy_config, None)
    assert config["dtensor_cfg"]["_v2"] and config["reward_model_cfg"]["enabled"]  # what NeMo-RL's v2 worker needs
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cluster = RayVirtualCluster(bundle_ct_per_node_list=[1], use_gpus=False, num_gpus_per_node=1,
                                max_colocated_worker_groups=2, name=name)
    # the policy sharing the session is not under test here: the pinned stand-in records the offloads
    session = NemoSession(CpuMegatronPolicy(8, 1, []), None, tokenizer,
                          {"policy": policy_config, "checkpointing": _checkpointing()}, refit=None)
    value = build_value(cluster, tokenizer, config, resume)
    return NemoCritic(session, value, config, resumed_from=resume), value, cluster


def _batch(vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (ROWS, WIDTH), generator=g)
    lengths = torch.tensor([12, 10, 12, 8, 12, 9])
    token_mask = torch.zeros(ROWS, WIDTH)
    for i, n in enumerate(lengths.tolist()):
        token_mask[i, 4:n] = 1.0
        input_ids[i, n:] = 0
    returns = torch.where(token_mask.bool(), torch.linspace(-1, 1, ROWS)[:, None].expand(ROWS, WIDTH), 0.0)
    return {"input_ids": input_ids, "input_lengths": lengths, "token_mask": token_mask, "sample_mask": torch.ones(ROWS),
            "returns": returns}


def _transformers_values(model_dir: Path, weights: Path, input_ids):
    """Plain transformers on the weights the worker saved: Qwen3 with a one-label token-classification head, its
    per-token outputs shifted right by one (NeMo-RL's convention: values[t] is the value before token t)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForTokenClassification

    state = {}
    for shard in sorted(weights.rglob("*.safetensors")):
        state.update(load_file(shard))
    assert state, f"no safetensors under {weights}: {sorted(p.name for p in weights.rglob('*'))}"
    model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=1, torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    with torch.no_grad():
        raw = model.eval()(input_ids=input_ids).logits[..., 0]
    out = torch.zeros_like(raw)
    out[:, 1:] = raw[:, :-1]
    return out


def test_real_dtensor_v2_value_worker_values_train_save_resume(tmp_path, ray_private):
    import torch
    from tiny_qwen3 import build
    from transformers import AutoConfig

    from rise_nemo.core.value import make_value_loss

    model_dir = build(tmp_path / "tiny_qwen3", vocab_size=512)
    data = _batch(AutoConfig.from_pretrained(model_dir).vocab_size)
    valid = torch.arange(WIDTH)[None, :] < data["input_lengths"][:, None]
    loss = make_value_loss(clip=10.0)  # the core's clipped value loss, wide clip: one step moves the values

    critic, value, cluster = _build(model_dir, None, "v2critic0")
    try:
        before = critic.get_values(data)
        assert before.shape == (ROWS, WIDTH) and torch.isfinite(before).all()
        assert before[valid].abs().max() < 10, "an uninitialised value head (see test_cpu_harness.py)"
        start = tmp_path / "checkpoints" / "step_000000" / "critic"
        critic.save_checkpoint(start)
        torch.testing.assert_close(before[valid], _transformers_values(model_dir, start / "weights",
                                                                       data["input_ids"])[valid],
                                   atol=1e-5, rtol=1e-5)

        first = critic.train(dict(data, values=before), loss)  # "values": the clipping anchor
        assert first["critic/lr"] == pytest.approx(0.1 * LR), first  # LinearLR's first rate
        assert first["critic/grad_norm"] > 0, first
        after = critic.get_values(data)
        mse = lambda v: float(((v - data["returns"]) ** 2 * data["token_mask"]).sum() / data["token_mask"].sum())  # noqa: E731
        assert mse(after) < mse(before), (mse(before), mse(after))
        ckpt = tmp_path / "checkpoints" / "step_000001" / "critic"
        critic.save_checkpoint(ckpt)
        assert (ckpt / "weights").is_dir() and (ckpt / "optimizer").is_dir()
        torch.testing.assert_close(after[valid], _transformers_values(model_dir, ckpt / "weights",
                                                                      data["input_ids"])[valid], atol=1e-5, rtol=1e-5)
    finally:
        value.shutdown()
        cluster.shutdown()

    resumed, value2, cluster2 = _build(model_dir, ckpt, "v2critic1")
    try:
        resumed.load_checkpoint(ckpt)  # the hook accepts the checkpoint the value model was built from
        torch.testing.assert_close(resumed.get_values(data)[valid], after[valid], atol=1e-5, rtol=1e-5)
        second = resumed.train(dict(data, values=after), loss)
        # the scheduler went on from step 1 (a restart would report 0.1 x LR again)
        assert second["critic/lr"] == pytest.approx((0.1 + 0.9 / WARMUP) * LR), second
    finally:
        value2.shutdown()
        cluster2.shutdown()
