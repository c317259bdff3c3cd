"""GPU functional test: 3 RISE-RL steps on NeMo-RL (Megatron policy + colocated vLLM) with a small Qwen3 and
the rule judge, on ONE GPU. Run by hand inside the NeMo-RL container (never in CI):

    cd /path/to/rise_nemo
    NEMO_RL_DIR=/opt/nemo-rl pytest -q tests/functional -p no:cacheprovider

Needs CUDA, ``nemo_rl`` importable, NeMo-RL's example configs under $NEMO_RL_DIR/examples/configs, and the
model (default Qwen/Qwen3-0.6B; RISE_FUNCTIONAL_MODEL to change) in the HF cache or reachable. It starts
from recipes/rise_4b.yaml and shrinks it to one GPU with overrides, so the recipe's NeMo-RL settings are
what is exercised. Asserted bounds follow NeMo-RL's own functional tests: finite losses, a sampler/trainer
log-prob gap that stays small (the analogue of its token_mult_prob_error <= 1.05 check), rewards in [0, 1],
at least one retained privileged response.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("functional tests need a CUDA GPU", allow_module_level=True)
pytest.importorskip("nemo_rl")

REPO = Path(__file__).resolve().parents[2]
MODEL = os.environ.get("RISE_FUNCTIONAL_MODEL", "Qwen/Qwen3-0.6B")

ONE_GPU = [
    "nemo.plan.nodes=1", "~nemo.plan.judge", "nemo.cluster.num_nodes=1", "nemo.cluster.gpus_per_node=1",
    f"nemo.policy.model_name={MODEL}", f"nemo.policy.tokenizer.name={MODEL}",
    "nemo.policy.megatron_cfg.tensor_model_parallel_size=1", "nemo.policy.megatron_cfg.pipeline_model_parallel_size=1",
    "nemo.policy.megatron_cfg.sequence_parallel=false", "nemo.policy.make_sequence_length_divisible_by=1",
    "nemo.policy.max_total_sequence_length=1024", "nemo.policy.sequence_packing.train_mb_tokens=1024",
    "nemo.policy.sequence_packing.logprob_mb_tokens=1024", "nemo.policy.train_global_batch_size=32",
    "nemo.policy.generation.vllm_cfg.tensor_parallel_size=1", "nemo.policy.generation.vllm_cfg.max_model_len=1024",
    "nemo.policy.generation.vllm_cfg.gpu_memory_utilization=0.4",
    "sampling.prompts_per_step=4", "sampling.group_size=4", "sampling.max_new_tokens=256", "rise.privileged_group_size=4",
    "rise.lambda_guide=0.05", "rise.schedule.mode=fixed", "rise.schedule.switch_step=100", "reward.overlong_buffer=0",
    "judge={type: rule}", "train.steps=3", "train.checkpoint_every=0",
    "train.progress=false", "train.tensorboard=false", "eval.every=0", "eval.at_start=false", "eval.max_prompts=2",
]
BF16 = ["nemo.policy.megatron_cfg.fp8_cfg.enabled=false", "nemo.policy.generation.vllm_cfg.precision=bfloat16",
        "nemo.adapter.importance_sampling=none"]


TOPICS = ("a river", "a forest", "the moon", "a harbor", "a desert", "a glacier", "a market", "a library")


def write_prompts(path: Path, offset: int, n: int) -> str:
    """Rule-judged rubric prompts (keyword and length checks) in rise_nemo's JSONL format. A small instruct
    model meets some criteria unprompted and more when hinted, so rewards vary and guidance can help."""
    with open(path, "w") as fh:
        for i in range(offset, offset + n):
            topic = TOPICS[i % len(TOPICS)]
            fh.write(json.dumps({
                "prompt_id": f"f{i}",
                "messages": [{"role": "user", "content": f"Write a short paragraph about {topic}."}],
                "rubric": [
                    {"criterion": "Mentions the colour blue", "points": 3, "check": {"kind": "contains", "value": "blue"}},
                    {"criterion": "Mentions the word quiet", "points": 2, "check": {"kind": "contains", "value": "quiet"}},
                    {"criterion": "Uses at least 40 words", "points": 1, "check": {"kind": "min_words", "value": "40"}},
                    {"criterion": "Apologises", "points": -2, "check": {"kind": "contains", "value": "sorry"}},
                ],
            }) + "\n")
    return str(path)


@pytest.mark.parametrize("precision, extra, max_gap", [("bf16", BF16, 0.05), ("fp8", [], 0.2)])
def test_three_rise_steps(tmp_path, precision, extra, max_gap):
    from rise_nemo.config.loader import load_config
    from rise_nemo.loop.run import build_trainer

    run_dir = tmp_path / precision
    data = [f"data.train_path={write_prompts(tmp_path / 'train.jsonl', 0, 16)}",
            f"data.eval_path={write_prompts(tmp_path / 'eval.jsonl', 16, 4)}"]
    cfg = load_config(REPO / "recipes" / "rise_4b.yaml", [*ONE_GPU, *extra, *data, f"run.dir={run_dir}"])
    trainer = build_trainer(cfg)
    assert trainer.run() == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss/pg" in r]
    assert len(steps) == 3
    for r in steps:
        assert math.isfinite(r["loss/pg"]) and math.isfinite(r["loss/guide"])
        assert math.isfinite(r["policy/grad_norm"]) and r["policy/grad_norm"] > 0
        assert 0.0 <= r["reward/natural_mean"] <= 1.0
        # mean |log p_vLLM - log p_Megatron| over natural tokens; exp(gap) is NeMo-RL's token_mult_prob_error
        assert r["nemo/sampler_logprob_abs_err"] < max_gap
    assert sum(r.get("guidance/retained") or 0 for r in steps) > 0
