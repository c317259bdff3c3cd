"""The persistent task's premise variant (``criteria="prompt"``): persistent criteria whose required
content depends on the prompt, so one hit does not carry to other prompts; today's task is the control."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from rise_nemo.backends.local.tokenizer import builtin_tokenizer
from rise_nemo.core.rubric import Rubric
from rise_nemo.data.persistent_task import (
    MAX_RESPONSE_TOKENS,
    PERSISTENT_POOL,
    make_persistent_task,
    persistent_criterion,
    response_text,
)
from rise_nemo.interfaces import JudgeRequest
from rise_nemo.judges.rule import RuleJudge
from rise_nemo.tasks.persistent_warm_start import WarmStartConfig, make_example, transfer_rate


def test_premise_task_is_deterministic_per_seed_and_keeps_the_control_draws():
    task, again, other = (make_persistent_task(seed=s, criteria="prompt") for s in (3, 3, 4))
    control = make_persistent_task(seed=3)
    assert task == again and task.fingerprint() == again.fingerprint()
    assert [p.rubric for p in task.train] != [p.rubric for p in other.train]
    # The same prompts and the same behaviours per prompt as the control; only the criteria differ.
    assert [p.messages for p in task.train + task.heldout] == [p.messages for p in control.train + control.heldout]
    assert [task.persistent_names(p) for p in task.train] == [control.persistent_names(p) for p in control.train]
    assert task.fingerprint() != control.fingerprint()
    # The control's spec (and so its cached warm starts) is unchanged by the new parameter.
    assert control.spec == {"seed": 3, "train_per_topic": 8, "heldout_per_topic": 2, "persistent_per_prompt": 2}


def test_premise_criteria_depend_on_the_prompt_and_one_hit_does_not_transfer():
    premise, control = make_persistent_task(seed=0, criteria="prompt"), make_persistent_task(seed=0)
    # Every behaviour's criterion differs between two prompts that share neither topic nor audience.
    from rise_nemo.data.persistent_task import AUDIENCES, TOPICS

    for b in PERSISTENT_POOL:
        a = persistent_criterion(b, TOPICS[0], AUDIENCES[0], "prompt")
        c = persistent_criterion(b, TOPICS[1], AUDIENCES[1], "prompt")
        assert a.check != c.check and a.text != c.text
        assert persistent_criterion(b, TOPICS[0], AUDIENCES[0]) == persistent_criterion(b, TOPICS[1], AUDIENCES[1])
    # A hit's text meets the same behaviour's criterion on every other prompt in the control, almost never
    # in the premise variant (only on prompts with the same topic and audience).
    assert transfer_rate(control) == 1.0
    assert 0.0 < transfer_rate(premise) < 0.05
    # ... while on its own prompt the hit meets exactly its own criterion.
    judge = RuleJudge()
    for p in premise.heldout:
        pool = Rubric(tuple(persistent_criterion(b, *_topic_audience(p), "prompt") for b in PERSISTENT_POOL))
        for k, b in enumerate(PERSISTENT_POOL):
            text = response_text(p, [b.name], guaranteed=True, rng=random.Random(k))
            verdicts = judge.judge([JudgeRequest(p.messages, text, pool, p.prompt_id)])[0]
            assert verdicts == [j == k for j in range(len(PERSISTENT_POOL))], (b.name, text)
            # The control's fixed-phrase check is not enough: the old phrase misses the premise criterion.
            old = response_text(control.heldout[premise.heldout.index(p)], [b.name], True, random.Random(k))
            assert not judge.judge([JudgeRequest(p.messages, old, pool, p.prompt_id)])[0][k], (b.name, old)


def _topic_audience(p):
    from rise_nemo.data.persistent_task import AUDIENCES, TOPICS

    return TOPICS[int(p.meta["topic"])], AUDIENCES[int(p.meta["audience"])]


def test_premise_vocabulary_and_lengths_fit_the_control_tokenizer():
    tok = builtin_tokenizer("persistent_task")
    task = make_persistent_task(seed=0, criteria="prompt")
    rng = random.Random(0)
    judge = RuleJudge()
    for p in task.warmup + task.heldout:
        ex = make_example(task, p, True, rng, WarmStartConfig())
        assert tok.unk_token_id not in tok.apply_chat_template(ex.messages, tokenize=True)["input_ids"], ex.messages
        assert tok.unk_token_id not in tok.encode(ex.response), ex.response
        full = make_example(task, p, True, random.Random(0),
                            WarmStartConfig(unprompted_rate=0.0, hinted_negative_rate=1.0))
        assert len(tok.encode(full.response)) + 1 <= MAX_RESPONSE_TOKENS
        # Hinted targets meet exactly the hinted persistent criteria (the warm start teaches real hits).
        v = judge.judge([JudgeRequest(p.messages, full.response, p.rubric, p.prompt_id)])[0]
        hinted = full.messages[-1]["content"]
        for k in task.persistent_criterion_ids[p.prompt_id]:
            assert v[k] == (p.rubric.criteria[k].text in hinted)


@pytest.mark.parametrize("rate", [0.0, 0.05, 0.2])
def test_unprompted_base_rate_parameter_is_honoured(rate):
    """Natural warm-start targets meet each persistent criterion of their prompt at the configured rate."""
    task = make_persistent_task(seed=0, criteria="prompt")
    cfg = WarmStartConfig(unprompted_rate=rate)
    rng, judge = random.Random(1), RuleJudge()
    met = total = 0
    for _ in range(6):
        for p in task.train:
            ex = make_example(task, p, False, rng, cfg)
            v = judge.judge([JudgeRequest(p.messages, ex.response, p.rubric, p.prompt_id)])[0]
            met += sum(v[k] for k in task.persistent_criterion_ids[p.prompt_id])
            total += len(task.persistent_criterion_ids[p.prompt_id])
    assert met / total == pytest.approx(rate, abs=0.03 if rate else 0.0)


def test_bad_criteria_mode_names_the_key():
    with pytest.raises(ValueError, match=r"data\.task\.criteria: expected one of \['fixed', 'prompt'\], got 'prompts'"):
        make_persistent_task(criteria="prompts")


def test_bench_conditions_map_task_and_base_rates_to_overrides():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from argparse import Namespace

    from bench.embedded_methods import conditions

    assert conditions(Namespace(task="control", base_rates=None)) == [("", [])]
    assert conditions(Namespace(task="premise", base_rates=[0.0075, 0.015])) == [
        ("0.0075", ["++data.task.criteria=prompt", "++data.warm_start.unprompted_rate=0.0075"]),
        ("0.015", ["++data.task.criteria=prompt", "++data.warm_start.unprompted_rate=0.015"])]
    assert conditions(Namespace(task="named", base_rates=None)) == [
        ("", ["++data.task.criteria=prompt", "++data.task.name_behaviours=true"])]
    with pytest.raises(SystemExit, match="--base-rates: expected probabilities in \\[0, 1\\], got 1.5"):
        conditions(Namespace(task="premise", base_rates=[1.5]))


# ---- the named variant (name_behaviours) and one persistent criterion per prompt ---------------------


def test_named_prompts_are_deterministic_and_name_exactly_their_behaviours():
    from rise_nemo.data.persistent_task import request_text

    task, again, other = (make_persistent_task(seed=s, criteria="prompt", name_behaviours=True) for s in (5, 5, 6))
    plain = make_persistent_task(seed=5, criteria="prompt")
    assert task == again and task.fingerprint() == again.fingerprint()
    assert [p.messages for p in task.train] != [p.messages for p in other.train]
    # Same prompts, behaviours and rubrics as the unnamed premise task; only the request is appended.
    assert [p.rubric for p in task.train + task.heldout] == [p.rubric for p in plain.train + plain.heldout]
    assert task.fingerprint() != plain.fingerprint() and plain.spec.get("name_behaviours") is None
    subjects = {b.name: b.subject for b in PERSISTENT_POOL}
    for p, q in zip(task.train + task.heldout, plain.train + plain.heldout):
        names = task.persistent_names(p)
        text = p.messages[0]["content"]
        assert text == f"{q.messages[0]['content']} {request_text(names)}"
        request = text.split("please cover ", 1)[1].rstrip(" .").split(" and ")
        assert request == [subjects[n] for n in names]  # the rubric's behaviours, in rubric order, no other
    assert request_text(["summary", "safety"]) == "please cover safety and a summary ."


def test_named_prompts_keep_the_control_vocabulary():
    """The request uses only words the control's tokenizer already has: the vocabulary (and so the
    model's embedding table and every cached control warm start) is unchanged."""
    from rise_nemo.backends.local.tokenizer import corpus_words
    from rise_nemo.data.persistent_task import AUDIENCES, TOPICS, vocabulary_corpus

    words = corpus_words(vocabulary_corpus())
    without = corpus_words(t for t in vocabulary_corpus() if not t.startswith("please cover "))
    assert words == without and len(words) == 296
    tok = builtin_tokenizer("persistent_task")
    for per in (1, 2, 3):
        task = make_persistent_task(seed=0, criteria="prompt", name_behaviours=True, persistent_per_prompt=per)
        for p in task.warmup[:40] + task.heldout:
            assert tok.unk_token_id not in tok.apply_chat_template(list(p.messages), tokenize=True)["input_ids"]
    assert len(TOPICS) * len(AUDIENCES) == 64


