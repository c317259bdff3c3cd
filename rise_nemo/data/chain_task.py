"""Chained modular arithmetic: the embedded verifiable reasoning task (docs/DESIGN.md §7).

A problem of difficulty L is a start value and L operations ``add k`` / ``sub k`` (k in 1..operand_max,
default 5), all modulo a prime M (default 61, so a guessed final answer is right ~1.6% of the time)::

    prompt     mod 61 start 17 a add 3 b sub 5 c add 4
    reference  step a add 3 = 20 step b sub 5 = 15 step c add 4 = 19 answer 19

Operations carry letter labels a, b, c, ... so that a step can find its operation in the prompt by the
label (an induction-head lookup a 2-layer model learns quickly); without labels, repeated operations make
"the i-th operation" a counting problem the tiny model fails at. Every step is marked by ``step`` and
states its label, operation and intermediate result, so a response is
checkable step by step (``step_accuracy``) and RRL can cut the clean reference into canonical states at
step boundaries (``step_prefixes``). The answer is checked by ``RuleArithmeticVerifier`` (last
``answer N`` of the response).

A late-only skill (RRL's premise task, docs/DESIGN.md §9; ``late_from``): steps ``late_from``..L of a chain
draw their operands from ``late_operand_min..late_operand_max`` (a range the earlier steps never use), so only
long chains contain them, and only at their end: a from-scratch rollout reaches them with a correct prefix
rarely, which is the situation RRL's replay of late states addresses. ``late_from`` null (the default) is
today's task, unchanged for every seed (same instances, same fingerprints).

The warm start that trains the tiny model on this task is ``rise_nemo.tasks.reasoning``.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

from rise_nemo.core.problem import ReasoningProblem

TASK_VERSION = 2
MAX_MODULUS = 128  # the built-in vocabulary holds the numbers 0..127
LABELS = "abcdefghijkl"  # operation labels; at most 12 steps
STEP, ANSWER = "step", "answer"
OPS = {"add": 1, "sub": -1}  # the operations problems are drawn from (their order fixes the draws)
# The hidden operation (``hidden_op``; ExpRL's premise task): its word appears in prompts, its meaning
# (subtract the operand) appears nowhere but in the reference's results, and the warm start writes it wrong.
HIDDEN_OP = "zap"
SIGNS = {**OPS, HIDDEN_OP: -1}  # what every operation does to the running value
_ANSWER_RE = re.compile(r"\banswer\s+(-?\d+)")
_STEP_RE = re.compile(r"\bstep\s+[a-l]\s+(add|sub|zap)\s+(\d+)\s*=\s*(-?\d+)")
_PROBLEM_RE = re.compile(r"^mod (\d+) start (\d+)((?: [a-l] (?:add|sub|zap) \d+)+)$")


REFERENCE_STYLES = ("full", "sketch")


class ReasoningTaskError(ValueError):
    """Invalid ``data.task`` / ``data.warm_start`` key for the reasoning task; the message names the key."""


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


@dataclass(frozen=True)
class ChainTaskConfig:
    """``data.task`` keys of the reasoning task (unknown keys raise)."""

    seed: int = 0
    modulus: int = 61  # prime >= 61: a guessed answer is right ~1/modulus of the time
    max_steps: int = 10  # difficulty levels 1..max_steps
    operand_max: int = 5  # operands 1..operand_max
    train_per_level: int = 64  # RL training problems per level
    heldout_per_level: int = 16  # held-out evaluation problems per level (never in the warm start)
    train_levels: tuple[int, ...] | None = None  # levels of the RL training set; None = all
    # The problems' reference solutions (ExpRL's premise): ``full`` writes every step (the
    # control: imitable token by token); ``sketch`` only every second step and the last one
    # (``Chain.sketch_text``): checkable by the reference judge, not imitable step by step.
    reference: str = "full"
    late_from: int | None = None  # late-only skill: steps late_from.. use the late operand range; None = off
    late_operand_min: int = 6  # the late steps' operands (only with late_from)
    late_operand_max: int = 12
    # ExpRL's premise task: one step of every problem (a uniformly drawn position) is ``zap k``, an operation
    # whose meaning the prompt never states (HIDDEN_OP, SIGNS); only the reference's results carry it. Needs
    # the tokenizer builtin:reasoning_task_zap (the word is not in today's vocabulary). False = today's task.
    hidden_op: bool = False

    @classmethod
    def from_mapping(cls, cfg: Mapping | None) -> ChainTaskConfig:
        raw = dict(cfg or {})
        known = {f.name for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise ReasoningTaskError(f"data.task.{key}: unknown key for the reasoning task; known keys: "
                                         f"{sorted(known)}")
        if raw.get("train_levels") is not None:
            raw["train_levels"] = tuple(int(x) for x in raw["train_levels"])
        out = cls(**raw)
        if not _is_prime(out.modulus) or not 61 <= out.modulus <= MAX_MODULUS:
            raise ReasoningTaskError(f"data.task.modulus: expected a prime in [61, {MAX_MODULUS}], got {out.modulus}")
        if not 1 <= out.max_steps <= len(LABELS):
            raise ReasoningTaskError(f"data.task.max_steps: expected 1..{len(LABELS)}, got {out.max_steps!r}")
        for key in ("operand_max", "train_per_level", "heldout_per_level"):
            if int(getattr(out, key)) < 1:
                raise ReasoningTaskError(f"data.task.{key}: expected an integer >= 1, got {getattr(out, key)!r}")
        if not isinstance(out.hidden_op, bool):
            raise ReasoningTaskError(f"data.task.hidden_op: expected true or false, got {out.hidden_op!r}")
        if out.reference not in REFERENCE_STYLES:
            raise ReasoningTaskError(f"data.task.reference: expected one of {list(REFERENCE_STYLES)}, "
                                     f"got {out.reference!r}")
        if out.operand_max >= out.modulus:
            raise ReasoningTaskError(f"data.task.operand_max: must be < modulus {out.modulus}")
        if out.late_from is not None:
            if not 2 <= int(out.late_from) <= out.max_steps:
                raise ReasoningTaskError(f"data.task.late_from: expected null or 2..max_steps ({out.max_steps}), got "
                                         f"{out.late_from!r}")
            if not out.operand_max < out.late_operand_min <= out.late_operand_max < out.modulus:
                raise ReasoningTaskError(
                    f"data.task.late_operand_min/late_operand_max: need operand_max ({out.operand_max}) < "
                    f"late_operand_min <= late_operand_max < modulus ({out.modulus}), got "
                    f"{out.late_operand_min}..{out.late_operand_max}")
        for level in out.train_levels or ():
            if not 1 <= level <= out.max_steps:
                raise ReasoningTaskError(f"data.task.train_levels: level {level} outside 1..{out.max_steps}")
        return out

    @property
    def late(self) -> tuple[int, int, int] | None:
        """(late_from, late_operand_min, late_operand_max) of the late-only skill, None for today's task."""
        if self.late_from is None:
            return None
        return int(self.late_from), int(self.late_operand_min), int(self.late_operand_max)


