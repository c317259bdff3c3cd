"""The embedded reasoning task's warm start (the task itself: rise_nemo.data.chain_task; docs/DESIGN.md §7).

Warm start (``warm_start_reasoning``): supervised fine-tuning of the tiny model on freshly generated
instances of EVERY length 1..max_steps (a prototype showed lengths absent from the warm start break down:
hold out instances, not lengths), in two phases (``ReasoningWarmStartConfig``): first on CLEAN references
(the model learns the arithmetic), then on references with a fraction ``noise`` of the intermediate
results replaced by a wrong value (the right one + ``noise_offset``; later steps continue from the written
value). The noisy phase sets a flat per-step accuracy p, so success on an L-step problem is about p**L:
failure comes from length, the situation RRL's paper describes. (A fixed offset rather than a uniform wrong
value: the tiny model turns uniform noise into +-1 slips that cancel along a chain; docs/DESIGN.md §7.5.)
Held-out instances are never used for the warm start. The problems keep their CLEAN references (RRL's
canonical states, ExpRL's judge); only the SFT targets are noisy.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from rise_nemo.cache import cache_lock
from rise_nemo.data.chain_task import HIDDEN_OP, SIGNS, Chain, ChainTask, ReasoningTaskError


@dataclass
class ReasoningWarmStartConfig:
    """``data.warm_start`` keys of the reasoning task (unknown keys raise). Two phases (docs/DESIGN.md §7.5):

    clean  ``steps`` SFT steps on CLEAN references, lr ``lr`` decaying linearly to 10%: the model learns the
           arithmetic (on noisy targets from the start the tiny model barely learns it);
    noisy  then ``noise_steps`` steps (0 = none) with a fresh optimiser at ``noise_lr`` (decaying linearly to
           10%) on references whose intermediate results are wrong with probability ``noise``: this sets the
           per-step accuracy p, so success on L steps is about p**L.

    The clean phase is cached on its own (it depends on neither noisy-phase key), so warm starts that differ
    only in the noisy phase share it; each phase draws its instances from its own seeded stream.
    """

    steps: int = 800
    batch_size: int = 32
    lr: float = 6e-3  # peak of the clean phase; decays linearly to 10%
    noise_steps: int = 0
    noise_lr: float = 1e-3  # peak of the noisy phase; decays linearly to 10%
    noise: float = 0.25  # probability that a noisy-phase target's intermediate result is replaced by a wrong value
    noise_offset: int | None = None  # the wrong value: None = uniform over the other residues, d = right value + d
    seed: int = 0
    # the late-only skill's steps (data.task.late_from; docs/DESIGN.md §9) in the noisy phase: their own error
    # rate and wrong-value mode (null = noise / noise_offset), so the late skill is a separate thing to learn
    late_noise: float | None = None
    late_noise_offset: int | None = None
    # true: the clean phase trains on the task WITHOUT its late skill (the same seed, modulus, lengths and
    # operands, so it shares today's task's cached clean phase), and the late skill is first met in the noisy
    # phase, with its own noise: a less practised skill, and one cached clean phase for both tasks
    clean_without_late: bool = False
    # a task with a hidden operation (data.task.hidden_op): the probability that a target (both phases) writes a
    # hidden step's true result; otherwise it writes the misreading (the operand added, as if it were ``add``),
    # so the warm start knows the format and a wrong meaning, and finds the right one at about this rate
    hidden_op_true_rate: float | None = None
    # a task with a late skill: the noisy phase draws each instance's first late step from these positions (not
    # only the task's late_from), so one warm start serves the tasks whose late_from is any of them (the RRL
    # miniature varies the reach rate this way: the same weights, the late skill met later or earlier)
    late_from_mix: list[int] | None = None

    @classmethod
    def from_mapping(cls, cfg: Mapping | None) -> ReasoningWarmStartConfig:
        raw = dict(cfg or {})
        known = {f.name for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise ReasoningTaskError(f"data.warm_start.{key}: unknown key for the reasoning task; known keys: "
                                         f"{sorted(known)}")
        out = cls(**raw)
        for key in ("noise", "late_noise", "hidden_op_true_rate"):
            value = getattr(out, key)
            if value is not None and not 0.0 <= value < 1.0:
                raise ReasoningTaskError(f"data.warm_start.{key}: expected a probability in [0, 1), got {value!r}")
        for key in ("lr", "noise_lr"):
            if not float(getattr(out, key)) > 0.0:
                raise ReasoningTaskError(f"data.warm_start.{key}: expected a learning rate > 0, got {getattr(out, key)!r}")
        for key, low in (("steps", 0), ("noise_steps", 0), ("batch_size", 1)):
            if int(getattr(out, key)) < low:
                raise ReasoningTaskError(f"data.warm_start.{key}: expected an integer >= {low}, got {getattr(out, key)!r}")
        for key in ("noise_offset", "late_noise_offset"):
            if getattr(out, key) is not None and int(getattr(out, key)) < 1:
                raise ReasoningTaskError(f"data.warm_start.{key}: expected null or an integer >= 1, got "
                                         f"{getattr(out, key)!r}")
        if out.late_from_mix is not None:
            mix = out.late_from_mix
            if (not isinstance(mix, (list, tuple)) or not mix
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 2 for x in mix)):
                raise ReasoningTaskError(f"data.warm_start.late_from_mix: expected null or a list of step numbers >= 2, "
                                         f"got {mix!r}")
            out.late_from_mix = sorted(set(int(x) for x in mix))
        if out.steps + out.noise_steps < 1:
            raise ReasoningTaskError("data.warm_start.steps: steps + noise_steps must be >= 1")
        return out

    def clean_spec(self) -> dict:
        """What the clean phase depends on (its cache key)."""
        spec = {"steps": self.steps, "batch_size": self.batch_size, "lr": self.lr, "seed": self.seed}
        if self.hidden_op_true_rate is not None:
            spec["hidden_op_true_rate"] = self.hidden_op_true_rate
        return spec

    def cache_spec(self) -> dict:
        """What the whole warm start depends on (its cache key); the late keys only when set, so warm starts
        of today's task keep their cache entries."""
        spec = asdict(self)
        for key in ("late_noise", "late_noise_offset", "hidden_op_true_rate", "late_from_mix"):
            if spec[key] is None:
                del spec[key]
        if not spec["clean_without_late"]:
            del spec["clean_without_late"]
        return spec

    def late_noise_spec(self, late_from: int | None) -> tuple[int, float, int | None] | None:
        """(late_from, noise, offset) of the late steps for ``noisy_solution``; None when nothing differs."""
        if late_from is None or (self.late_noise is None and self.late_noise_offset is None):
            return None
        return (int(late_from), self.noise if self.late_noise is None else float(self.late_noise),
                self.noise_offset if self.late_noise_offset is None else int(self.late_noise_offset))

    def error_offsets(self, late_from: int | None) -> list[int]:
        """The distinct fixed wrong-value offsets the noisy phase injects (early, and late when the task has a
        late skill); empty when the noise is uniform (``noise_offset`` null)."""
        offsets = [] if self.noise_offset is None or not self.noise_steps else [int(self.noise_offset)]
        late = self.late_noise_spec(late_from)
        if late is not None and late[2] is not None and late[1] > 0 and int(late[2]) not in offsets:
            offsets.append(int(late[2]))
        return offsets

    def phases(self) -> list[tuple[str, int, float, float]]:
        """[(name, steps, peak lr, noise)] of the phases that have steps."""
        out = [("clean", self.steps, self.lr, 0.0), ("noisy", self.noise_steps, self.noise_lr, self.noise)]
        return [p for p in out if p[1] > 0]


