"""The reward-model reward (docs/methods.md "Reward-model reward") on a real tiny Hugging Face sequence
classifier: scores equal a direct forward, a padded batch equals one-by-one, the truncation rule, config
errors as one line naming the key, the normalisations, and recipes/ppo_hh_tiny_cpu.yaml trained end to end
(and RRL on the same data, the chosen replies as canonical states)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rise_nemo.backends.local.reward_model import LocalRewardModel, RewardModelConfigError
from rise_nemo.config.loader import load_config
from rise_nemo.core.rewards import reward_model_rewards
from rise_nemo.data.reasoning import load_reasoning_problems
from rise_nemo.errors import UserError
from rise_nemo.loop.run import build_trainer
from rise_nemo.loop.trainer import read_metrics
from rise_nemo.steps.verifiers import PreferenceVerifier, conversation

REPO = Path(__file__).resolve().parents[2]
HH = REPO / "rise_nemo" / "evals" / "data" / "hh_rlhf_harmless_8.jsonl"
RECIPE = REPO / "recipes" / "ppo_hh_tiny_cpu.yaml"


def save_tiny_classifier(path: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A random tiny Qwen3 sequence classifier + a word tokenizer over the HH sample's dialogues."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    from rise_nemo.backends.local.tokenizer import build_word_tokenizer

    problems = load_reasoning_problems(HH, "hh_rlhf").problems
    rows = [json.loads(line) for line in HH.read_text().splitlines()]
    tok = build_word_tokenizer([m["content"] for p in problems for m in p.messages]
                               + [r[k] for r in rows for k in ("chosen", "rejected")])
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64, num_labels=num_labels,
                         pad_token_id=tok.pad_token_id, max_position_embeddings=512)
    model = Qwen3ForSequenceClassification(config)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return save_tiny_classifier(tmp_path_factory.mktemp("rm") / "rm")


@pytest.fixture(scope="module")
def convs() -> list[list[dict[str, str]]]:
    problems = load_reasoning_problems(HH, "hh_rlhf").problems
    return [conversation(p, p.reference_solution) for p in problems] + [conversation(problems[0], "ok")]


def direct_score(rm: LocalRewardModel, ids: list[int]) -> float:
    with torch.no_grad():
        return float(rm.model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_scores_are_the_classifiers_forward_and_batching_changes_nothing(rm_dir, convs):
    one = LocalRewardModel(rm_dir, batch_size=1)
    batched = LocalRewardModel(rm_dir, batch_size=4)
    lengths = set()
    expected = []
    for c in convs:
        ids = one.tokenizer.apply_chat_template(c, tokenize=True, add_generation_prompt=False)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        lengths.add(len(ids))
        expected.append(direct_score(one, ids))
    assert len(lengths) > 3  # the batches really are padded
    got_one, got_batched = one.score(convs), batched.score(convs)
    assert got_one == pytest.approx(expected, abs=1e-5)
    assert got_batched == pytest.approx(got_one, abs=1e-5)
    assert len(set(round(x, 4) for x in got_one)) > 1  # a real model: the scores differ between dialogues
    assert (one.calls, one.truncated) == (len(convs), 0)


def test_truncation_keeps_the_last_tokens(rm_dir, convs):
    full = LocalRewardModel(rm_dir)
    long = max(convs, key=lambda c: len(full.encode(c)[0]))
    ids, cut = full.encode(long)
    assert not cut and len(ids) > 12
    short = LocalRewardModel(rm_dir, max_length=12)
    kept, cut = short.encode(long)
    assert cut and kept == ids[-12:]  # the oldest tokens go; the response's end stays
    assert short.score([long]) == pytest.approx([direct_score(full, ids[-12:])], abs=1e-5)
    assert short.truncated == 1


def test_config_errors_are_one_line_naming_the_key(rm_dir, tmp_path):
    with pytest.raises(RewardModelConfigError, match=r"^config key 'reward_model\.path': .* is not a directory"):
        LocalRewardModel(tmp_path / "missing")
    two = save_tiny_classifier(tmp_path / "two", num_labels=2)
    with pytest.raises(RewardModelConfigError, match=r"'reward_model\.path': .* num_labels=2") as info:
        LocalRewardModel(two)
    assert "\n" not in str(info.value)
    with pytest.raises(RewardModelConfigError, match=r"'reward_model\.dtype'"):
        LocalRewardModel(rm_dir, dtype="float16")


def test_bfloat16_scores_close_to_float32(rm_dir, convs):
    f32 = LocalRewardModel(rm_dir).score(convs[:3])
    bf16 = LocalRewardModel(rm_dir, dtype="bfloat16").score(convs[:3])
    assert bf16 == pytest.approx(f32, abs=0.1)


def test_reward_normalisation():
    scores = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    valid = torch.tensor([[True, True], [True, False]])
    assert reward_model_rewards(scores, valid).tolist() == [[1.0, 3.0], [5.0, 0.0]]
    assert reward_model_rewards(scores, valid, offset=1.0, clip=3.0).tolist() == [[0.0, 2.0], [3.0, 0.0]]
    w = reward_model_rewards(scores, valid, normalize="batch")
    assert float(w[valid].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(w[valid].std()) == pytest.approx(1.0, abs=1e-4) and float(w[1, 1]) == 0.0
    with pytest.raises(ValueError, match="normalize"):
        reward_model_rewards(scores, valid, normalize="running")


def test_preference_verifier_compares_with_the_chosen_reply(rm_dir):
    rm = LocalRewardModel(rm_dir)
    problems = load_reasoning_problems(HH, "hh_rlhf").problems[:3]
    responses = ["ok", problems[1].reference_solution, "no thanks"]
    got = PreferenceVerifier(rm).verify(problems, responses)
    mine = rm.score([conversation(p, r) for p, r in zip(problems, responses)])
    ref = rm.score([conversation(p, p.reference_solution) for p in problems])
    assert got == [a > b for a, b in zip(mine, ref)] and got[1] is False  # a tie is not a win


class _Ctx:
    def __init__(self, rm, cfg):
        self.reward_model, self.cfg = rm, cfg


def test_scorer_rewards_raw_scores_and_solved_means_beating_the_reference(rm_dir, tmp_path, monkeypatch):
    from rise_nemo.interfaces import Rollout
    from rise_nemo.steps.reward_model import reward_model_scores

    rm = LocalRewardModel(rm_dir)
    cfg = _cfg(tmp_path, rm_dir, monkeypatch)
    problems = load_reasoning_problems(HH, "hh_rlhf").problems[:2]
    texts = [["ok", problems[0].reference_solution, "no"], ["yes", "Sorry", problems[1].reference_solution]]
    groups = [[Rollout(prompt_messages=[], prompt_token_ids=[], response_token_ids=[], response_text=t,
                       sampling_logprobs=[])
               for t in row] for row in texts]
    scored = reward_model_scores(_Ctx(rm, cfg), problems, groups)
    mine = torch.tensor([rm.score([conversation(p, t) for t in row]) for p, row in zip(problems, texts)])
    ref = torch.tensor(rm.score([conversation(p, p.reference_solution) for p in problems])).reshape(-1, 1)
    assert torch.allclose(scored.rewards, mine, atol=1e-5) and bool(scored.valid.all())
    assert scored.solved.tolist() == (mine > ref).tolist()
    assert not scored.solved[0, 1] and not scored.solved[1, 2]  # the reference itself does not beat itself
    assert scored.metrics["rm/beats_reference"] == pytest.approx(float((mine > ref).float().mean()))


def _cfg(tmp_path, rm: Path | None, monkeypatch, *overrides: str):
    if rm is not None:
        monkeypatch.setenv("RISE_REWARD_MODEL", str(rm))
    else:
        monkeypatch.delenv("RISE_REWARD_MODEL", raising=False)
    monkeypatch.chdir(REPO)  # the recipe's data paths are relative to the checkout
    return load_config(RECIPE, [f"run.dir={tmp_path / 'run'}", *overrides])


@pytest.mark.parametrize("overrides,match", [
    ((), r"^config key 'reward_model\.path': is null"),
    (("reward_model.path=/nonexistent/rm",), r"^config key 'reward_model\.path': /nonexistent/rm is not a directory"),
])
def test_recipe_errors_name_the_key(tmp_path, monkeypatch, overrides, match):
    cfg = _cfg(tmp_path, None, monkeypatch, *overrides)
    with pytest.raises(UserError, match=match) as info:
        build_trainer(cfg)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides,match", [
    (("reward.scorer=reward_modle",), r"command-line override: key 'reward\.scorer': unknown scorer 'reward_modle'"),
    (("method=rubric_rl", "data.source=persistent"),
     r"ppo_hh_tiny_cpu\.yaml: key 'reward\.scorer': method 'rubric_rl' runs the rubric step"),
])
def test_scorer_errors_are_refused_when_the_config_loads(tmp_path, monkeypatch, overrides, match):
    from rise_nemo.config import ConfigError

    with pytest.raises(ConfigError, match=match) as info:
        _cfg(tmp_path, None, monkeypatch, *overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("method", ["ppo", "rrl"])
def test_tiny_hh_recipe_trains_end_to_end(tmp_path, monkeypatch, rm_dir, method):
    extra = ("method=rrl", "rrl.granularity=token", "rrl.beta=1.0", "rrl.steps_per_epoch=1",
             "rrl.stabilise.max_steps=0") if method == "rrl" else ()
    cfg = _cfg(tmp_path, rm_dir, monkeypatch, *extra)
    trainer = build_trainer(cfg)
    assert isinstance(trainer.ctx.verifier, PreferenceVerifier) and trainer.ctx.verifier.reward_model is trainer.ctx.reward_model
    rm = trainer.ctx.reward_model
    assert trainer.run() == 0
    metrics = [m for m in read_metrics(tmp_path / "run") if "rm/score_mean" in m]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # normalize none: the reward is the raw score
        assert m["reward/mean"] == pytest.approx(m["rm/score_mean"], abs=1e-5)
        assert m["rm/truncated"] == 0 and 0.0 <= m["rm/beats_reference"] <= 1.0
    # 2 steps x (4 prompts x 4 rollouts + their 4 chosen replies), then the evaluation: 4 prompts x 2
    # samples + their 8 chosen replies
    assert rm.calls == 2 * (4 * 4 + 4) + 4 * 2 * 2
    evaluation = json.loads((tmp_path / "run" / "eval" / "step_000002.json").read_text())
    assert 0.0 <= evaluation["pass_at_1"] <= 1.0
    if method == "rrl":  # the chosen replies are RRL's canonical solutions: their states enter the buffer
        assert any(m.get("rrl/canonical_scored", 0) > 0 for m in read_metrics(tmp_path / "run"))
        return
    # `rise-nemo eval RUN_DIR` scores the checkpoint the same way (it used to treat jsonl rows as rubric prompts)
    from rise_nemo.cli import main

    assert main(["eval", str(tmp_path / "run")]) == 0
    again = json.loads((tmp_path / "run" / "eval" / "cli" / "step_000002.json").read_text())
    assert again["step"] == 2 and 0.0 <= again["pass_at_1"] <= 1.0
