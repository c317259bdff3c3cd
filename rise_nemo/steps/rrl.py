"""RRL (Retrospective Replay RL) as hooks of the reasoning step (docs/DESIGN.md §9; paper Algorithm 1).

``method: rrl`` is PPO (critic + GAE, rise_nemo.steps.reasoning) plus a per-problem buffer of
promising states (core.replay). In one step:

  start states   every rollout, with probability p (Algorithm 1 line 4, ``ctx.rng``), continues the
                 least-explored buffered state of its problem (its counter +1, line 13); otherwise, or when
                 the problem has no state, it starts from the problem (line 6). The state's tokens are
                 context only (token_mask 0: eq. 3) and GAE starts at the state, bootstrapped from V there.
  after scoring  a replayed rollout that is correct (the scorer's ``solved``: the verifier's 1, or with a
                 reward model, a score above the reference reply's) removes its state (line 14); a wrong one
                 counts a failure of its state, dropped after ``rrl.max_failed_replays`` (our rule). Once the
                 critic's value loss has stabilised (core.replay.ValueStabilisation), every normal rollout pushes
                 argmax_i V(s_i) of its own response (line 8; the values GAE already used, ``batch["values"]``)
                 and, if it is wrong, its problem's canonical solution pushes its argmax-V state (line 9):
                 ONE critic.get_values call per step for all such canonical solutions, nothing generated.
                 ``rrl.state_sources`` picks the sources: [policy, canonical] (RRL), [canonical] (RRL-CS),
                 [policy] (RRL-PGS). ``rrl.state_scorer`` scores the cut points: the critic's V (the
                 paper), the reference judge's prefix score (``reference``: one judge request per solution,
                 all its prefixes at once; beyond the paper) or a mix of both.
  after training the step's critic value loss feeds the stabilisation rule.

The buffer and the stabilisation state go into the trainer's checkpoint (``state_dict``), the replay coin
flips come from ``ctx.rng`` (checkpointed by the trainer), so a resumed run is exact.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.core.replay import (
    ReplayBuffer,
    ValueStabilisation,
    candidate_state,
    replay_probability,
    state_boundaries,
)
from rise_nemo.errors import UserError
from rise_nemo.interfaces import Rollout
from rise_nemo.methods.registry import REASONING
from rise_nemo.steps.reasoning import ReasoningContext, StepHooks, batch_rollouts
from rise_nemo.steps.rollouts import TrainSample, build_batch, encode_response, find_tokenizer, token_texts

SOURCE_POLICY, SOURCE_CANONICAL = "policy", "canonical"
log = logging.getLogger("rise_nemo.rrl")


def check_granularity(cfg: Any, problems: Sequence[Any]) -> None:
    """``rrl.granularity`` must be able to cut the training data: with ``line`` some reference solution has a
    line break inside it, with ``step`` some has ``rrl.step_marker`` after its start. Otherwise no state could
    ever be stored (a reference without cut points gives none, and the policy writes like the references): a
    one-line error naming the key instead of an RRL run that silently is PPO."""
    granularity, marker = str(cfg.rrl.granularity), str(cfg.rrl.step_marker)
    refs = [str(p.reference_solution or "").strip() for p in problems]
    if granularity == "token" or not refs:
        return
    cuts = (lambda t: "\n" in t) if granularity == "line" else (lambda t: marker in t[1:])
    n_cut = sum(cuts(t) for t in refs)
    what = "a line break" if granularity == "line" else f"the marker {marker!r} (rrl.step_marker)"
    other = "step (with rrl.step_marker)" if granularity == "line" else "line"
    if 2 * n_cut < len(refs) and n_cut:  # canonical states only for these; policy states as the policy writes
        log.warning("rrl.granularity %r: only %d of %d training reference solutions have %s, so only their "
                    "canonical solutions give states (consider rrl.granularity=%s or token)", granularity, n_cut,
                    len(refs), what, other)
    if n_cut:
        return
    raise UserError(f"config key 'rrl.granularity': {granularity!r} cuts states at {what}, but none of the "
                    f"{len(refs)} training reference solutions has one, so no state would ever be stored; use "
                    f"rrl.granularity={other} or token")


def reference_prefix_scores(judge: Any, problem: ReasoningProblem, segments: Sequence[str]) -> list[float]:
    """The reference judge's prefix score of each candidate state of one solution cut into ``segments`` at
    its cut points (state t keeps segments 1..t, t = 1..T-1), in [0, 1] (core.exprl.normalise_score, smooth):
    ONE judge request scored in the ``prefix`` view (segments 1..t together, ExpRL's prefix scores).
    Unknown (None) scores count 0."""
    from rise_nemo.core.exprl import normalise_score
    from rise_nemo.judges.reference import ScoreRequest

    (scores,) = judge.score([ScoreRequest(problem, " ".join(segments), tuple(segments))], view="prefix")
    if scores is None or len(scores) != len(segments):
        return [0.0] * (len(segments) - 1)
    return [normalise_score(s) for s in scores[:-1]]


@REASONING.hooks.implement("rrl")
class RRLHooks(StepHooks):
    check_data = staticmethod(check_granularity)  # before any model is built (loop.run)

    def __init__(self, cfg: Any, n_train_problems: int):
        r = cfg.rrl
        self.beta = float(r.beta)
        per_step = int(cfg.sampling.prompts_per_step)
        self.steps_per_epoch = int(r.steps_per_epoch) if r.steps_per_epoch is not None else max(
            1, math.ceil(n_train_problems / per_step))
        self.sources = tuple(str(s) for s in r.state_sources)
        self.granularity, self.marker = str(r.granularity), str(r.step_marker)
        self.buffer = ReplayBuffer(capacity=int(r.capacity), max_failures=None if r.max_failed_replays is None
                                   else int(r.max_failed_replays))
        self.scorer, self.reference_weight = str(r.state_scorer), float(r.reference_weight)
        self.judge = None
        if self.scorer != "value":  # ExpRL's reference judge from the ``judge:`` block (default: the rule judge)
            from rise_nemo.judges.reference import build_reference_judge

            judge_cfg = cfg.judge
            self.judge = build_reference_judge(judge_cfg if judge_cfg and judge_cfg.get("type") else {"type": "rule"})
        s = r.stabilise
        self.stabilisation = ValueStabilisation(window=int(s.window), tolerance=float(s.tolerance),
                                                max_steps=int(s.max_steps), ema=float(s.ema))
        self._replayed: dict[tuple[int, int], tuple[int, ...]] = {}  # this step's (i, j) -> state
        self._p = 0.0
        self._canonical_ids: dict[str, list[int]] = {}  # prompt_id -> tokenised reference (deterministic)

    # ---- Algorithm 1, lines 4-6 and 10-11, 13 -----------------------------------------------------------
    def start_states(self, ctx: ReasoningContext, problems: Sequence[ReasoningProblem],
                     step: int) -> list[list[list[int]]] | None:
        self._p = replay_probability(step, self.steps_per_epoch, self.beta)
        self._replayed = {}
        g = int(ctx.cfg.sampling.group_size)
        out: list[list[list[int]]] = []
        for i, problem in enumerate(problems):
            row: list[list[int]] = []
            for j in range(g):
                state = self.buffer.select(problem.prompt_id, ctx.rng) if ctx.rng.random() < self._p else None
                if state is not None:
                    self._replayed[i, j] = state
                row.append(list(state) if state is not None else [])
            out.append(row)
        return out if self._replayed else None

    # ---- lines 8-9 and 12-14 ------------------------------------------------------------------------
    def after_score(self, ctx: ReasoningContext, problems: Sequence[ReasoningProblem], groups: list[list[Rollout]],
                    solved: torch.Tensor, valid: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        before = dict(self.buffer.stats)
        tally = {True: [0, 0], False: [0, 0]}  # replayed? -> [correct, valid]
        canonical_needed: list[int] = []
        stable = self.stabilisation.stable
        for row, (i, j, rollout) in enumerate(batch_rollouts(batch, groups, valid)):  # row b = valid rollout b
            problem = problems[i]
            correct = bool(solved[i, j])  # the scorer's verdict (StepScores.solved_mask)
            replayed = (i, j) in self._replayed
            tally[replayed][0] += correct
            tally[replayed][1] += 1
            if replayed and correct:
                self.buffer.remove(problem.prompt_id, self._replayed[i, j])
            elif replayed:
                self.buffer.record_failure(problem.prompt_id, self._replayed[i, j])
            elif stable:
                if SOURCE_POLICY in self.sources:
                    self._push_best(ctx, problem, rollout.response_token_ids, batch["values"][row],
                                    int(batch["input_lengths"][row]) - len(rollout.response_token_ids),
                                    SOURCE_POLICY)
                if not correct and SOURCE_CANONICAL in self.sources and i not in canonical_needed:
                    canonical_needed.append(i)
        if canonical_needed:
            self._push_canonical(ctx, [(problems[i], groups[i][0].prompt_token_ids) for i in canonical_needed])
        n_rollouts = sum(len(grp) for grp in groups)
        return {
            "rrl/replay_p": self._p,
            "rrl/replay_fraction": len(self._replayed) / max(1, n_rollouts),
            "rrl/solve_rate_replayed": tally[True][0] / tally[True][1] if tally[True][1] else None,
            "rrl/solve_rate_scratch": tally[False][0] / tally[False][1] if tally[False][1] else None,
            "rrl/canonical_scored": len(canonical_needed),
            **{f"rrl/states_{k}": self.buffer.stats[k] - before[k] for k in ("added", "removed", "evicted", "dropped")},
            "rrl/buffer_size": len(self.buffer),
            "rrl/buffer_problems": len(self.buffer.states),
            **({} if self.judge is None else {"rrl/judge_calls": int(self.judge.calls)}),
        }

    def _push_best(self, ctx: ReasoningContext, problem: ReasoningProblem, response_ids: Sequence[int],
                   values_row: torch.Tensor, prompt_len: int, source: str) -> None:
        """buffer <- argmax score over the allowed cut points of one solution (values_row aligned with input_ids;
        the score is V, the reference judge's prefix score, or their mix: ``rrl.state_scorer``)."""
        ids = list(response_ids)
        n = self._text_length(ctx, ids)
        texts = self._token_texts(ctx, ids[:n]) if self.granularity != "token" or self.judge else [""] * n
        cuts = state_boundaries(texts, self.granularity, self.marker)
        scores = values_row[prompt_len : prompt_len + n].float()
        if self.judge is not None and cuts:
            tok = find_tokenizer(ctx.generator)
            bounds = [0, *cuts, n]
            segments = [tok.decode(ids[a:b], skip_special_tokens=True) for a, b in zip(bounds, bounds[1:])]
            ref = reference_prefix_scores(self.judge, problem, segments)
            w = 1.0 if self.scorer == "reference" else self.reference_weight
            scores = scores.clone()
            for k, r in zip(cuts, ref):
                scores[k] = w * r + (1 - w) * float(scores[k])
        k = candidate_state(scores, cuts)
        if k is not None:
            self.buffer.add(problem.prompt_id, ids[:k], source)

    def _push_canonical(self, ctx: ReasoningContext, items: list[tuple[ReasoningProblem, list[int]]]) -> None:
        """Line 9: the canonical solutions teacher-forced through the critic in one get_values call."""
        samples = []
        for problem, prompt_ids in items:
            if problem.prompt_id not in self._canonical_ids:
                self._canonical_ids[problem.prompt_id] = encode_response(ctx.generator, problem.reference_solution)
            samples.append(TrainSample(list(prompt_ids), self._canonical_ids[problem.prompt_id], 0, 0.0, [],
                                       sampled_under_train_prompt=False))
        batch = build_batch(samples, ctx.pad_id)
        values = ctx.critic.get_values(batch)  # [B, T], V(input_ids[:, :t])
        for row, ((problem, prompt_ids), sample) in enumerate(zip(items, samples)):
            self._push_best(ctx, problem, sample.response_ids, values[row], len(prompt_ids), SOURCE_CANONICAL)

    @staticmethod
    def _text_length(ctx: ReasoningContext, ids: list[int]) -> int:
        """Response length without trailing special tokens (EOS): cut points stop before the complete text."""
        tok = find_tokenizer(ctx.generator)
        special = set(getattr(tok, "all_special_ids", None) or ()) | {getattr(tok, "eos_token_id", None)}
        n = len(ids)
        while n and ids[n - 1] in special:
            n -= 1
        return n

    @staticmethod
    def _token_texts(ctx: ReasoningContext, ids: list[int]) -> list[str]:
        return token_texts(ctx.generator, ids)

    # ---- after the updates: the stabilisation rule ----------------------------------------------------
    def after_train(self, ctx: ReasoningContext, metrics: dict[str, Any]) -> dict[str, Any]:
        stab = self.stabilisation
        was = stab.stable
        stab.update(metrics.get("critic/value_loss"))
        if stab.stable and not was:
            log.info("rrl: value loss stabilised after %d critic updates (%s); state search starts", stab.since,
                     stab.reason)
        return {"rrl/stabilised": stab.stable, "rrl/value_loss_ema": stab.mean, "rrl/value_loss_change": stab.last_change,
                "rrl/stabilised_now": stab.stable and not was}

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict(), "stabilisation": self.stabilisation.state_dict()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            raise ValueError("rrl: the checkpoint holds no replay buffer (written by another method?)")
        self.buffer.load_state_dict(state["buffer"])
        self.stabilisation.load_state_dict(state["stabilisation"])