def error_combinations(offsets: Sequence[int], max_errors: int = 10):
    """Every combination of 1..``max_errors`` injected errors: tuples of counts, one per offset."""
    def counts(left: int, n: int):
        if n == 0:
            yield ()
            return
        for c in range(left + 1):
            for rest in counts(left - c, n - 1):
                yield (c, *rest)
    return [c for c in counts(max_errors, len(offsets)) if sum(c) > 0]


def error_shift_distance(offsets: Sequence[int], modulus: int, max_errors: int = 10) -> tuple[int, list]:
    """How close the warm start's injected error modes come to cancelling (docs/DESIGN.md §7.5): over every
    combination of 1..``max_errors`` errors (``error_combinations``; each error adds its offset to the running
    value, so k_1 errors of offset d_1 and k_2 of d_2 shift the answer by k_1 d_1 + k_2 d_2 mod M), the smallest
    distance of the total shift from 0 mod ``modulus``, and the combinations at that distance. Distance 0: some
    wrong path reaches the right answer; distance >= 2: not even with one +-1 slip more."""
    best, where = modulus, []
    for combo in error_combinations(offsets, max_errors):
        shift = sum(c * d for c, d in zip(combo, offsets)) % modulus
        dist = min(shift, modulus - shift)
        if dist < best:
            best, where = dist, [combo]
        elif dist == best:
            where.append(combo)
    return best, where