@dataclass(frozen=True)
class Chain:
    """One instance: start value and operations [(sign, k)]."""

    modulus: int
    start: int
    ops: tuple[tuple[str, int], ...]

    @property
    def key(self) -> tuple:
        return (self.modulus, self.start, self.ops)

    def values(self) -> list[int]:
        """The clean intermediate results, one per step."""
        out, v = [], self.start
        for op, k in self.ops:
            v = (v + SIGNS[op] * k) % self.modulus
            out.append(v)
        return out

    def prompt_text(self) -> str:
        return f"mod {self.modulus} start {self.start} " + " ".join(
            f"{LABELS[i]} {op} {k}" for i, (op, k) in enumerate(self.ops))

    def solution_text(self, written: Sequence[int] | None = None) -> str:
        """The step-by-step solution; ``written`` overrides the intermediate results (noisy SFT targets)."""
        vals = self.values() if written is None else list(written)
        steps = " ".join(f"{STEP} {LABELS[i]} {op} {k} = {v}" for i, ((op, k), v) in enumerate(zip(self.ops, vals)))
        return f"{steps} {ANSWER} {vals[-1]}"

    def sketch_text(self) -> str:
        """A sketch of the solution: only every second step (b, d, f, ...) and the last one, each with its
        operation and the running result after it, then the answer. The skipped steps' operations are
        folded into the next written result, so it cannot be imitated step by step, but every written
        result is checkable (``reference_score`` matches by label)::

            mod 61 start 17 a add 3 b sub 5 c add 4   ->   step b sub 5 = 15 step c add 4 = 19 answer 19
        """
        vals = self.values()
        keep = [i for i in range(len(self.ops)) if i % 2 == 1 or i == len(self.ops) - 1]
        steps = " ".join(f"{STEP} {LABELS[i]} {self.ops[i][0]} {self.ops[i][1]} = {vals[i]}" for i in keep)
        return f"{steps} {ANSWER} {vals[-1]}"

    def problem(self, prompt_id: str, reference: str = "full") -> ReasoningProblem:
        return ReasoningProblem(
            prompt_id=prompt_id,
            messages=({"role": "user", "content": self.prompt_text()},),
            reference_solution=self.sketch_text() if reference == "sketch" else self.solution_text(),
            answer=str(self.values()[-1]),
            difficulty=len(self.ops),
        )


