"""NeMo-RL v0.7.0's REAL DTensor v1 policy worker EXECUTES on CPU, driven through rise_nemo's nemo backend.

No stand-in: NeMo-RL's ``RayVirtualCluster`` (use_gpus=False), ``Policy`` and ``DTensorPolicyWorker`` (gloo,
FSDP2 on a one-rank CPU mesh) run a tiny random Qwen3 saved to disk, under a private Ray cluster that this
test starts on 127.0.0.1 and shuts down (never ``ray stop``). Our code under test: ``NemoSession`` /
``NemoPolicy`` (rise_nemo.backends.nemo.runtime: log-prob input padding, the train batch of
``to_nemo_train_batch``, the ``RiseLossFunction`` adapter around the GRPO objective ``policy_loss_fn``,
``save_checkpoint``'s layout) and the resume rule (``resume_paths`` via ``_policy_with_resume``).
The CUDA-only assumptions of the worker are patched in ONE file, tests/nemo/cpu_harness.py (each patch with
the NeMo-RL line it works around). vLLM generation and the refit are NOT executed here (out of scope).
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


ROWS, NATURAL, WIDTH = 6, 4, 12  # 4 natural + 2 guided rows (RISE-RL's guided branch)
GLOBAL_BATCH = 8  # NemoPolicy pads to it: a micro-batch of padding rows only


def _policy_config(model_dir: Path) -> dict:
    """NeMo-RL's own grpo_math_1B policy block, switched to the DTensor v1 worker on a tiny CPU model."""
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    from rise_nemo.backends.nemo.config import nemo_rl_dir

    register_omegaconf_resolvers()
    cfg = load_config(nemo_rl_dir({}) / "examples" / "configs" / "grpo_math_1B.yaml")
    policy = OmegaConf.to_container(cfg.policy, resolve=True)
    policy.update(
        model_name=str(model_dir), tokenizer={"name": str(model_dir), "chat_template_kwargs": None},
        train_global_batch_size=GLOBAL_BATCH, train_micro_batch_size=2, logprob_batch_size=2,
        max_total_sequence_length=32, precision="float32", make_sequence_length_divisible_by=1,
    )
    policy["dtensor_cfg"].update(_v2=False, enabled=True, cpu_offload=False, activation_checkpointing=False)
    policy["sequence_packing"]["enabled"] = False  # flash_attention_2 (dtensor_policy_worker.py:278)
    policy["dynamic_batching"]["enabled"] = False
    policy["optimizer"]["kwargs"].update(lr=1e-2, weight_decay=0.0, foreach=False, fused=False)
    policy["scheduler"] = {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0, "total_iters": 1}}
    policy["generation"]["colocated"]["enabled"] = True
    return policy


def _build_policy(model_dir: Path, resume: Path | None):
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
    from nemo_rl.models.policy.lm_policy import Policy
    from transformers import AutoTokenizer

    from rise_nemo.backends.nemo import _policy_with_resume
    from rise_nemo.backends.nemo.runtime import NemoPolicy, NemoSession

    config = _policy_config(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cluster = RayVirtualCluster(bundle_ct_per_node_list=[1], use_gpus=False, num_gpus_per_node=1,
                                max_colocated_worker_groups=1, name=f"cpu{id(resume)}")
    policy = _policy_with_resume(Policy, resume, cluster=cluster, config=config, tokenizer=tokenizer,
                                 init_reference_model=False)
    session = NemoSession(policy, None, tokenizer, {"policy": config}, refit=None)
    session.resumed_from = resume
    return NemoPolicy(session, behaviour_ratio=False), policy, cluster


def _batch(vocab: int):
    import torch

    from rise_nemo.interfaces import KIND_GUIDED, KIND_NATURAL

    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, vocab, (ROWS, WIDTH), generator=g)
    lengths = torch.tensor([12, 10, 12, 8, 12, 9])
    token_mask = torch.zeros(ROWS, WIDTH)
    for i, n in enumerate(lengths.tolist()):
        token_mask[i, 4:n] = 1.0  # prompt = the first 4 tokens, response after
        input_ids[i, n:] = 0
    return {
        "input_ids": input_ids, "input_lengths": lengths, "token_mask": token_mask,
        "sample_mask": torch.ones(ROWS), "kind": torch.tensor([KIND_NATURAL] * NATURAL + [KIND_GUIDED] * (ROWS - NATURAL)),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 0.8, 0.3]),  # natural: eq. 1; guided: A_ref (eq. 7)
    }