def noisy_solution(chain: Chain, noise: float, rng: random.Random, offset: int | None = None,
                   late: tuple[int, float, int | None] | None = None, hidden_true_rate: float = 0.0) -> str:
    """The solution with each intermediate result replaced by a wrong value with probability ``noise``;
    later steps continue from the value written, so every other step stays locally correct. The wrong
    value is uniform over the other residues (``offset`` None) or the right one + ``offset`` (mod M).
    ``late`` = (late_from, noise, offset) overrides both for steps late_from.. (1-based). A hidden step
    (HIDDEN_OP) gets no such noise: its result is the true one with probability ``hidden_true_rate``, else the
    misreading (the operand added)."""
    written, v = [], chain.start
    for i, (op, k) in enumerate(chain.ops):
        if op == HIDDEN_OP:
            sign = SIGNS[op] if rng.random() < hidden_true_rate else SIGNS["add"]
            v = (v + sign * k) % chain.modulus
            written.append(v)
            continue
        p, d = (late[1], late[2]) if late is not None and i + 1 >= late[0] else (noise, offset)
        v = (v + SIGNS[op] * k) % chain.modulus
        if rng.random() < p:
            v = (v + (rng.randrange(1, chain.modulus) if d is None else d)) % chain.modulus
        written.append(v)
    return chain.solution_text(written)


def warm_start_reasoning(policy, generator, task: ChainTask, cfg: Mapping | ReasoningWarmStartConfig | None = None,
                         cache_dir: str | Path | None = None, progress: bool = True) -> dict:
    """SFT the local policy: clean references, then noisy ones (``ReasoningWarmStartConfig``), every length;
    or load it from the cache (the whole warm start, or its clean phase alone).

    Returns {"steps", "noise_steps", "clean_loss", "final_loss", "train_seconds", "cached", "clean_cached",
    "cache_path"}. Leaves a fresh optimiser at ``local.lr``. Needs the local backend's extras
    (``policy.engine``, ``generator.encode_response``).
    """
    wcfg = cfg if isinstance(cfg, ReasoningWarmStartConfig) else ReasoningWarmStartConfig.from_mapping(cfg)
    if task.cfg.hidden_op and wcfg.hidden_op_true_rate is None:
        raise ReasoningTaskError("data.warm_start.hidden_op_true_rate: required for a task with a hidden operation "
                                 "(data.task.hidden_op: true)")
    for key in ("noise_offset", "late_noise_offset"):
        offset = getattr(wcfg, key)
        if offset is not None and offset % task.cfg.modulus == 0:
            raise ReasoningTaskError(f"data.warm_start.{key}: {offset} is a multiple of the modulus "
                                     f"{task.cfg.modulus}, so the 'wrong' value would be the right one")
    mix = wcfg.late_from_mix
    if mix is not None and (task.late is None or task.cfg.late_from not in mix or max(mix) > task.cfg.max_steps):
        raise ReasoningTaskError(f"data.warm_start.late_from_mix: {mix} must hold the task's data.task.late_from "
                                 f"({task.cfg.late_from}) and positions up to max_steps ({task.cfg.max_steps})")
    base = {"task": task.warm_start_fingerprint(mix), "model": policy.engine.fingerprint()}
    root = Path(cache_dir) if cache_dir is not None else None
    cache = root / f"reasoning_{_digest({**base, 'warm_start': wcfg.cache_spec()})}" if root is not None else None
    with cache_lock(cache):  # two commands started together build the entry once
        return _warm_start_reasoning(policy, generator, task, wcfg, base, root, cache, progress)