def random_chain(rng: random.Random, modulus: int, steps: int, operand_max: int,
                 late: tuple[int, int, int] | None = None, hidden_op: bool = False) -> Chain:
    """``late`` = (late_from, low, high): steps late_from.. (1-based) draw operands from low..high.
    ``hidden_op``: then one uniformly drawn step becomes HIDDEN_OP with its drawn operand (one extra draw,
    after the others, so the rest of the instance is what today's task draws)."""
    ops = tuple((rng.choice(tuple(OPS)), rng.randint(*_operand_range(i, operand_max, late))) for i in range(steps))
    start = rng.randrange(modulus)
    if hidden_op:
        where = rng.randrange(steps)
        ops = tuple((HIDDEN_OP, k) if i == where else (op, k) for i, (op, k) in enumerate(ops))
    return Chain(modulus, start, ops)


def _operand_range(index: int, operand_max: int, late: tuple[int, int, int] | None) -> tuple[int, int]:
    if late is not None and index + 1 >= late[0]:
        return late[1], late[2]
    return 1, operand_max


def parse_chain(text: str) -> Chain:
    """The Chain a prompt text describes (inverse of ``Chain.prompt_text``)."""
    m = _PROBLEM_RE.match(text.strip())
    if not m:
        raise ValueError(f"not a chained-arithmetic problem: {text!r}")
    toks = m.group(3).split()
    if toks[0::3] != list(LABELS[: len(toks) // 3]):
        raise ValueError(f"operation labels out of order in {text!r}")
    return Chain(int(m.group(1)), int(m.group(2)), tuple((toks[i + 1], int(toks[i + 2])) for i in range(0, len(toks), 3)))


def problem_chain(problem: ReasoningProblem) -> Chain:
    return parse_chain(problem.messages[-1]["content"])


@dataclass
class ChainTask:
    cfg: ChainTaskConfig
    train: list[ReasoningProblem]
    heldout: list[ReasoningProblem]
    heldout_keys: frozenset

    @property
    def late(self) -> tuple[int, int, int] | None:
        return self.cfg.late

    def _late_spec(self) -> dict:
        # only a task WITH the late skill names it, so today's task keeps its fingerprints (and cached warm starts)
        return {} if self.late is None else {"late": list(self.late)}

    def fingerprint(self) -> str:
        cfg = asdict(self.cfg)
        if cfg["reference"] == "full":
            del cfg["reference"]  # the control's fingerprint stays as it was before the key existed
        for key in ("late_from", "late_operand_min", "late_operand_max"):
            cfg.pop(key)
        if not cfg["hidden_op"]:
            del cfg["hidden_op"]  # today's task keeps its fingerprint
        spec = {"cfg": cfg, "version": TASK_VERSION, **self._late_spec()}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    def warm_start_fingerprint(self, late_from_mix: Sequence[int] | None = None) -> str:
        """What the warm start depends on: the instance distribution and the held-out set (not the RL
        training levels), so recipes that differ only in their RL training set share one cached warm start.
        ``late_from_mix``: a warm start that draws each instance's first late step from these positions
        (``data.warm_start.late_from_mix``), shared by the tasks whose ``late_from`` is one of them."""
        c = self.cfg
        spec = {"seed": c.seed, "modulus": c.modulus, "max_steps": c.max_steps, "operand_max": c.operand_max,
                "heldout_per_level": c.heldout_per_level, "version": TASK_VERSION, **self._late_spec()}
        if late_from_mix is not None and self.late is not None:
            spec["late"] = [sorted(int(x) for x in late_from_mix), self.late[1], self.late[2]]
        if c.hidden_op:
            spec["hidden_op"] = HIDDEN_OP
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    def without_late(self) -> ChainTask:
        """The same task without its late-only skill (today's task of the same seed and sizes)."""
        return self.with_late_from(None)

    def with_late_from(self, late_from: int | None) -> ChainTask:
        """The same task with its late skill from step ``late_from`` (None: without it)."""
        from dataclasses import replace

        return make_chain_task(**{**asdict(replace(self.cfg, late_from=late_from)),
                                  "train_levels": self.cfg.train_levels})

    def sample_sft_chain(self, rng: random.Random, steps: int, late_from: int | None = None,
                         exclude: frozenset | None = None) -> Chain:
        """A fresh instance of ``steps`` steps that is not held out (not in ``exclude``, default the task's
        held-out instances); ``late_from`` moves the late skill's first step (a task with one)."""
        late = self.late if late_from is None or self.late is None else (int(late_from), *self.late[1:])
        held = self.heldout_keys if exclude is None else exclude
        while True:
            chain = random_chain(rng, self.cfg.modulus, steps, self.cfg.operand_max, late, self.cfg.hidden_op)
            if chain.key not in held:
                return chain


def make_chain_task(**kwargs) -> ChainTask:
    """Training and held-out problems for every level, generated from ``seed`` (disjoint instances)."""
    cfg = ChainTaskConfig.from_mapping(kwargs)
    rng = random.Random(f"chain-task-{cfg.seed}")
    late = cfg.late
    heldout, seen = [], set()
    for level in range(1, cfg.max_steps + 1):
        for i in range(cfg.heldout_per_level):
            chain = random_chain(rng, cfg.modulus, level, cfg.operand_max, late, cfg.hidden_op)
            seen.add(chain.key)
            heldout.append(chain.problem(f"chain-heldout-L{level:02d}-{i:03d}", cfg.reference))
    train = []
    for level in cfg.train_levels or range(1, cfg.max_steps + 1):
        i = 0
        while i < cfg.train_per_level:
            chain = random_chain(rng, cfg.modulus, level, cfg.operand_max, late, cfg.hidden_op)
            if chain.key in seen:
                continue
            train.append(chain.problem(f"chain-train-L{level:02d}-{i:03d}", cfg.reference))
            i += 1
    return ChainTask(cfg, train, heldout, frozenset(seen))


# ---- independent replications --------------------------------------------------------------------
#
# A method comparison over seeds replicates the whole experiment only when every seed has its own problems
# (bench/embedded_rrl.py, bench/embedded_exprl.py). The warm start is expensive and depends on the task's
# ``seed``, so seeds keep one warm start and draw their own training and held-out problems from their own
# streams. The warm start never trains on the task's held-out instances, but it draws ~8,000 fresh instances
# per level, so a fresh held-out problem is unseen only with high probability: ``fresh_problems`` draws
# held-out problems only at levels with at least MIN_HELDOUT_SPACE distinct instances (level >= 8 of today's
# task: 61 x 10^8), where the expected number of a seed's held-out problems the warm start met is below 1e-3.

MIN_HELDOUT_SPACE = 10**9


def instance_space(cfg: ChainTaskConfig, level: int) -> int:
    """The number of distinct instances with ``level`` steps: start values x (operations x operands) per step
    (x the hidden step's position, whose operation is then fixed, with ``hidden_op``)."""
    n = cfg.modulus * (level if cfg.hidden_op else 1)
    for i in range(level):
        low, high = _operand_range(i, cfg.operand_max, cfg.late)
        n *= len(OPS) * (high - low + 1)
    return n // (len(OPS) if cfg.hidden_op else 1)


def fresh_problems(task: ChainTask, stream: str, level: int, count: int, heldout: bool = False,
                   exclude: frozenset | set = frozenset()) -> list[ReasoningProblem]:
    """``count`` distinct problems of ``level`` steps from the stream named ``stream`` (the same name gives the
    same problems), none of them one of the task's own held-out or training instances or in ``exclude`` (keys,
    ``Chain.key``). ``heldout=True`` (evaluation problems) refuses levels with fewer than MIN_HELDOUT_SPACE
    instances, where the warm start may have met them. Prompt ids ``<stream>-L<level>-<i>``."""
    if not 1 <= level <= task.cfg.max_steps:
        raise ReasoningTaskError(f"fresh problems: level {level} outside 1..{task.cfg.max_steps}")
    space = instance_space(task.cfg, level)
    if heldout and space < MIN_HELDOUT_SPACE:
        raise ReasoningTaskError(f"fresh held-out problems: level {level} has only {space} distinct instances "
                                 f"(< {MIN_HELDOUT_SPACE}); the warm start may have trained on them")
    if count > space // 2:
        raise ReasoningTaskError(f"fresh problems: {count} of level {level} asked, only {space} instances exist")
    rng = random.Random(f"chain-fresh-{task.cfg.seed}-{stream}-{level}")
    taken = set(task.heldout_keys) | {problem_chain(p).key for p in task.train} | set(exclude)
    out: list[ReasoningProblem] = []
    while len(out) < count:
        chain = random_chain(rng, task.cfg.modulus, level, task.cfg.operand_max, task.late, task.cfg.hidden_op)
        if chain.key in taken:
            continue
        taken.add(chain.key)
        out.append(chain.problem(f"{stream}-L{level:02d}-{len(out):03d}", task.cfg.reference))
    return out


def vocabulary_corpus(hidden_op: bool = False) -> list[str]:
    """Every word the task's prompts and responses use: the built-in ``reasoning_task`` tokenizer, and with
    ``hidden_op`` the ``reasoning_task_zap`` one (the same words and HIDDEN_OP)."""
    ops = "mod start add sub step answer =" + (f" {HIDDEN_OP}" if hidden_op else "")
    return [ops, " ".join(LABELS), " ".join(str(n) for n in range(MAX_MODULUS))]


# ---- checking ------------------------------------------------------------------------------------


def final_answer(response: str) -> str | None:
    found = _ANSWER_RE.findall(response)
    return found[-1] if found else None


class RuleArithmeticVerifier:
    """interfaces.Verifier for the chained-arithmetic task: the response's last ``answer N`` equals the
    problem's answer. Always decidable (a response without an answer is wrong, never unknown)."""

    def verify(self, problems: Sequence[ReasoningProblem], responses: Sequence[str]) -> list[bool | None]:
        if len(problems) != len(responses):
            raise ValueError(f"verify: {len(problems)} problems but {len(responses)} responses")
        return [final_answer(r) == p.answer for p, r in zip(problems, responses)]


def step_accuracy(problem: ReasoningProblem, response: str) -> tuple[int, int]:
    """(locally correct steps, steps written): step i is correct when it names the problem's i-th
    operation and applies it correctly to the value the response itself wrote before it (so one error
    is counted once, not in every later step)."""
    chain = problem_chain(problem)
    prev, correct, total = chain.start, 0, 0
    for i, (op, k, v) in enumerate(_STEP_RE.findall(response)):
        total += 1
        value = int(v)
        if i < len(chain.ops) and (op, int(k)) == chain.ops[i] and value == (prev + SIGNS[op] * int(k)) % chain.modulus:
            correct += 1
        prev = value
    return correct, total


def leading_correct_steps(problem: ReasoningProblem, response: str) -> int:
    """How many of the response's first steps equal the clean reference's (label, operation and result):
    the response has reached step m + 1 with a correct prefix when this is >= m (RRL's reach rate)."""
    ref, got = _written_steps(problem.reference_solution), _written_steps(response)
    return next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))


