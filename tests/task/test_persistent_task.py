"""The persistent-criteria task: structure, determinism, vocabulary coverage, warm-start rates and cache."""

from __future__ import annotations

import random

import pytest
import torch

from rise_nemo.backends.local import build
from rise_nemo.backends.local.tokenizer import builtin_tokenizer
from rise_nemo.core.prompts import GUIDANCE_TEMPLATES, build_ruscarl_prompt
from rise_nemo.core.rewards import rubric_reward
from rise_nemo.data.persistent_task import (
    AUDIENCES,
    MAX_RESPONSE_TOKENS,
    QUESTION_TEMPLATES,
    TOPICS,
    make_persistent_task,
)
from rise_nemo.interfaces import JudgeRequest
from rise_nemo.judges.rule import RuleJudge
from rise_nemo.tasks.persistent_warm_start import (
    WarmStartConfig,
    _cache_key,
    make_example,
    measure_rates,
    warm_start,
)

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 192}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _combo(p):
    return (p.meta["topic"], p.meta["template"], p.meta["audience"])


def test_task_structure_and_determinism():
    task = make_persistent_task(seed=3)
    again = make_persistent_task(seed=3)
    other = make_persistent_task(seed=4)
    assert task == again and task.fingerprint() == again.fingerprint()
    assert [p.rubric for p in task.train] != [p.rubric for p in other.train]
    assert task.fingerprint() != other.fingerprint()
    assert len(task.train) == 8 * len(TOPICS) and len(task.heldout) == 2 * len(TOPICS)
    assert len(task.warmup) == len(TOPICS) * (len(QUESTION_TEMPLATES) * len(AUDIENCES) - 2)
    assert {p.prompt_id for p in task.train} <= {p.prompt_id for p in task.warmup}
    # Held-out prompts are (topic, template, audience) combinations never used in warm start or training.
    assert not {_combo(p) for p in task.heldout} & {_combo(p) for p in task.warmup}
    assert {p.meta["topic"] for p in task.heldout} == set(range(len(TOPICS)))
    for p in task.train + task.heldout:
        crit = p.rubric.criteria
        assert all(c.check is not None for c in crit)
        pers, neg = task.persistent_criterion_ids[p.prompt_id], task.negative_criterion_ids[p.prompt_id]
        assert len(pers) == 2 and len(neg) == 1
        assert all(crit[k].weight > 0 and "persistent" in crit[k].tags for k in pers)
        assert crit[neg[0]].weight < 0 and crit[neg[0]].check.value == "guaranteed"
        assert sum("base" in c.tags for c in crit) == 4
        assert p.messages[-1]["role"] == "user"


def test_vocabulary_covers_prompts_hints_scaffolds_and_responses():
    tok = builtin_tokenizer("persistent_task")
    task = make_persistent_task(seed=0)
    rng = random.Random(0)
    cfg = WarmStartConfig()
    for p in task.warmup + task.heldout:
        for hinted in (False, True):
            ex = make_example(task, p, hinted, rng, cfg)
            assert tok.unk_token_id not in tok.apply_chat_template(ex.messages, tokenize=True)["input_ids"], ex.messages
            assert tok.unk_token_id not in tok.encode(ex.response), ex.response
        typical = make_example(task, p, True, random.Random(0), WarmStartConfig(unprompted_rate=0.0, hinted_negative_rate=1.0))
        assert len(tok.encode(typical.response)) + 1 <= MAX_RESPONSE_TOKENS  # hinted pair + "guaranteed"
        scaffold = build_ruscarl_prompt(p.messages, p.rubric.criteria, rng)
        assert tok.unk_token_id not in tok.apply_chat_template(scaffold, tokenize=True)["input_ids"]


def test_hinted_examples_use_the_privileged_prompt_and_meet_hinted_criteria():
    task = make_persistent_task(seed=0)
    rng = random.Random(1)
    judge = RuleJudge()
    cfg = WarmStartConfig(unprompted_rate=0.0, hinted_negative_rate=0.0, natural_negative_rate=0.0)
    prefixes = [t.split("{hint}")[0] for t in GUIDANCE_TEMPLATES]
    for p in task.train[:16]:
        ex = make_example(task, p, True, rng, cfg)
        original = p.messages[-1]["content"]
        hinted = ex.messages[-1]["content"]
        assert hinted.startswith(original + "\n\n")
        assert any(pre in hinted[len(original):] for pre in prefixes)
        verdicts = judge.judge([JudgeRequest(p.messages, ex.response, p.rubric, p.prompt_id)])[0]
        for k in task.persistent_criterion_ids[p.prompt_id]:
            assert verdicts[k] == (p.rubric.criteria[k].text in hinted)
        assert not any(verdicts[k] for k in task.negative_criterion_ids[p.prompt_id])
        # Natural examples (no unprompted behaviours) meet exactly the base criteria.
        plain = make_example(task, p, False, rng, cfg)
        v = judge.judge([JudgeRequest(p.messages, plain.response, p.rubric, p.prompt_id)])[0]
        assert [bool(x) for x in v] == ["base" in c.tags for c in p.rubric.criteria]
        r = float(rubric_reward(torch.tensor(v, dtype=torch.float32), p.rubric.weights))
        assert r == pytest.approx(5 / 11)  # base points 2+1+1+1 of 11 positive points