def _warm_start_reasoning(policy, generator, task: ChainTask, wcfg: ReasoningWarmStartConfig, base: dict,
                          root: Path | None, cache: Path | None, progress: bool) -> dict:
    from rise_nemo.tasks.sft import load_weights, save_weights

    if cache is not None and (cache / "stats.json").exists():
        load_weights(policy, cache)
        return {**json.loads((cache / "stats.json").read_text()), "cached": True, "cache_path": str(cache)}

    stats = {"steps": wcfg.steps, "noise_steps": wcfg.noise_steps, "clean_loss": float("nan"),
             "final_loss": float("nan"), "train_seconds": 0.0, "cached": False, "clean_cached": False}
    for name, steps, lr, noise in wcfg.phases():
        phase_task = task
        if name == "clean" and wcfg.clean_without_late and task.late is not None:
            phase_task = task.without_late()
        # the clean phase has its own cache entry, shared by warm starts that differ only in the noisy phase
        phase_base = {**base, "task": phase_task.warm_start_fingerprint()}
        phase_cache = (root / f"reasoning_clean_{_digest({**phase_base, 'clean': wcfg.clean_spec()})}"
                       if root is not None and name == "clean" else None)
        with cache_lock(phase_cache):  # shared by other warm starts: locked on its own, inside the outer lock
            if phase_cache is not None and (phase_cache / "stats.json").exists():
                load_weights(policy, phase_cache)
                phase = json.loads((phase_cache / "stats.json").read_text())
                stats["clean_cached"] = True
            else:
                rng = random.Random(f"chain-warm-{wcfg.seed}" + ("" if name == "clean" else f"-{name}"))
                phase = _sft_phase(policy, generator, phase_task, rng, name, steps, wcfg.batch_size, lr, noise,
                                   wcfg.noise_offset, progress, wcfg.late_noise_spec(task.cfg.late_from) if noise else None,
                                   wcfg.hidden_op_true_rate or 0.0, wcfg.late_from_mix)
                if phase_cache is not None:
                    save_weights(policy, phase_cache, {**phase, "cache_path": ""})
        stats["train_seconds"] += phase["train_seconds"]
        stats["final_loss"] = phase["final_loss"]
        if name == "clean":
            stats["clean_loss"] = phase["final_loss"]
    policy.reset_optimizer()
    policy.train_steps = 0
    stats["cache_path"] = ""
    if cache is not None:
        save_weights(policy, cache, stats)
        stats["cache_path"] = str(cache)
    return stats


def _sft_phase(policy, generator, task: ChainTask, rng: random.Random, name: str, steps: int, batch_size: int,
               lr: float, noise: float, offset: int | None, progress: bool,
               late: tuple[int, float, int | None] | None = None, hidden_true_rate: float = 0.0,
               late_from_mix: list[int] | None = None) -> dict:
    """``steps`` SFT steps (tasks.sft.sft_phase: fresh optimiser, lr decaying linearly from ``lr`` to 10%) on
    fresh non-held-out instances of every length whose targets carry ``noise``."""
    from rise_nemo.tasks.sft import Example, sft_phase

    mix = late_from_mix if late is not None and late_from_mix else None
    # with a mix, no task of the mix may meet its held-out instances here
    held = frozenset().union(*(task.with_late_from(x).heldout_keys for x in mix)) if mix else None

    def examples() -> list[Example]:
        nonlocal late
        out = []
        for _ in range(batch_size):
            if mix:
                late = (rng.choice(mix), *late[1:])
                chain = task.sample_sft_chain(rng, rng.randint(1, task.cfg.max_steps), late[0], held)
            else:
                chain = task.sample_sft_chain(rng, rng.randint(1, task.cfg.max_steps))
            messages = [{"role": "user", "content": chain.prompt_text()}]
            out.append(Example(messages, noisy_solution(chain, noise, rng, offset, late, hidden_true_rate)))
        return out

    loss, seconds = sft_phase(policy, generator, steps, lr, examples, f"warm start (reasoning, {name})", progress)
    return {"steps": steps, "final_loss": loss, "train_seconds": seconds}


def _digest(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