def exact_solution(problem: ReasoningProblem, response: str) -> bool:
    """Whether the response is the clean solution: exactly the problem's L steps, each with the right label,
    operation, operand and intermediate result, and the right answer. Stricter than the verifier (answer
    only): a wrong path whose errors cancel mod M reaches the right answer but is not an exact solution."""
    clean = _written_steps(problem_chain(problem).solution_text())
    return _written_steps(response) == clean and final_answer(response) == problem.answer


class ExactSolutionVerifier:
    """interfaces.Verifier that accepts exact solutions only (``exact_solution``); always decidable."""

    def verify(self, problems: Sequence[ReasoningProblem], responses: Sequence[str]) -> list[bool | None]:
        if len(problems) != len(responses):
            raise ValueError(f"verify: {len(problems)} problems but {len(responses)} responses")
        return [exact_solution(p, r) for p, r in zip(problems, responses)]


def reach_profile(problems: Sequence[ReasoningProblem], groups: Sequence[Sequence[str]], late_from: int) -> dict:
    """Where from-scratch responses (``groups[i]`` answer ``problems[i]``) lose the clean path: the REACH RATE
    (the share whose first ``late_from`` - 1 steps equal the reference's: they arrive at step ``late_from``
    with a correct prefix; RRL's premise, docs/DESIGN.md §11.3) and, per position i, the step accuracy given a
    correct prefix (responses with i - 1 right steps whose i-th step is right too; None where none got there)."""
    leading = [leading_correct_steps(p, text) for p, texts in zip(problems, groups) for text in texts]
    if not leading:
        raise ValueError("reach_profile: no responses")
    longest = max((len(problem_chain(p).ops) for p in problems), default=0)
    tried = [sum(m >= i for m in leading) for i in range(longest)]
    accuracy = [sum(m > i for m in leading) / n if n else None for i, n in zip(range(longest), tried)]
    return {"responses": len(leading), "reach_rate": sum(m >= late_from - 1 for m in leading) / len(leading),
            "step_accuracy": accuracy}