def test_one_criterion_per_prompt_has_ceiling_one_on_held_out_prompts():
    """persistent_per_prompt=1 with named prompts: each rubric has exactly one persistent criterion, the
    prompt names it, and the response writing just that behaviour meets it (coverage 1) within the
    sampling budget; without the name a held-out prompt does not say which of the six it needs."""
    task = make_persistent_task(seed=0, criteria="prompt", name_behaviours=True, persistent_per_prompt=1)
    tok, judge = builtin_tokenizer("persistent_task"), RuleJudge()
    names = set()
    for p in task.train + task.heldout:
        (k,) = task.persistent_criterion_ids[p.prompt_id]
        (name,) = task.persistent_names(p)
        names.add(name)
        assert PERSISTENT_POOL[[b.name for b in PERSISTENT_POOL].index(name)].subject in p.messages[0]["content"]
        text = response_text(p, [name], guaranteed=False, rng=random.Random(0))
        assert len(tok.encode(text)) + 1 <= MAX_RESPONSE_TOKENS
        assert judge.judge([JudgeRequest(p.messages, text, p.rubric, p.prompt_id)])[0][k]
    assert names == {b.name for b in PERSISTENT_POOL}  # all six are asked for somewhere


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name_behaviours": "yes"}, r"data\.task\.name_behaviours: expected true or false, got 'yes'"),
    ({"persistent_per_prompt": 0}, r"data\.task\.persistent_per_prompt: expected an integer in \[1, 6\], got 0"),
    ({"persistent_per_prompt": 7}, r"data\.task\.persistent_per_prompt: expected an integer in \[1, 6\], got 7"),
    ({"persistent_per_prompt": "1"}, r"data\.task\.persistent_per_prompt: expected an integer, got '1'"),
    ({"train_per_topic": 40}, r"data\.task\.train_per_topic \(40\) \+ data\.task\.heldout_per_topic \(2\)"),
])
def test_bad_task_values_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_persistent_task(criteria="prompt", **kwargs)


