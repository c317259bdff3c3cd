"""The nemo backend's Policy/Generator and batch construction on CPU, driven by the real orchestration loop
over CPU stand-ins that honour NeMo-RL's contracts (tests/nemo/cpu_nemo.py). Tests that need NeMo-RL itself
are in test_with_nemo_rl.py."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from cpu_nemo import CpuMegatronPolicy, CpuVllm, make_prompts, make_refit, make_tokenizer, master_config  # noqa: E402

from rise_nemo.backends.nemo.batch import (  # noqa: E402
    BatchError,
    check_train_batch,
    generation_input,
    rollouts_from_generation,
    sum_microbatch_metrics,
    to_nemo_train_batch,
    use_behaviour_logprobs,
)
from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoPolicy, NemoSession  # noqa: E402
from rise_nemo.config import config_from_dict  # noqa: E402
from rise_nemo.interfaces import KIND_GUIDED, KIND_NATURAL, SamplingParams  # noqa: E402
from rise_nemo.judges import build_judge  # noqa: E402
from rise_nemo.loop.trainer import Trainer  # noqa: E402

torch.set_num_threads(1)
MAX_NEW = 10


def make_backend(dp=2, mbs=2, behaviour_ratio=False):
    events: list[str] = []
    tok = make_tokenizer()
    policy = CpuMegatronPolicy(len(tok), dp, events)
    vllm = CpuVllm(len(tok), MAX_NEW, tok.pad_token_id, tok.eos_token_id, events)
    session = NemoSession(policy, vllm, tok, master_config(MAX_NEW, mbs), refit=make_refit(events), to_batched=dict)
    return NemoPolicy(session, behaviour_ratio), NemoGenerator(session), events, policy, vllm


def recipe(run_dir: Path, method: str = "rise", steps: int = 3) -> dict:
    return {
        "run": {"name": "cpu-nemo", "dir": str(run_dir), "seed": 1},
        "backend": "nemo", "method": method,
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": MAX_NEW},
        "rise": {"lambda_guide": 0.2, "privileged_group_size": 4, "schedule": {"mode": "fixed", "switch_step": 50}},
        "data": {"source": "persistent"}, "judge": {"type": "rule"},
        "train": {"steps": steps, "checkpoint_every": 0, "progress": False, "keep_checkpoints": 0},
        "eval": {"every": 0, "at_start": False, "samples_per_prompt": 8},
        "nemo": {"plan": {"nodes": 1}},
    }


@pytest.fixture(scope="module")
def rise_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("rise")
    policy, generator, events, cpu_policy, vllm = make_backend()
    before = cpu_policy.model.table.detach().clone()
    cfg = config_from_dict(recipe(run_dir))
    trainer = Trainer(cfg, policy, generator, build_judge(cfg.judge), make_prompts(6), make_prompts(2, 6),
                      run_dir=run_dir)
    assert trainer.run() == 0
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"events": events, "policy": cpu_policy, "generator": generator, "before": before, "metrics": metrics,
            "run_dir": run_dir, "vllm": vllm}


def _steps(events: list[str]) -> list[list[str]]:
    """Split the event log at each policy.train (the last chunk is the final evaluation/save)."""
    out, cur = [], []
    for e in events:
        cur.append(e)
        if e == "policy.train":
            out.append(cur)
            cur = []
    return out + [cur]


def test_one_refit_and_one_window_per_step(rise_run):
    steps = _steps(rise_run["events"])[:-1]
    assert len(steps) == 3
    for chunk in steps:
        gen_part = chunk[: chunk.index("vllm.finish_generation") + 1]
        assert gen_part.count("refit") == 1  # fresh weights into vLLM once per step...
        assert gen_part.count("vllm.prepare_for_generation") == 1  # ...and one wake-up
        assert gen_part.count("vllm.generate") == 2  # natural + privileged in the same window
        # vLLM sleeps before the Megatron forward, and the policy trains once
        assert chunk.index("vllm.finish_generation") < chunk.index("policy.get_logprobs")
        assert chunk.index("policy.prepare_for_training") < chunk.index("policy.train")
        assert chunk.count("policy.train") == 1


def test_train_batches_splice_guided_rows_onto_original_prompts(rise_run):
    calls, gen = rise_run["policy"].train_calls, rise_run["generator"]
    originals = {tuple(gen.encode_prompt(list(p.messages))) for p in make_prompts(6)}
    guided_seen = masked_rows = 0
    for data in calls:
        b, t = data["input_ids"].shape
        assert t % 4 == 0 and b % 4 == 0  # make_sequence_length_divisible_by, DP 2 x micro-batch 2
        real = data["sample_mask"].bool()
        natural = real & (data["kind"] == KIND_NATURAL)
        assert float(data["natural_token_count"][0]) == float(data["token_mask"][natural].sum())
        assert float(data["guided_seq_count"][0]) == float((real & (data["kind"] == KIND_GUIDED)).sum())
        assert data["natural_token_count"].unique().numel() == 1  # a global column, padding rows included
        for row in torch.nonzero(real & (data["kind"] == KIND_GUIDED)).flatten().tolist():
            guided_seen += 1
            # The row opens with an ORIGINAL prompt (no hint; a hinted prompt differs before its end-of-turn).
            prompt = [o for o in originals if tuple(data["input_ids"][row, : len(o)].tolist()) == o]
            assert len(prompt) == 1, "guided row does not start with an original prompt"
            start, length = len(prompt[0]), int(data["input_lengths"][row])
            mask = data["token_mask"][row]
            assert mask[:start].eq(0).all() and mask[length:].eq(0).all() and mask[start:length].any()
            # Inside the response the only holes are penalised spans (masks are on by default): each run of
            # zeros spells the met negative criterion's text ("Says gamma").
            holes = (mask[start:length] == 0).nonzero().flatten().add(start).tolist()
            for run in _runs(holes):
                masked_rows += 1
                assert "gamma" in gen.decode_response(data["input_ids"][row, run].tolist())
        assert data["token_mask"][~real].sum() == 0
    assert guided_seen > 0, "no privileged response was retained in 3 steps (seeded run): nothing tested"
    assert masked_rows > 0, "no penalised span was masked in 3 steps (seeded run): the mask path is untested"


def _runs(positions: list[int]) -> list[list[int]]:
    """Sorted positions -> runs of consecutive ones."""
    out: list[list[int]] = []
    for p in positions:
        if out and p == out[-1][-1] + 1:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def test_training_changes_weights_and_reports_metrics(rise_run):
    assert not torch.equal(rise_run["before"], rise_run["policy"].model.table.detach())
    train_rows = [m for m in rise_run["metrics"] if "loss/pg" in m]
    assert len(train_rows) == 3
    for m in train_rows:
        assert all(isinstance(m[k], float) and m[k] == m[k] for k in ("loss/pg", "loss/guide"))
    assert (rise_run["run_dir"] / "checkpoints").exists()
    assert "policy.save_checkpoint" in rise_run["events"]


def test_generator_refuses_settings_vllm_was_not_built_with():
    _, generator, *_ = make_backend()
    with pytest.raises(ValueError, match=r"temperature=0.7.*sampling.temperature"):
        generator.generate([[{"role": "user", "content": "describe the sun"}]], 2,
                           SamplingParams(max_new_tokens=MAX_NEW, temperature=0.7))


def test_logprobs_are_trimmed_back_and_match_direct_computation():
    policy, generator, _, cpu_policy, _ = make_backend(dp=2, mbs=2)
    prompts = [list(p.messages) for p in make_prompts(3)]
    rolls = generator.generate(prompts, 1, SamplingParams(max_new_tokens=MAX_NEW))
    ids = [r[0].prompt_token_ids + r[0].response_token_ids for r in rolls]
    t = max(map(len, ids))
    input_ids = torch.zeros(3, t, dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x)
    lp = policy.get_logprobs({"input_ids": input_ids, "input_lengths": torch.tensor([len(x) for x in ids])})
    assert lp.shape == (3, t) and lp[:, 0].eq(0).all()
    with torch.no_grad():
        ref = cpu_policy.model.next_token_logprobs(input_ids)
    torch.testing.assert_close(lp[:, 1:], ref)
    # right after a refit the sampler's log-probs are the trainer's: same weights, same tokens
    for i, r in enumerate(rolls):
        p = len(r[0].prompt_token_ids)
        torch.testing.assert_close(torch.tensor(r[0].sampling_logprobs), lp[i, p: p + len(r[0].response_token_ids)])


def test_generation_io_order_and_parsing():
    data = generation_input([[5, 6, 7], [8]], n=2, pad_id=0)
    assert data["input_ids"].tolist() == [[5, 6, 7], [5, 6, 7], [8, 0, 0], [8, 0, 0]]
    assert data["input_lengths"].tolist() == [3, 3, 1, 1]
    out = {  # prompt then response, right-padded, as NeMo-RL's GenerationOutputSpec
        "output_ids": torch.tensor([[5, 6, 7, 1, 2], [5, 6, 7, 3, 0], [8, 4, 4, 9, 0], [8, 9, 0, 0, 0]]),
        "logprobs": torch.tensor([[0, 0, 0, -.1, -.2], [0, 0, 0, -.3, 0], [0, -.4, -.5, -.6, 0], [0, -.7, 0, 0, 0]]),
        "generation_lengths": torch.tensor([2, 1, 3, 1]),
        "truncated": torch.tensor([True, False, True, False]),
    }
    msgs = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    rolls = rollouts_from_generation(out, msgs, [[5, 6, 7], [8]], 2, decode=lambda ids: " ".join(map(str, ids)))
    assert [r.response_token_ids for r in rolls[0]] == [[1, 2], [3]]
    assert [r.response_token_ids for r in rolls[1]] == [[4, 4, 9], [9]]
    assert rolls[1][0].sampling_logprobs == pytest.approx([-.4, -.5, -.6])
    assert [r.finished for g in rolls for r in g] == [False, True, False, True]
    assert rolls[1][1].prompt_messages == msgs[1] and rolls[0][0].response_text == "1 2"
    with pytest.raises(BatchError, match="expected 2 prompts x 3"):
        rollouts_from_generation(out, msgs, [[5, 6, 7], [8]], 3, decode=str)


def _batch():
    b, t = 4, 6
    tm = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1], [0, 1, 1, 0, 0, 0]]).float()
    return {"input_ids": torch.arange(b * t).reshape(b, t), "input_lengths": torch.tensor([4, 5, 6, 3]),
            "token_mask": tm, "sample_mask": torch.ones(b), "advantages": torch.tensor([1., -1., .5, .2]),
            "kind": torch.tensor([0, 0, 1, 0]), "prev_logprobs": -torch.ones(b, t),
            "generation_logprobs": -2 * torch.ones(b, t),
            # row 1: a natural-kind row sampled under another prompt (coupled privileged / RuscaRL)
            "sampled_under_train_prompt": torch.tensor([1., 0., 0., 1.])}


def test_behaviour_ratio_touches_only_response_tokens_sampled_under_the_train_prompt():
    out = use_behaviour_logprobs(_batch())
    own = torch.tensor([1, 0, 0, 1]).bool()[:, None] & _batch()["token_mask"].bool()
    assert out["prev_logprobs"][own].eq(-2).all() and out["prev_logprobs"][~own].eq(-1).all()
    bad = _batch()
    del bad["sampled_under_train_prompt"]
    with pytest.raises(BatchError, match="sampled_under_train_prompt"):
        use_behaviour_logprobs(bad)


def test_train_batch_padding_and_errors():
    data, rows = to_nemo_train_batch(_batch(), dp_size=3, micro_batch_size=2, seq_multiple=4, pad_id=9,
                                     behaviour_ratio=False)
    assert rows == 4 and data["input_ids"].shape == (6, 8)
    assert data["input_ids"][4:].eq(9).all() and data["sample_mask"][4:].eq(0).all()
    assert data["input_lengths"][4:].eq(1).all() and data["kind"][4:].eq(KIND_NATURAL).all()
    assert data["natural_token_count"].eq(2 + 4 + 2).all() and data["guided_seq_count"].eq(1).all()
    bad = _batch()
    bad["advantages"] = torch.zeros(4, 6)
    with pytest.raises(BatchError, match="'advantages' has shape"):
        check_train_batch(bad)
    bad = _batch()
    bad["kind"] = torch.tensor([0, 2, 0, 0])
    with pytest.raises(BatchError, match="'kind' holds"):
        check_train_batch(bad)
    bad = _batch()
    del bad["prev_logprobs"]
    with pytest.raises(BatchError, match="prev_logprobs"):
        to_nemo_train_batch(bad, 1, 1, 1, 0, False)


def test_metric_sums_keep_repeated_stamps_once():
    assert sum_microbatch_metrics({"loss/pg": [0.1, 0.2], "lr": [1e-6, 1e-6]}) == pytest.approx(
        {"loss/pg": 0.3, "lr": 1e-6})


def test_resume_must_match_the_checkpoint_the_policy_was_built_from(tmp_path):
    policy, *_ = make_backend()
    with pytest.raises(RuntimeError, match="built from scratch"):
        policy.load_checkpoint(tmp_path / "step_000002" / "policy")
    policy.session.resumed_from = tmp_path / "step_000002" / "policy"
    policy.load_checkpoint(tmp_path / "step_000002" / "policy")


@pytest.mark.parametrize("method, kl", [("coupled", 0.0), ("ruscarl", 0.0), ("rubric_rl", 0.01)])
def test_other_methods_run_one_step(tmp_path, method, kl):
    policy, generator, events, cpu_policy, _ = make_backend(behaviour_ratio=True)
    tree = recipe(tmp_path, method, steps=1)
    tree["policy_loss"] = {"kl_coef": kl}
    cfg = config_from_dict(tree)
    trainer = Trainer(cfg, policy, generator, build_judge(cfg.judge), make_prompts(4), make_prompts(2, 4),
                      run_dir=tmp_path)
    assert trainer.run() == 0
    assert events.count("policy.train") == 1
    data = cpu_policy.train_calls[0]
    assert (data["kind"] == KIND_GUIDED).sum() == 0  # these methods train natural-kind rows only
    assert ("policy.get_reference_policy_logprobs" in events) == (kl > 0)
    if kl > 0:
        assert "reference_policy_logprobs" in data


def test_one_pass_guidance_sends_natural_and_privileged_prompts_in_one_vllm_batch(tmp_path):
    """rise.guidance_pass=one: once every prompt was visited (steps 4-6 of 6 prompts x 2 per step), each step
    makes ONE vLLM generate request holding the natural rows and the hinted rows (a mixed batch)."""
    policy, generator, events, _, vllm = make_backend()
    tree = recipe(tmp_path, "rise", steps=6)
    tree["rise"]["guidance_pass"] = "one"
    cfg = config_from_dict(tree)
    trainer = Trainer(cfg, policy, generator, build_judge(cfg.judge), make_prompts(6), make_prompts(2, 6),
                      run_dir=tmp_path)
    assert trainer.run() == 0
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = _steps(events)[:-1]
    assert len(steps) == 6
    for chunk, m in zip(steps[3:], metrics[3:]):
        assert chunk.count("vllm.generate") == 1 and m["guidance/two_pass_prompts"] == 0
    hinted = sum(m["guidance/one_pass_prompts"] for m in metrics[3:])
    assert hinted > 0 and sum(m["guidance/privileged_rollouts"] for m in metrics[3:]) == 4 * hinted


def test_judge_sees_the_answer_not_the_reasoning():
    from rise_nemo.core.rubric import judged_text

    assert judged_text("<think>\nplan: mention alpha\n</think>\n\nbeta gamma") == "beta gamma"
    assert judged_text("no reasoning block") == "no reasoning block"
    assert judged_text("<think>\nstill thinking when cut at max_new_tokens") == ""


def test_nemo_dataset_is_padded_to_one_batch_and_carries_the_rubric():
    from rise_nemo.backends.nemo import nemo_dataset
    from rise_nemo.backends.nemo.environment import rubric_from_metadata

    _, generator, *_ = make_backend()
    prompts = make_prompts(3)
    data = nemo_dataset(prompts, generator.encode_prompt, min_size=8)
    assert len(data) == 8 and [d["idx"] for d in data] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert data[0]["message_log"][0]["token_ids"].tolist() == generator.encode_prompt(list(prompts[0].messages))
    assert rubric_from_metadata(data[1]["extra_env_info"]) == prompts[1].rubric
    assert data[2]["extra_env_info"]["conversation"] == [dict(m) for m in prompts[2].messages]


@pytest.mark.parametrize("recipe", ["ppo_math_7b", "rrl_math_7b", "grpo_math_qwen3_4b"])
def test_nemo_dataset_of_a_reasoning_recipe(recipe, tmp_path, monkeypatch):
    """Every reasoning recipe's training set (ReasoningProblem, no rubric) crashed
    build_backend -> nemo_dataset with AttributeError 'rubric'. Loaded here the way `rise-nemo train` loads
    it (the recipe itself, its data loader); each datum carries the answer for NeMo-RL's math environment and
    never the hidden reference solution."""
    from rise_nemo.backends.nemo import nemo_dataset
    from rise_nemo.config import load_config
    from rise_nemo.loop.data import load_prompts

    rows = [{"problem": f"What is {i} + 1?", "solution": f"{i} + 1 = \\boxed{{{i + 1}}}", "level": "Level 1"}
            for i in range(3)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("RISE_TRAIN_DATA", str(tmp_path / "train.jsonl"))
    monkeypatch.setenv("RISE_EVAL_DATA", str(tmp_path / "train.jsonl"))
    cfg = load_config(Path(__file__).parents[2] / "recipes" / f"{recipe}.yaml")
    train, _ = load_prompts(cfg)
    _, generator, *_ = make_backend()
    data = nemo_dataset(train, generator.encode_prompt, min_size=4)
    assert len(data) == 4 and [d["task_name"] for d in data] == ["math"] * 4
    assert [d["extra_env_info"]["ground_truth"] for d in data] == ["1", "2", "3", "1"]
    assert data[1]["message_log"][0]["token_ids"].tolist() == generator.encode_prompt(list(train[1].messages))
    assert not any("\\boxed" in json.dumps(d["extra_env_info"]) for d in data)


def test_nemo_rl_is_found_through_nemo_rl_dir(tmp_path, monkeypatch):
    """NeMo-RL comes from the environment or from $NEMO_RL_DIR: a checkout there goes on sys.path and on
    PYTHONPATH (for the Ray workers) when nemo_rl is not importable otherwise."""
    import importlib

    from rise_nemo.backends.nemo.config import put_nemo_rl_on_path

    if importlib.util.find_spec("nemo_rl") is not None:
        pytest.skip("nemo_rl is importable here already")  # make test-nemo: real NeMo-RL on PYTHONPATH
    (tmp_path / "nemo_rl").mkdir()
    (tmp_path / "nemo_rl" / "__init__.py").write_text("MARK = 'checkout'\n")
    monkeypatch.setenv("NEMO_RL_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(sys, "path", list(sys.path))
    put_nemo_rl_on_path()
    try:
        assert importlib.import_module("nemo_rl").MARK == "checkout"
        assert os.environ["PYTHONPATH"] == f"{tmp_path.resolve()}{os.pathsep}/elsewhere"
    finally:
        sys.modules.pop("nemo_rl", None)


def test_a_prompt_that_fills_max_model_len_is_refused_with_the_key():
    """vLLM rejects such a prompt deep inside its worker ("maximum context length is 96 tokens"), killing the
    step; the generator names the prompt and the key before sending anything."""
    policy, generator, events, _, _ = make_backend()
    generator.max_model_len = 8
    prompts = [list(p.messages) for p in make_prompts(2)]
    with pytest.raises(ValueError, match=r"prompt \d of this batch has \d+ tokens.*vllm_cfg\.max_model_len=8"):
        generator.generate(prompts, 2, SamplingParams(max_new_tokens=MAX_NEW))
    assert "vllm.generate" not in events


def test_embedded_warm_start_is_local_only_and_can_be_turned_off(tmp_path):
    """data.warm_start trains the local backend's model; on backend nemo it is a one-line error naming the
    key (it crashed with AttributeError 'NemoPolicy' object has no attribute 'engine'), and
    data.warm_start.enabled=false skips it."""
    from rise_nemo.errors import UserError
    from rise_nemo.loop.data import warm_start_policy

    policy, generator, *_ = make_backend()
    tree = recipe(tmp_path)
    tree["data"] = {"source": "persistent"}
    with pytest.raises(UserError, match=r"data\.warm_start: .*backend nemo set data\.warm_start\.enabled=false"):
        warm_start_policy(config_from_dict(tree), policy, generator, progress=False)
    tree["data"]["warm_start"] = {"enabled": False}
    assert warm_start_policy(config_from_dict(tree), policy, generator, progress=False) is None
