"""RRL's replay rules (core.replay; docs/DESIGN.md §9, the paper's §2.2 and Algorithm 1)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rise_nemo.core.metrics import perplexity_variance
from rise_nemo.core.replay import (
    ReplayBuffer,
    ValueStabilisation,
    candidate_state,
    replay_probability,
    state_boundaries,
)


def test_capacity_and_eviction_of_the_most_explored_state():
    buf = ReplayBuffer(capacity=3)
    rng = random.Random(0)
    for s in ([1], [2], [3]):
        assert buf.add("q", s)
    assert len(buf) == 3
    # replay [1] twice and [2] once: counters 2, 1, 0 (least explored first, so the order is forced)
    picks = [buf.select("q", rng) for _ in range(3)]
    assert sorted(picks) == [(1,), (2,), (3,)]  # three picks, each state once (counters all 1)
    assert buf.select("q", rng) is not None  # one state now has counter 2
    top = next(s.tokens for s in buf.get("q") if s.counter == 2)
    assert buf.add("q", [4])  # full: the highest counter goes
    assert [s.tokens for s in buf.get("q")] == [t for t in [(1,), (2,), (3,)] if t != top] + [(4,)]
    assert buf.stats == {"added": 4, "removed": 0, "evicted": 1, "duplicate": 0, "dropped": 0}
    assert len(buf.get("q")) == 3 and buf.get("other") == []


def test_eviction_ties_go_to_the_oldest_and_duplicates_are_not_added():
    buf = ReplayBuffer(capacity=2)
    buf.add("q", [5, 6])
    buf.add("q", [7])
    assert not buf.add("q", (5, 6))  # identical state: no duplicate, nothing evicted
    buf.add("q", [8])  # counters all 0: the oldest ([5, 6]) goes
    assert [s.tokens for s in buf.get("q")] == [(7,), (8,)]
    assert buf.stats["duplicate"] == 1 and buf.stats["evicted"] == 1
    with pytest.raises(ValueError, match="empty prefix"):
        buf.add("q", [])
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0)


def test_least_explored_first_and_deterministic_under_a_seed():
    def run(seed):
        buf = ReplayBuffer(capacity=5)
        for s in range(5):
            buf.add("q", [s])
        rng = random.Random(seed)
        return [buf.select("q", rng) for _ in range(15)], buf

    picks, buf = run(7)
    assert picks == run(7)[0]
    for r in range(3):  # every round of 5 picks visits each state once: least explored first
        assert sorted(picks[5 * r : 5 * r + 5]) == [(s,) for s in range(5)]
    assert all(s.counter == 3 for s in buf.get("q"))
    assert any(run(seed)[0] != picks for seed in range(8, 12))  # ties are broken by the rng, not by position
    assert ReplayBuffer(capacity=5).select("nothing", random.Random(0)) is None


def test_removal_on_success_and_state_dict_round_trip():
    buf = ReplayBuffer(capacity=5)
    buf.add("a", [1, 2], "policy")
    buf.add("a", [3], "canonical")
    buf.add("b", [4])
    buf.select("a", random.Random(0))
    state = json.loads(json.dumps(buf.state_dict()))  # JSON-able
    other = ReplayBuffer(capacity=5)
    other.load_state_dict(state)
    assert other.state_dict() == buf.state_dict()
    assert other.remove("a", [1, 2]) and not other.remove("a", [1, 2])
    assert other.remove("b", (4,)) and other.get("b") == [] and "b" not in other.states
    assert other.stats["removed"] == 2 and len(other) == 1 and other.get("a")[0].source == "canonical"


def test_replay_probability_schedule():
    # Algorithm 1 line 4: beta * step / steps_per_epoch during epoch 1, then beta
    assert replay_probability(1, 10, 0.4) == pytest.approx(0.04)
    assert replay_probability(5, 10, 0.4) == pytest.approx(0.2)
    assert replay_probability(10, 10, 0.4) == pytest.approx(0.4)
    assert replay_probability(11, 10, 0.4) == 0.4 and replay_probability(500, 10, 0.4) == 0.4
    assert replay_probability(3, 10, 0.0) == 0.0
    with pytest.raises(ValueError, match="steps_per_epoch"):
        replay_probability(1, 0, 0.4)


def test_state_selection_on_a_hand_built_value_curve():
    # values[k] = V(q; y_1..y_k); the empty (k = 0) and the complete (k = n) solution are never candidates
    values = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.95])  # n = 7 text tokens, V at k = 0..6
    texts = ["step", "a", "=", "3\n", "step", "b\n", "answer"]
    assert state_boundaries(texts, "token") == [1, 2, 3, 4, 5, 6]
    assert candidate_state(values, state_boundaries(texts, "token")) == 6  # the best inner cut
    assert state_boundaries(texts, "line") == [4, 6]
    assert candidate_state(values, [4, 6]) == 6
    assert state_boundaries(texts, "step") == [4]  # before the second step; step 1 starts at k = 0
    assert candidate_state(values, [4]) == 4
    assert candidate_state([0.0, 0.3, 0.3, 0.1], [1, 2]) == 1  # ties: the first
    assert candidate_state(values, []) is None
    with pytest.raises(ValueError, match="boundary 7"):
        candidate_state(values, [7])
    with pytest.raises(ValueError, match="granularity"):
        state_boundaries(texts, "paragraph")
    # a marker split over tokens opens its step at the token holding its first character
    assert state_boundaries(["x", " st", "ep", "y"], "step") == [1]


def test_value_stabilisation_rule_and_fallback():
    stab = ValueStabilisation(window=2, tolerance=0.05, max_steps=50, ema=0.5)
    assert not stab.update(1.0)  # first value: nothing to compare
    assert not stab.update(0.5) and stab.last_change == pytest.approx(0.25)  # ema 0.75: moved 25 %
    assert not stab.update(0.74)  # ema 0.745: 0.7 % -> calm 1
    assert stab.update(0.75) and stab.since == 4 and "relative change" in stab.reason
    assert stab.update(100.0) and stab.since == 4  # once stable, stays stable; the EMA still moves (logs)
    assert stab.mean == pytest.approx(50.37375) and stab.last_change > 1
    noisy = ValueStabilisation(window=3, tolerance=0.01, max_steps=4, ema=0.0)
    assert [noisy.update(v) for v in (1.0, 3.0, 1.0, 3.0)] == [False, False, False, True]
    assert noisy.reason == "max_steps=4"
    assert ValueStabilisation(window=3, tolerance=0.1, max_steps=0, ema=0.7).stable
    skip = ValueStabilisation(window=1, tolerance=0.0, max_steps=2, ema=0.7)
    assert not skip.update(None) and skip.updates == 0  # a step without a critic update does not count
    copy = ValueStabilisation(window=2, tolerance=0.05, max_steps=50, ema=0.5)
    copy.load_state_dict(json.loads(json.dumps(stab.state_dict())))
    assert copy.state_dict() == stab.state_dict()


def test_perplexity_variance_per_query():
    lp = torch.log(torch.tensor([[1.0, 0.5, 0.5], [1.0, 0.25, 0.25], [1.0, 0.5, 0.5], [1.0, 0.1, 0.1]]))
    mask = torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 1], [0, 0, 0]])
    # query 0: perplexities 2 and 4 -> variance 1; query 1: one row with tokens (the other has none) -> left out
    assert perplexity_variance(lp, mask, [0, 0, 1, 1]) == pytest.approx(1.0)
    assert perplexity_variance(lp, mask, [0, 1, 2, 3]) is None


def test_a_state_whose_replays_keep_failing_is_dropped():
    buf = ReplayBuffer(capacity=5, max_failures=3)
    buf.add("a", [1], "policy")
    buf.add("a", [2], "canonical")
    assert not buf.record_failure("a", [1]) and not buf.record_failure("a", [1])
    assert buf.get("a")[0].failures == 2 and buf.get("a")[1].failures == 0
    assert buf.record_failure("a", [1])  # the third wrong completion in a row drops it
    assert [s.tokens for s in buf.get("a")] == [(2,)] and buf.stats["dropped"] == 1 and buf.stats["removed"] == 0
    assert not buf.record_failure("a", [1])  # no longer buffered: nothing happens
    never = ReplayBuffer(capacity=5)  # max_failures None: the paper's buffer, a state is never dropped
    never.add("a", [1])
    assert not any(never.record_failure("a", [1]) for _ in range(50)) and len(never) == 1
    with pytest.raises(ValueError, match="max_failures"):
        ReplayBuffer(capacity=5, max_failures=0)


def test_failure_counts_survive_a_checkpoint_and_old_checkpoints_load():
    buf = ReplayBuffer(capacity=5, max_failures=2)
    buf.add("a", [1])
    buf.record_failure("a", [1])
    other = ReplayBuffer(capacity=5, max_failures=2)
    other.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert other.get("a")[0].failures == 1 and other.record_failure("a", [1])  # one more failure drops it
    old = {"capacity": 5, "stats": {"added": 1, "removed": 0, "evicted": 0, "duplicate": 0},
           "states": {"a": [[[1, 2], 3, "policy"]]}}  # written before the failure count existed
    other.load_state_dict(old)
    assert other.get("a")[0].failures == 0 and other.get("a")[0].counter == 3 and other.stats["dropped"] == 0