def test_unknown_task_key_is_a_one_line_user_error_naming_it():
    from rise_nemo.config import load_config
    from rise_nemo.errors import UserError
    from rise_nemo.loop.data import load_prompts_checked

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "recipes" / "rise_tiny_cpu.yaml", ["++data.task.name_behavior=true"])
    with pytest.raises(UserError, match=r"^data\.task\.name_behavior: unknown key for data\.source persistent; "
                                        r"known: \['seed', .*'name_behaviours', 'heldout_pool_per_topic', 'replicate'\]$"):
        load_prompts_checked(cfg)
    cfg = load_config(root / "recipes" / "rise_tiny_cpu.yaml", ["++data.task.name_behaviours=1"])
    with pytest.raises(UserError, match=r"^data\.task\.name_behaviours: expected true or false, got 1$"):
        load_prompts_checked(cfg)
    # The reasoning task's keys are its own generator's to check (ChainTaskConfig): they still pass through.
    from rise_nemo.loop.data import chain_task

    cfg = load_config(root / "recipes" / "rrl_chain_late_tiny_cpu.yaml", [])
    assert chain_task(cfg).train and cfg.data.task.late_from == 8


# ---- the null control: a policy that ignores hints -----------------------------------------------------


def test_null_control_warm_start_writes_unhinted_responses_to_hinted_prompts():
    task = make_persistent_task(seed=0, criteria="prompt", name_behaviours=True)
    judge = RuleJudge()
    for follow, expected in ((True, 1.0), (False, 0.0)):
        cfg = WarmStartConfig(unprompted_rate=0.0, hinted_negative_rate=0.0, natural_negative_rate=0.0,
                              hint_following=follow)
        rng, met, total = random.Random(2), 0, 0
        for p in task.train[:24]:
            ex = make_example(task, p, True, rng, cfg)
            assert ex.messages != list(p.messages) and ex.messages[-1]["content"].startswith(
                p.messages[-1]["content"])  # the privileged prompt either way
            v = judge.judge([JudgeRequest(p.messages, ex.response, p.rubric, p.prompt_id)])[0]
            hinted = [k for k in task.persistent_criterion_ids[p.prompt_id]
                      if p.rubric.criteria[k].text in ex.messages[-1]["content"]]
            met += sum(v[k] for k in hinted)
            total += len(hinted)
        assert total and met / total == expected
    with pytest.raises(ValueError, match="warm_start.hint_following: expected true or false"):
        WarmStartConfig.from_mapping({"hint_following": "no"})