def test_real_dtensor_policy_logprobs_train_save_resume(tmp_path, ray_private):
    import torch
    from tiny_qwen3 import build
    from transformers import AutoModelForCausalLM

    from rise_nemo.backends.nemo.batch import attach_global_counts
    from rise_nemo.backends.nemo.checkpoints import policy_dir
    from rise_nemo.core.losses import ObjectiveConfig, policy_loss_fn, policy_objective

    model_dir = build(tmp_path / "tiny_qwen3", vocab_size=512)
    vocab = AutoModelForCausalLM.from_pretrained(model_dir).config.vocab_size
    data = _batch(vocab)

    # Reference log-probs computed here with plain transformers: the worker's numbers must match them.
    hf = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(input_ids=data["input_ids"]).logits.float()
    expected = torch.zeros(ROWS, WIDTH)
    expected[:, 1:] = torch.log_softmax(logits[:, :-1], -1).gather(-1, data["input_ids"][:, 1:, None])[..., 0]
    valid = torch.arange(WIDTH)[None, :] < data["input_lengths"][:, None]

    nemo_policy, policy, cluster = _build_policy(model_dir, None)
    try:
        # get_logprobs: our padding (rows to DP x logprob_batch) and un-padding around the real worker.
        before = nemo_policy.get_logprobs(data)
        assert before.shape == (ROWS, WIDTH)
        torch.testing.assert_close(before[valid], expected[valid], atol=1e-4, rtol=1e-4)

        # one train step with our GRPO loss adapter (RiseLossFunction around policy_loss_fn)
        batch = dict(data, prev_logprobs=before)
        cfg = ObjectiveConfig(lambda_guide=0.05)
        metrics = nemo_policy.train(batch, policy_loss_fn(cfg))
        assert torch.isfinite(torch.tensor(metrics["loss"])), metrics
        # the worker's four micro-batches (the last one padding only), each normalised by our global counts,
        # sum to eq. 12 on the whole unsplit batch at the same log-probs (ratio 1: the first step's weights)
        unsplit = attach_global_counts(dict(batch, token_mask=data["token_mask"], sample_mask=data["sample_mask"]))
        expected_loss, expected_metrics = policy_objective(before, unsplit, cfg)
        assert metrics["loss"] == pytest.approx(float(expected_loss), abs=1e-5), metrics
        assert metrics["loss/guide"] == pytest.approx(expected_metrics["loss/guide"], abs=1e-5), metrics
        assert expected_metrics["loss/guide"] > 0 and expected_metrics["loss/pg"] != 0  # both terms act
        # and independently of our code: at ratio 1 the PG term is -sum(A_i x tokens_i) / natural tokens
        tokens, adv = data["token_mask"][:NATURAL].sum(1), data["advantages"][:NATURAL]
        assert metrics["loss/pg"] == pytest.approx(float(-(adv * tokens).sum() / tokens.sum()), abs=1e-5), metrics
        assert metrics["policy/grad_norm"] > 0, metrics
        assert metrics["nemo/train_rows"] == ROWS and metrics["nemo/padded_rows"] == GLOBAL_BATCH - ROWS
        after = nemo_policy.get_logprobs(data)
        assert (after[valid] - before[valid]).abs().max() > 1e-3, "the weights did not change"
        # every natural row's response log-prob moves in its advantage's direction (lr 1e-2, one Adam step; margins ~2-9 nats)
        mask = data["token_mask"].bool()
        gain = ((after - before) * mask).sum(1)
        assert torch.equal(torch.sign(gain[:NATURAL]), torch.sign(data["advantages"][:NATURAL])), gain

        # save_checkpoint: our layout <ckpt>/policy/{weights,optimizer,tokenizer} through the real DCP save
        ckpt = tmp_path / "checkpoints" / "step_000001"
        nemo_policy.save_checkpoint(ckpt / "policy")
        assert (ckpt / "policy" / "weights").is_dir() and (ckpt / "policy" / "optimizer").is_dir()
    finally:
        policy.shutdown()
        cluster.shutdown()

    # resume: our rule picks weights AND optimizer (a DTensor checkpoint has a separate optimizer dir), and
    # the Policy NeMo-RL builds from it computes the trained log-probs, not the initial ones.
    from rise_nemo.backends.nemo import resume_paths

    resume = policy_dir(ckpt)
    assert resume_paths(resume) == (str(resume / "weights"), str(resume / "optimizer"))
    resumed, policy2, cluster2 = _build_policy(model_dir, resume)
    try:
        resumed.load_checkpoint(resume)  # the hook accepts the checkpoint the policy was built from
        again = resumed.get_logprobs(data)
        torch.testing.assert_close(again[valid], after[valid], atol=1e-4, rtol=1e-4)
    finally:
        policy2.shutdown()
        cluster2.shutdown()
