"""RRL's retrospective replay (docs/DESIGN.md §9; paper: "Improving RL Exploration for LLM Reasoning through
Retrospective Replay", §2.2 and Algorithm 1). Pure Python + tensors: no model, no I/O.

- ``ReplayBuffer``: per problem, at most ``capacity`` promising states (response-token prefixes), each with
  a counter of how often it was replayed; the least-explored state is replayed first, the most-explored one
  is evicted when a new state needs room, a state is removed once a completion from it is correct
  (Algorithm 1, lines 8-9 and 11-14), and (our rule, the paper is silent; docs/DESIGN.md §9) once
  ``max_failures`` replays of it in a row were wrong: a state no completion solves is most likely already
  wrong (dead), and replaying it only trains negative advantage onto locally correct continuations.
- ``replay_probability``: p of Algorithm 1, line 4.
- ``state_boundaries`` / ``candidate_state``: buffer <- argmax_{s_i} V(s_i) (§2.2), over the allowed cut
  points of one solution (token / line / step granularity), never the empty or the complete solution.
- ``ValueStabilisation``: the explicit rule for "the loss of the value model has stabilised" (§2.2), after
  which states are searched.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from rise_nemo.core.exprl import segment_token_spans

__all__ = ["ReplayBuffer", "BufferedState", "replay_probability", "state_boundaries", "candidate_state",
           "ValueStabilisation", "GRANULARITIES"]

Granularity = Literal["token", "line", "step"]
GRANULARITIES: tuple[str, ...] = ("token", "line", "step")


@dataclass
class BufferedState:
    tokens: tuple[int, ...]  # response-token prefix the replayed rollout continues (context only, eq. 3)
    counter: int = 0  # times it was replayed (Algorithm 1, line 13)
    source: str = "policy"  # "policy" (a generated solution, line 8) or "canonical" (the reference, line 9)
    failures: int = 0  # replays of it whose completion was wrong (a correct one removes the state)


@dataclass
class ReplayBuffer:
    """Per-problem buffers of promising states (Algorithm 1's B), keyed by ``prompt_id``.

    Rules (RRL §2.2): capacity ``capacity`` per problem (paper: 5); ``select`` returns the state with the
    lowest counter (ties broken by the caller's seeded ``random.Random``) and increments its counter; ``add``
    of a state already buffered for that problem is a no-op; when the problem's buffer is full, the state
    with the HIGHEST counter is evicted (ties: the oldest) to make room; ``remove`` drops a state (a
    completion from it was correct); ``record_failure`` counts a wrong completion from a state and drops it
    (``dropped``) at ``max_failures`` (None = never; the paper's rule). Counters of added / removed /
    evicted / dropped states accumulate in ``stats``.
    """

    capacity: int  # rrl.capacity (rise_nemo.config.schema RrlCfg; paper: 5)
    max_failures: int | None = None  # rrl.max_failed_replays (our rule; None = the paper's: never dropped)
    states: dict[str, list[BufferedState]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=lambda: {"added": 0, "removed": 0, "evicted": 0, "duplicate": 0,
                                                           "dropped": 0})

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"ReplayBuffer: capacity must be >= 1, got {self.capacity}")
        if self.max_failures is not None and self.max_failures < 1:
            raise ValueError(f"ReplayBuffer: max_failures must be None or >= 1, got {self.max_failures}")

    def __len__(self) -> int:
        return sum(len(v) for v in self.states.values())

    def get(self, problem: str) -> list[BufferedState]:
        return list(self.states.get(problem, ()))

    def add(self, problem: str, tokens: Sequence[int], source: str = "policy") -> bool:
        """Buffer a state for ``problem``. False (and nothing changes) if it is there already."""
        key = tuple(int(t) for t in tokens)
        if not key:
            raise ValueError("ReplayBuffer.add: the empty prefix is not a state to replay (it is the problem)")
        buf = self.states.setdefault(problem, [])
        if any(s.tokens == key for s in buf):
            self.stats["duplicate"] += 1
            return False
        if len(buf) >= self.capacity:
            top = max(s.counter for s in buf)
            buf.pop(next(i for i, s in enumerate(buf) if s.counter == top))  # oldest among the most explored
            self.stats["evicted"] += 1
        buf.append(BufferedState(key, 0, source))
        self.stats["added"] += 1
        return True

    def select(self, problem: str, rng: random.Random) -> tuple[int, ...] | None:
        """The least-explored state of ``problem`` (counter incremented), or None when it has none."""
        buf = self.states.get(problem)
        if not buf:
            return None
        low = min(s.counter for s in buf)
        ties = [s for s in buf if s.counter == low]
        chosen = ties[rng.randrange(len(ties))] if len(ties) > 1 else ties[0]
        chosen.counter += 1
        return chosen.tokens

    def remove(self, problem: str, tokens: Sequence[int], reason: str = "removed") -> bool:
        """Drop a state (a completion from it was correct). False when it is no longer buffered."""
        key = tuple(int(t) for t in tokens)
        buf = self.states.get(problem, [])
        for i, s in enumerate(buf):
            if s.tokens == key:
                buf.pop(i)
                self.stats[reason] += 1
                if not buf:
                    del self.states[problem]
                return True
        return False

    def record_failure(self, problem: str, tokens: Sequence[int]) -> bool:
        """A completion from the state was wrong: its failure count +1; at ``max_failures`` the state is
        dropped (True). False when it is kept or no longer buffered (a state evicted or removed earlier in
        the same step)."""
        key = tuple(int(t) for t in tokens)
        state = next((s for s in self.states.get(problem, ()) if s.tokens == key), None)
        if state is None:
            return False
        state.failures += 1
        if self.max_failures is None or state.failures < self.max_failures:
            return False
        return self.remove(problem, key, reason="dropped")

    def state_dict(self) -> dict[str, Any]:
        """JSON-able: capacity, every problem's states in order (tokens, counter, source, failures), the
        counters. (The rule's ``max_failures`` is configuration, not state.)"""
        return {"capacity": self.capacity, "stats": dict(self.stats),
                "states": {p: [[list(s.tokens), s.counter, s.source, s.failures] for s in buf]
                           for p, buf in self.states.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Also reads checkpoints written before the failure count existed (3-item states, failures 0)."""
        self.capacity = int(state["capacity"])
        self.stats = {"dropped": 0, **{k: int(v) for k, v in state["stats"].items()}}
        self.states = {p: [BufferedState(tuple(int(t) for t in item[0]), int(item[1]), str(item[2]),
                                         int(item[3]) if len(item) > 3 else 0) for item in buf]
                       for p, buf in state["states"].items()}


def replay_probability(step: int, steps_per_epoch: int, beta: float) -> float:
    """Algorithm 1, line 4: p = beta * step / steps_per_epoch during the first epoch, beta afterwards.

    ``step`` counts from 1 (the trainer's step numbers), so the last step of epoch 1 already has p = beta."""
    if steps_per_epoch < 1:
        raise ValueError(f"replay_probability: steps_per_epoch must be >= 1, got {steps_per_epoch}")
    if step <= steps_per_epoch:
        return beta * step / steps_per_epoch
    return beta


def state_boundaries(token_texts: Sequence[str], granularity: str, marker: str = "step") -> list[int]:
    """Cut points k (the state keeps the first k response tokens) allowed as states, 0 < k < n.

    ``token_texts[i]``: the decode of response token i alone, for the solution's TEXT tokens (no trailing
    EOS), so k = n (the complete solution) and k = 0 (the problem itself) are never candidates.
      token  every k in 1..n-1
      line   k right after a token whose text ends a line (ends with a newline)
      step   k at the token that starts a step (holds the marker's first character, e.g. "step" in the
             embedded task's ``step a add 3 = 17``): the state ends before the next step
    """
    n = len(token_texts)
    if granularity == "token":
        return list(range(1, n))
    if granularity == "line":
        return [k for k in range(1, n) if token_texts[k - 1].endswith("\n")]
    if granularity == "step":  # the segments ExpRL-Process cuts at the same marker (core.exprl)
        return [a for a, _ in segment_token_spans(token_texts, marker) if 0 < a < n]
    raise ValueError(f"state_boundaries: granularity must be one of {list(GRANULARITIES)}, got {granularity!r}")


def candidate_state(values: torch.Tensor | Sequence[float], boundaries: Sequence[int]) -> int | None:
    """buffer <- argmax_{s_i} V(s_i) (RRL §2.2) over the allowed cut points.

    ``values[k]`` = V(q; y_1..y_k), the value of the state that keeps k response tokens (the critic's
    right-shifted value at response position k). Returns the best k (the first on ties), or None when no cut
    point is allowed."""
    vals = [float(v) for v in (values.tolist() if isinstance(values, torch.Tensor) else values)]
    best = None
    for k in boundaries:
        if not 0 < k < len(vals):
            raise ValueError(f"candidate_state: boundary {k} outside 1..{len(vals) - 1}")
        if best is None or vals[k] > vals[best]:
            best = k
    return best


@dataclass
class ValueStabilisation:
    """When "the loss of the value model has stabilised" (RRL §2.2), made explicit.

    Each ``update(loss)`` with the step's critic value loss L_s moves an EMA
        m_s = ema * m_{s-1} + (1 - ema) * L_s          (m_1 = L_1)
    and its relative change c_s = |m_s - m_{s-1}| / max(|m_{s-1}|, 1e-8). The loss is stable once c_s <=
    ``tolerance`` for ``window`` consecutive updates; the ``max_steps``-th update declares it stable whatever
    the curve does (a fallback: a sparse-reward value loss is noisy), and ``max_steps`` 0 means "stable from
    the start". Once stable it stays stable (the EMA and c_s keep moving, for the logs); ``reason`` says which
    rule fired and ``since`` at which update.
    """

    # The rule's parameters: rrl.stabilise (rise_nemo.config.schema RrlStabiliseCfg holds the defaults).
    window: int
    tolerance: float
    max_steps: int
    ema: float
    updates: int = 0
    mean: float | None = None
    calm: int = 0
    stable: bool = False
    reason: str | None = None
    since: int | None = None
    last_change: float | None = None

    def __post_init__(self) -> None:
        if self.max_steps == 0 and not self.stable:
            self.stable, self.reason, self.since = True, "max_steps=0", 0

    def update(self, loss: float | None) -> bool:
        """Feed one step's value loss (None: no critic update this step, nothing moves). Returns ``stable``."""
        if loss is None or not math.isfinite(float(loss)):
            return self.stable
        self.updates += 1
        loss = float(loss)
        if self.mean is None:
            self.mean = loss
            self.last_change = None
        else:
            new = self.ema * self.mean + (1 - self.ema) * loss
            self.last_change = abs(new - self.mean) / max(abs(self.mean), 1e-8)
            self.mean = new
            self.calm = self.calm + 1 if self.last_change <= self.tolerance else 0
        if not self.stable and self.calm >= self.window:
            self.stable, self.reason, self.since = True, f"relative change <= {self.tolerance} for {self.window} steps", self.updates
        elif not self.stable and self.updates >= self.max_steps:
            self.stable, self.reason, self.since = True, f"max_steps={self.max_steps}", self.updates
        return self.stable

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("updates", "mean", "calm", "stable", "reason", "since", "last_change")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