def test_warm_start_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match=r"warm_start\.stepz: unknown key"):
        WarmStartConfig.from_mapping({"stepz": 3})
    with pytest.raises(ValueError, match=r"warm_start\.unprompted_rate"):
        WarmStartConfig.from_mapping({"unprompted_rate": 1.5})


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """One default warm start of a tiny Qwen3 (400 steps, 30-70 s on one shared thread), cached in a temp dir."""
    cache = tmp_path_factory.mktemp("warm_cache")
    task = make_persistent_task(seed=0)
    cfg = {"tokenizer": "builtin:persistent_task", "tiny": TINY, "seed": 0, "lr": 1e-5}
    policy, generator = build(cfg)
    stats = warm_start(policy, generator, task, {}, cache_dir=cache, progress=False)
    return task, cfg, cache, policy, generator, stats


@pytest.mark.slow
def test_warm_start_rates(warm, capsys):
    task, _, _, _, generator, stats = warm
    # The brief's targets: persistent criteria met unprompted in a small but non-zero share (~0.5-5%),
    # hints followed strongly (> 90%); base criteria already met.
    assert 0.005 <= stats.unprompted_rate <= 0.05, stats
    assert stats.hinted_rate > 0.9, stats
    assert stats.base_rate > 0.9 and stats.finished_rate > 0.95, stats
    assert stats.hinted_negative_rate > stats.negative_rate, stats  # hints drag "guaranteed" in
    assert stats.n_unprompted == (len(task.train) + len(task.heldout)) * 8 * 2
    # Held-out prompts alone: hint following generalises to unseen combinations.
    held = measure_rates(generator, task, WarmStartConfig(eval_samples=4), prompts=task.heldout, progress=False)
    assert held["hinted_rate"] > 0.85 and held["base_rate"] > 0.85, held


@pytest.mark.slow
def test_warm_start_cache_is_reused(warm):
    task, cfg, cache, policy, _, stats = warm
    fresh, fresh_gen = build(cfg)
    calls = []
    real_train = fresh.train
    fresh.train = lambda *a, **k: calls.append(1) or real_train(*a, **k)  # spy on the real method
    again = warm_start(fresh, fresh_gen, task, {}, cache_dir=cache, progress=False)
    assert again.cached and not stats.cached and again.cache_path == stats.cache_path
    assert calls == [] and again.steps == stats.steps  # loaded, not retrained
    assert again.unprompted_rate == stats.unprompted_rate and again.hinted_rate == stats.hinted_rate
    for a, b in zip(policy.model.parameters(), fresh.model.parameters()):
        assert torch.equal(a, b)
    assert len(fresh.optimizer.state) == 0  # fresh optimiser for RL
    # A different task seed or warm-start config is a different cache entry.
    other = make_persistent_task(seed=1)
    assert _cache_key(other, fresh, WarmStartConfig()) != _cache_key(task, fresh, WarmStartConfig())
    assert _cache_key(task, fresh, WarmStartConfig(steps=10)) != _cache_key(task, fresh, WarmStartConfig())
    assert len([p for p in cache.iterdir() if p.name.startswith("warm_")]) == 1


def test_each_behaviour_meets_exactly_its_own_check():
    """Responses built with one pool behaviour meet that behaviour's criterion and no other one, on every
    topic (the checks are exact, so coverage numbers mean what the criterion text says)."""
    from rise_nemo.core.rubric import Criterion, Rubric
    from rise_nemo.data.persistent_task import PERSISTENT_POOL, response_text

    pool_rubric = Rubric(tuple(Criterion(b.criterion, 1.0, check=b.check) for b in PERSISTENT_POOL))
    judge = RuleJudge()
    task = make_persistent_task(seed=0)
    rng = random.Random(0)
    for p in task.heldout:
        for k, b in enumerate(PERSISTENT_POOL):
            text = response_text(p, [b.name], guaranteed=True, rng=rng)
            verdicts = judge.judge([JudgeRequest(p.messages, text, pool_rubric, p.prompt_id)])[0]
            assert verdicts == [j == k for j in range(len(PERSISTENT_POOL))], (b.name, text)


def test_warm_start_cache_key_survives_the_move_to_tasks():
    """The warm start moved from rise_nemo.data.persistent_task to rise_nemo.tasks.persistent_warm_start; its
    cache key (task, model fingerprint, config, TASK_VERSION) is unchanged, so existing caches stay valid.
    The expected value was computed with the code before the move."""
    from types import SimpleNamespace

    policy = SimpleNamespace(engine=SimpleNamespace(fingerprint=lambda: "model-fp"))
    assert _cache_key(make_persistent_task(seed=0), policy, WarmStartConfig()) == "807b3d1cf74da8c5"


def test_warm_start_weights_do_not_depend_on_the_callers_thread_count(tmp_path):
    """The cache key cannot tell who built a cache, so the SFT phase pins one thread (tasks.sft.sft_phase):
    the same short warm start under 1 and 2 caller threads gives bit-identical weights, and the caller's
    setting comes back afterwards."""
    task = make_persistent_task(seed=0)
    cfg = {"tokenizer": "builtin:persistent_task", "tiny": TINY, "seed": 0, "lr": 1e-5}
    weights = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            policy, generator = build(cfg)
            warm_start(policy, generator, task, {"steps": 20, "eval_samples": 1}, cache_dir=tmp_path / str(threads),
                       progress=False)
            assert torch.get_num_threads() == threads
            weights.append({k: v.clone() for k, v in policy.model.state_dict().items()})
    finally:
        torch.set_num_threads(1)
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
