"""The local backend on real text: `rise-nemo train` with `local.model_path` = a directory
holding a Hugging Face causal LM and its tokenizer, on real GSM8K rows, end to end: GRPO and PPO (critic on the
real model), checkpoint, exact resume, loaded offline; and real text without a real model is refused.

The model is a tiny Qwen3 saved with save_pretrained beside a byte-level BPE tokenizer trained by `tokenizers`
on the GSM8K fixture (a PreTrainedTokenizerFast with a ChatML chat template), then fine-tuned for a few steps on
the fixture's reference solutions so that sampled answers are sometimes right: rewards vary inside groups and
the policy gradient is not zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "judges"))

import tiny_qwen3  # noqa: E402

from rise_nemo.cli import main  # noqa: E402
from rise_nemo.loop.trainer import read_metrics, reproducible_metrics  # noqa: E402

GSM8K = Path(__file__).resolve().parents[1] / "data" / "fixtures" / "gsm8k_test_first8.jsonl"
SFT_STEPS = 40  # enough for ~40% of sampled answers to be right (pass@1 0.375 at step 0), not all of them


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rise_nemo.data.reasoning import load_reasoning_problems

    problems = load_reasoning_problems(GSM8K).problems
    out = tmp_path_factory.mktemp("real_model") / "tiny-qwen3-gsm8k"
    corpus = [p.messages[-1]["content"] + "\n" + p.reference_solution for p in problems] * 5
    tiny_qwen3.build(out, vocab_size=800, corpus=corpus)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    rows = []
    for p in problems:
        prompt = tok.apply_chat_template(list(p.messages), add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        rows.append((prompt, tok.encode(p.reference_solution, add_special_tokens=False) + [tok.eos_token_id]))
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (a, b) in enumerate(rows):
        ids[i, : len(a) + len(b)] = torch.tensor(a + b)
        labels[i, len(a) : len(a) + len(b)] = torch.tensor(b)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with torch.random.fork_rng():
        for _ in range(SFT_STEPS):
            model(input_ids=ids, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
    model.save_pretrained(out)
    return out


def _args(model_dir: Path, run: Path, recipe: str, *extra: str) -> list[str]:
    return ["train", "--config", recipe, f"local.model_path={model_dir}", f"data.train_path={GSM8K}",
            f"data.eval_path={GSM8K}", f"run.dir={run}", "train.steps=2", "train.checkpoint_every=1",
            "train.progress=false", "sampling.prompts_per_step=2", "sampling.group_size=4", "sampling.max_new_tokens=160",
            "eval.every=2", "eval.samples_per_prompt=4", "eval.max_prompts=4", "local.num_threads=1",
            "local.lr=1e-3", *extra]


def _evals(run: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((run / "eval").glob("step_*.json"))}


def _same_run(a: Path, b: Path) -> None:
    assert [reproducible_metrics(m) for m in read_metrics(a)] == [reproducible_metrics(m) for m in read_metrics(b)]
    assert _evals(a) == _evals(b)


def test_grpo_on_gsm8k_with_a_real_model_offline_then_exact_resume(model_dir, tmp_path):
    """`rise-nemo train` in a fresh process with the Hub offline and an empty HF cache: the model and tokenizer
    come from local.model_path only. Then the same run stopped after step 1 and resumed gives the same numbers."""
    full = tmp_path / "full"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    proc = subprocess.run([sys.executable, "-m", "rise_nemo.cli", *_args(model_dir, full, "grpo_gsm8k_local")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (tmp_path / "hf_home" / "hub").exists() or not any((tmp_path / "hf_home" / "hub").iterdir())
    metrics = read_metrics(full)
    assert [m["step"] for m in metrics] == [1, 2]
    assert any(0 < m["reward/mean"] < 1 for m in metrics), metrics  # right and wrong answers in one step
    assert any(m["grad_norm"] > 0 for m in metrics)
    samples = [json.loads(x) for x in (full / "samples.jsonl").read_text().splitlines()]
    assert any("\\boxed{" in s["response"] for s in samples)  # real text from the real tokenizer, no <unk>
    assert "<|unk|>" not in (full / "samples.jsonl").read_text()
    assert sorted(_evals(full)) == ["step_000000.json", "step_000002.json"]
    assert (full / "checkpoints" / "step_000002" / "policy" / "state.pt").is_file()

    parts = tmp_path / "parts"
    assert main([*_args(model_dir, parts, "grpo_gsm8k_local"), "--stop-after", "1"]) == 0
    assert [m["step"] for m in read_metrics(parts)] == [1]
    assert main(_args(model_dir, parts, "grpo_gsm8k_local")) == 0
    _same_run(full, parts)


def test_ppo_on_gsm8k_trains_a_critic_on_the_real_model_and_resumes(model_dir, tmp_path):
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert main(_args(model_dir, full, "ppo_gsm8k_local")) == 0
    metrics = read_metrics(full)
    assert all(torch.isfinite(torch.tensor(m["critic/value_loss"])) for m in metrics)
    assert any(m["critic/value_loss"] > 0 for m in metrics)
    state = torch.load(full / "checkpoints" / "step_000002" / "critic" / "state.pt", weights_only=False)
    hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
    assert state["head"]["weight"].shape == (1, hidden) and state["train_steps"] == 2
    assert main([*_args(model_dir, parts, "ppo_gsm8k_local"), "--stop-after", "1"]) == 0
    assert main(_args(model_dir, parts, "ppo_gsm8k_local")) == 0
    _same_run(full, parts)


def test_real_text_without_a_real_model_is_refused_naming_the_key(tmp_path, capsys):
    """A command that once went wrong: the embedded task's tiny recipe on GSM8K rows trained garbage and exited 0."""
    run = tmp_path / "run"
    rc = main(["train", "--config", "grpo_chain_tiny_cpu", "data.source=jsonl", "data.format=gsm8k",
               f"data.train_path={GSM8K}", f"data.eval_path={GSM8K}", f"run.dir={run}", "train.progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "local.model_path" in err[0] and "real" in err[0], err
    assert not run.exists()  # refused before anything was built or written


def test_a_word_tokenizer_meeting_text_outside_its_vocabulary_is_refused(tmp_path, capsys):
    """Rubric data of the real world through the demo task's word-level vocabulary: unknown tokens."""
    from rise_nemo.data.samples import healthbench_sample_path

    rc = main(["train", "--config", "rise_tiny_cpu", "data.source=jsonl", "data.format=healthbench",
               f"data.train_path={healthbench_sample_path()}", f"run.dir={tmp_path / 'run'}", "train.progress=false"])
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("[rise-nemo] loaded")]
    assert rc == 2 and len(err) == 1 and "local.tokenizer" in err[0] and "unknown" in err[0], err
    assert "local.model_path" in err[0]


def test_exprl_on_real_text_with_the_embedded_rule_judge_is_refused(model_dir, tmp_path, capsys):
    rc = main(_args(model_dir, tmp_path / "run", "grpo_gsm8k_local", "method=exprl_outcome"))
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("[rise-nemo] loaded")]
    assert rc == 2 and len(err) == 1 and "judge.type" in err[0] and "judge.type=http" in err[0], err


def test_rrl_on_gsm8k_stores_states_at_the_default_granularity(model_dir, tmp_path):
    """On the real path: RRL's default cut points (line breaks) exist in real solutions, so
    the buffer fills from the first step (the old default, a literal "step" marker, stored nothing)."""
    run = tmp_path / "rrl"
    assert main(_args(model_dir, run, "ppo_gsm8k_local", "method=rrl", "rrl.stabilise.max_steps=0")) == 0
    metrics = read_metrics(run)
    assert metrics[0]["rrl/states_added"] > 0 and all(m["rrl/buffer_size"] > 0 for m in metrics), metrics