def test_null_control_has_its_own_warm_start_cache_and_the_default_keeps_its_key():
    from types import SimpleNamespace

    from rise_nemo.tasks.persistent_warm_start import _cache_key

    policy = SimpleNamespace(engine=SimpleNamespace(fingerprint=lambda: "model-fp"))
    task = make_persistent_task(seed=0)
    assert _cache_key(task, policy, WarmStartConfig(hint_following=True)) == "807b3d1cf74da8c5"
    assert _cache_key(task, policy, WarmStartConfig(hint_following=False)) != "807b3d1cf74da8c5"


# ---- replicates: a seed's own prompts from pools that share one warm start ---------------------------


def test_replicates_draw_their_own_prompts_from_pools_and_share_the_warm_start():
    kw = {"seed": 0, "criteria": "prompt", "name_behaviours": True, "heldout_pool_per_topic": 6}
    reps = [make_persistent_task(replicate=r, **kw) for r in range(4)]
    assert make_persistent_task(replicate=2, **kw) == reps[2]
    assert len({r.fingerprint() for r in reps}) == 1  # one warm start for every replicate of the pool
    assert all(r.warmup == reps[0].warmup for r in reps)
    warm_ids = {p.prompt_id for p in reps[0].warmup}
    pool_ids = set()
    for r in reps:
        assert len(r.train) == 64 and len(r.heldout) == 16
        assert not {p.prompt_id for p in r.heldout} & warm_ids  # held out of the warm start
        assert {p.prompt_id for p in r.train} <= warm_ids
        pool_ids |= {p.prompt_id for p in r.heldout}
    assert len({tuple(p.prompt_id for p in r.heldout) for r in reps}) == 4 and len(pool_ids) <= 48
    # without a replicate, today's task (the pins of the tests above) is unchanged
    assert make_persistent_task(seed=3) == make_persistent_task(seed=3, heldout_pool_per_topic=None)
    with pytest.raises(ValueError, match="data.task.replicate: needs data.task.heldout_pool_per_topic"):
        make_persistent_task(replicate=1)
    with pytest.raises(ValueError, match=r"data.task.heldout_pool_per_topic \(1\): expected heldout_per_topic"):
        make_persistent_task(heldout_pool_per_topic=1)