def step_prefixes(problem: ReasoningProblem) -> list[str]:
    """The clean reference cut after each of its first 0..L-1 steps (RRL's canonical states), as text."""
    chain = problem_chain(problem)
    vals = chain.values()
    parts = [f"{STEP} {LABELS[i]} {op} {k} = {v}" for i, ((op, k), v) in enumerate(zip(chain.ops, vals))]
    return [" ".join(parts[:i]) for i in range(len(parts))]


# ---- the embedded reference judge (ExpRL, docs/DESIGN.md §8) ------------------------------------
#
# Mapping onto ExpRL's 1-5 scale, from the reference's checkable intermediate results only (the judge reads
# the reference text, never the Chain): with the reference's L steps r_1..r_L (label, operation, result),
#   outcome / prefix   5  when the attempt writes exactly the L reference steps and the reference's answer;
#                      else 1 + ceil(3 m / L), m = positions i <= L whose written step equals r_i (so 1..4:
#                      1 = no reference result reached, 2 = at least one, 4 = every step right but the answer
#                      missing or wrong). Ceil, not floor: one correct result is already "a relevant idea".
#   one segment alone  the segment's items (its steps, found by their labels, and an ``answer``) compared
#                      with the reference's: 1 + round(4 c / items) for c correct items; 1 with no item.

_LABELLED_STEP_RE = re.compile(r"\bstep\s+([a-l])\s+(add|sub|zap)\s+(\d+)\s*=\s*(-?\d+)")


def _written_steps(text: str) -> list[tuple[str, str, int, int]]:
    return [(lab, op, int(k), int(v)) for lab, op, k, v in _LABELLED_STEP_RE.findall(text)]


def _is_sketch(ref: Sequence[tuple[str, str, int, int]]) -> bool:
    """A reference that does not write the steps a, b, c, ... in order (``Chain.sketch_text``)."""
    return [step[0] for step in ref] != list(LABELS[: len(ref)])


def reference_score(reference: str, response: str) -> int:
    """The embedded judge's 1-5 score of a whole attempt (or a prefix of one) against the reference (above).
    A sketch reference (only some steps written) is matched by label: m counts the sketch's steps the
    attempt writes equally under the same label, and 5 needs all of them, exactly as many steps as the
    problem has (the sketch's last label) and the sketch's answer."""
    ref, got = _written_steps(reference), _written_steps(response)
    if not ref:
        raise ValueError(f"reference has no checkable step: {reference!r}")
    if _is_sketch(ref):
        first = {}
        for step in got:
            first.setdefault(step[0], step)
        matched = sum(1 for step in ref if first.get(step[0]) == step)
        n_steps = LABELS.index(ref[-1][0]) + 1
    else:
        matched = sum(1 for i, step in enumerate(got[: len(ref)]) if step == ref[i])
        n_steps = len(ref)
    if matched == len(ref) and len(got) == n_steps and final_answer(response) == final_answer(reference):
        return 5
    return 1 + -(-3 * matched // len(ref))  # 1 + ceil(3 m / L)


def reference_segment_scores(reference: str, segments: Sequence[str], view: str = "segment") -> list[int]:
    """One 1-5 score per segment: ``prefix`` scores segments 1..k together (``reference_score``),
    ``segment`` scores each segment alone by its labelled steps and answer (above)."""
    if view == "prefix":
        return [reference_score(reference, " ".join(segments[: k + 1])) for k in range(len(segments))]
    if view != "segment":
        raise ValueError(f"segment view must be 'segment' or 'prefix', got {view!r}")
    written = _written_steps(reference)
    ref = {step[0]: step for step in written}
    sketch = _is_sketch(written)  # a sketch cannot check the steps it skips: they are no items
    ref_answer = final_answer(reference)
    out = []
    for seg in segments:
        items = [step == ref.get(step[0]) for step in _written_steps(seg) if not sketch or step[0] in ref]
        answers = _ANSWER_RE.findall(seg)
        if answers:
            items.append(answers[-1] == ref_answer)
        out.append(1 + round(4 * sum(items) / len(items)) if items else 1)
    return out


# ---- the same judge without the reference (ExpRL's reference-free dense arm) ---------------------
#
# What a rule judge can check from the PROMPT alone, on the scale of ``reference_score`` /
# ``reference_segment_scores``: a written step at position i (found by its label) must name the prompt's
# i-th operation and operand; before any hidden step its result must be the clean value (computable from the
# prompt), after a hidden step only the step's consistency with the result written before it can be checked
# (the running value depends on the hidden operation's meaning), and a hidden step itself cannot be checked.
# On a task without a hidden operation this is exactly the reference judge with a full reference
# (tests/task/test_chain_hidden_op.py); with one, the only thing it lacks is what the reference carries.


def _prompt_items(chain: Chain, steps: Sequence[tuple[str, str, int, int]]) -> list[bool | None]:
    """Per written step (in order): True / False when the prompt can check it, None for a hidden step."""
    clean = chain.values()
    first_hidden = next((i for i, (op, _) in enumerate(chain.ops) if op == HIDDEN_OP), len(chain.ops))
    out: list[bool | None] = []
    prev: int | None = None
    for lab, op, k, v in steps:
        pos = LABELS.index(lab)
        if pos >= len(chain.ops) or (op, k) != chain.ops[pos]:
            out.append(False)
        elif op == HIDDEN_OP:
            out.append(None)
        elif pos < first_hidden:
            out.append(v == clean[pos])
        else:
            out.append(prev is not None and v == (prev + SIGNS[op] * k) % chain.modulus)
        prev = v
    return out


def prompt_score(problem: ReasoningProblem, response: str) -> int:
    """``reference_score`` from the prompt alone (above): m = the written steps at positions 1..L that the prompt
    verifies; 5 needs every step and the answer verified, which a problem with a hidden step never allows (its
    answer depends on the hidden meaning), so there the scale tops out at 4."""
    chain = problem_chain(problem)
    got = _written_steps(response)
    items = _prompt_items(chain, got[: len(chain.ops)])
    matched = sum(1 for x in items if x)
    checkable = sum(1 for op, _ in chain.ops if op != HIDDEN_OP)
    hidden = checkable < len(chain.ops)
    if (not hidden and matched == len(chain.ops) and len(got) == len(chain.ops)
            and final_answer(response) == problem.answer):
        return 5
    return 1 + -(-3 * matched // max(1, checkable))


def prompt_segment_scores(problem: ReasoningProblem, segments: Sequence[str], view: str = "segment") -> list[int]:
    """``reference_segment_scores`` from the prompt alone: ``prefix`` scores segments 1..k together
    (``prompt_score``); ``segment`` scores each segment's checkable items (its steps, and its answer: the
    problem's answer without a hidden step, else the result the rollout wrote last) as 1 + round(4 c / items),
    1 without any item, and a segment whose only steps are hidden ones gets the previous segment's score (3 for
    the first): the judge abstains there, so its process advantage s_t - s_(t-1) is 0."""
    if view == "prefix":
        return [prompt_score(problem, " ".join(segments[: k + 1])) for k in range(len(segments))]
    if view != "segment":
        raise ValueError(f"segment view must be 'segment' or 'prefix', got {view!r}")
    chain = problem_chain(problem)
    hidden = any(op == HIDDEN_OP for op, _ in chain.ops)
    per_segment = [_written_steps(seg) for seg in segments]
    flat = _prompt_items(chain, [step for steps in per_segment for step in steps])
    out: list[int] = []
    pos, last = 0, None
    for seg, steps in zip(segments, per_segment):
        checks = flat[pos: pos + len(steps)]
        pos += len(steps)
        items = [x for x in checks if x is not None]
        if steps:
            last = steps[-1][3]
        answers = _ANSWER_RE.findall(seg)
        if answers:
            items.append(answers[-1] == problem.answer if not hidden else last is not None and int(answers[-1]) == last)
        if items:
            out.append(1 + round(4 * sum(items) / len(items)))
        elif steps:  # hidden steps only: abstain
            out.append(out[-1] if out else 3)
        else:
            out.append(1)
    return out
