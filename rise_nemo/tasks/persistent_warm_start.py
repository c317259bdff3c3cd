"""Supervised warm start of the demo's persistent-criteria task (rise_nemo.data.persistent_task), cached.

Plain supervised fine-tuning on responses written by the task's ``response_text``: unhinted prompts (the
natural behaviour) and hinted prompts built with ``core.prompts.build_privileged_prompt`` exactly as
training builds them, with feedback sets that mimic eq. 5 (persistent criteria first). It is cached on
disk, keyed by a hash of the task, the model fingerprint and the warm-start config. ``measure_rates``
measures what the warm start achieved with the rule judge (rise_nemo.judges.rule).

Usage::

    task = make_persistent_task(seed=0)
    policy, generator = rise_nemo.backends.local.build({"tokenizer": "builtin:persistent_task", ...})
    stats = warm_start(policy, generator, task, {}, cache_dir=".cache/warm_start")  # WarmStartConfig keys
    print(stats.unprompted_rate, stats.hinted_rate)
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from rise_nemo.cache import cache_lock
from rise_nemo.core.prompts import build_privileged_prompt
from rise_nemo.core.rubric import RubricPrompt
from rise_nemo.data.persistent_task import (
    MAX_RESPONSE_TOKENS,
    PERSISTENT_POOL,
    TAG_BASE,
    TAG_NEGATIVE,
    TAG_PERSISTENT,
    TASK_VERSION,
    PersistentTask,
    response_text,
    tagged_criteria,
)
from rise_nemo.interfaces import JudgeRequest, SamplingParams
from rise_nemo.tasks.sft import Example, load_weights, save_weights, sft_phase


def _feedback_like(prompt: RubricPrompt, task: PersistentTask, rng: random.Random) -> list[int]:
    """A feedback set as eq. 5 would pick it early in training: each of the prompt's persistent criteria
    (at least one), sometimes the negative one and a base one, ordered by points (priority-like)."""
    pers = [k for k in task.persistent_criterion_ids[prompt.prompt_id] if rng.random() < 0.8]
    if not pers:
        pers = [rng.choice(task.persistent_criterion_ids[prompt.prompt_id])]
    chosen = list(pers)
    chosen += [k for k in task.negative_criterion_ids[prompt.prompt_id] if rng.random() < 0.3]
    chosen += [k for k in tagged_criteria(prompt.rubric, TAG_BASE) if rng.random() < 0.1]
    weights = prompt.rubric.weights
    return sorted(chosen, key=lambda k: (-abs(weights[k]), k))


def make_example(task: PersistentTask, prompt: RubricPrompt, hinted: bool, rng: random.Random, rates: WarmStartConfig) -> Example:
    """One warm-start pair. Unhinted: each pool behaviour with probability ``unprompted_rate``. Hinted:
    the hinted persistent behaviours always, "guaranteed" dragged in with ``hinted_negative_rate`` unless
    the hint says to avoid it; with ``hint_following`` off (the null control), a hinted prompt gets an
    unhinted response (the hint changes nothing the model writes)."""
    other = [b.name for b in PERSISTENT_POOL if rng.random() < rates.unprompted_rate]
    if hinted and not rates.hint_following:
        fb = _feedback_like(prompt, task, rng)
        messages = build_privileged_prompt(prompt.messages, [prompt.rubric.criteria[k] for k in fb], rng)
        return Example(messages, response_text(prompt, other, rng.random() < rates.natural_negative_rate, rng))
    if not hinted:
        return Example([dict(m) for m in prompt.messages], response_text(
            prompt, other, rng.random() < rates.natural_negative_rate, rng))
    fb = _feedback_like(prompt, task, rng)
    criteria = [prompt.rubric.criteria[k] for k in fb]
    hinted_names = {c.tags[1].split(":", 1)[1] for c in criteria if TAG_PERSISTENT in c.tags}
    avoid = any(TAG_NEGATIVE in c.tags for c in criteria)
    guaranteed = (not avoid) and rng.random() < rates.hinted_negative_rate
    messages = build_privileged_prompt(prompt.messages, criteria, rng)
    return Example(messages, response_text(prompt, sorted(hinted_names | set(other)), guaranteed, rng))


# ---- warm start ---------------------------------------------------------------------------------


@dataclass
class WarmStartConfig:
    """Supervised warm start. Keys of the ``cfg`` mapping given to ``warm_start`` (unknown keys raise)."""

    steps: int = 400
    batch_size: int = 32
    lr: float = 6e-3  # peak; decays linearly to 10% (tasks.sft.sft_phase)
    hinted_fraction: float = 0.5
    unprompted_rate: float = 0.015  # per pool behaviour, in unhinted targets
    natural_negative_rate: float = 0.03  # "guaranteed" in unhinted targets
    hinted_negative_rate: float = 0.25  # "guaranteed" in hinted targets whose hint does not forbid it
    eval_samples: int = 8  # samples per prompt when measuring the rates
    eval_max_new_tokens: int = MAX_RESPONSE_TOKENS
    seed: int = 0
    # false: the null control of bench/embedded_methods.py, a policy that ignores hints (hinted prompts get
    # unhinted responses), so RISE-RL's privileged rollouts meet the criteria no more often than natural ones
    hint_following: bool = True

    @classmethod
    def from_mapping(cls, cfg: Mapping | None) -> WarmStartConfig:
        raw = dict(cfg or {})
        known = {f.name: f for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise ValueError(f"warm_start.{key}: unknown key; known keys: {sorted(known)}")
        out = cls(**raw)
        for key in ("steps", "batch_size", "eval_samples", "eval_max_new_tokens"):
            if not isinstance(getattr(out, key), int) or getattr(out, key) < 1:
                raise ValueError(f"warm_start.{key}: expected an integer >= 1, got {getattr(out, key)!r}")
        if not isinstance(out.hint_following, bool):
            raise ValueError(f"warm_start.hint_following: expected true or false, got {out.hint_following!r}")
        for key in ("hinted_fraction", "unprompted_rate", "natural_negative_rate", "hinted_negative_rate"):
            if not 0.0 <= float(getattr(out, key)) <= 1.0:
                raise ValueError(f"warm_start.{key}: expected a probability in [0, 1], got {getattr(out, key)!r}")
        return out


@dataclass
class WarmStartStats:
    """Measured after the warm start (guidance-free unless stated), all with the rule judge.

    unprompted_rate   share of (sample, persistent criterion) pairs met under the original prompts
    hinted_rate       share of hinted persistent criteria met under privileged prompts
    negative_rate     share of natural samples meeting the negative criterion
    hinted_negative_rate  the same under privileged prompts whose hint does not mention it
    base_rate         share of (sample, base criterion) pairs met under the original prompts
    finished_rate     share of natural samples that ended with EOS
    """

    unprompted_rate: float
    hinted_rate: float
    negative_rate: float
    hinted_negative_rate: float
    base_rate: float
    finished_rate: float
    n_unprompted: int
    n_hinted: int
    steps: int
    final_loss: float
    train_seconds: float
    cached: bool = False
    cache_path: str = ""

    def summary(self) -> str:
        return (
            f"warm start: persistent criteria met unprompted {100 * self.unprompted_rate:.2f}% "
            f"(n={self.n_unprompted}), hinted {100 * self.hinted_rate:.1f}% (n={self.n_hinted}); "
            f"base {100 * self.base_rate:.1f}%, negative natural {100 * self.negative_rate:.1f}% / hinted "
            f"{100 * self.hinted_negative_rate:.1f}%, finished {100 * self.finished_rate:.1f}%"
            + (" [cached]" if self.cached else f" [{self.steps} steps, {self.train_seconds:.1f} s]")
        )


def _cache_key(task: PersistentTask, policy, cfg: WarmStartConfig) -> str:
    options = asdict(cfg)
    if options["hint_following"]:
        del options["hint_following"]  # warm starts that follow hints keep their cache entries
    spec = {"task": task.fingerprint(), "model": policy.engine.fingerprint(), "warm_start": options,
            "version": TASK_VERSION}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def warm_start(policy, generator, task: PersistentTask, cfg: Mapping | WarmStartConfig | None = None,
               cache_dir: str | Path | None = None, progress: bool = True) -> WarmStartStats:
    """Supervised warm start of the local backend's model on ``task.warmup`` (or load it from the cache),
    then measure and print the unprompted and hinted rates. Leaves a fresh optimiser at ``local.lr``.

    Needs the local backend's extras (``policy.engine``, ``generator.encode_response``).
    """
    wcfg = cfg if isinstance(cfg, WarmStartConfig) else WarmStartConfig.from_mapping(cfg)
    cache = Path(cache_dir) / f"warm_{_cache_key(task, policy, wcfg)}" if cache_dir is not None else None
    with cache_lock(cache):  # two commands started together build the entry once
        return _warm_start(policy, generator, task, wcfg, cache, progress)


def _warm_start(policy, generator, task: PersistentTask, wcfg: WarmStartConfig, cache: Path | None,
                progress: bool) -> WarmStartStats:
    if cache is not None and (cache / "stats.json").exists():
        load_weights(policy, cache)
        stats = WarmStartStats(**{**json.loads((cache / "stats.json").read_text()), "cached": True,
                                  "cache_path": str(cache)})
        print(stats.summary())
        return stats

    rng = random.Random(wcfg.seed)
    loss, train_s = sft_phase(
        policy, generator, wcfg.steps, wcfg.lr,
        lambda: [make_example(task, rng.choice(task.warmup), rng.random() < wcfg.hinted_fraction, rng, wcfg)
                 for _ in range(wcfg.batch_size)],
        "warm start", progress)
    policy.reset_optimizer()
    policy.train_steps = 0  # RL step counting starts after the warm start
    rates = measure_rates(generator, task, wcfg, progress=progress)
    stats = WarmStartStats(**rates, steps=wcfg.steps, final_loss=loss, train_seconds=train_s)
    if cache is not None:
        save_weights(policy, cache, asdict(stats))
        stats.cache_path = str(cache)
    print(stats.summary())
    return stats


def measure_rates(generator, task: PersistentTask, cfg: WarmStartConfig | None = None,
                  prompts: Sequence[RubricPrompt] | None = None, progress: bool = True) -> dict[str, float]:
    """Rates of WarmStartStats on ``prompts`` (default: train + held-out), with the rule judge.

    Natural: ``eval_samples`` samples per original prompt. Hinted: as many per privileged prompt whose
    hint lists exactly the prompt's persistent criteria (built with core.prompts.build_privileged_prompt).
    """
    from rise_nemo.judges.rule import RuleJudge

    cfg = cfg or WarmStartConfig()
    prompts = list(prompts if prompts is not None else task.train + task.heldout)
    rng = random.Random(cfg.seed + 1)
    params = SamplingParams(max_new_tokens=cfg.eval_max_new_tokens, temperature=1.0, top_p=1.0, seed=cfg.seed + 2)
    hinted = [build_privileged_prompt(p.messages, [p.rubric.criteria[k] for k in task.persistent_criterion_ids[p.prompt_id]], rng)
              for p in prompts]
    if progress:
        print(f"measuring rates: {len(prompts)} prompts x {cfg.eval_samples} samples, natural and hinted")
    natural = generator.generate([p.messages for p in prompts], cfg.eval_samples, params)
    guided = generator.generate(hinted, cfg.eval_samples, params)
    judge = RuleJudge()
    counts = {"pers": [0, 0], "hint": [0, 0], "neg": [0, 0], "hneg": [0, 0], "base": [0, 0], "fin": [0, 0]}

    def add(key: str, hits: int, total: int) -> None:
        counts[key][0] += hits
        counts[key][1] += total

    for p, nat_rows, hint_rows in zip(prompts, natural, guided):
        pers, neg = task.persistent_criterion_ids[p.prompt_id], task.negative_criterion_ids[p.prompt_id]
        base = tagged_criteria(p.rubric, TAG_BASE)
        v_nat = judge.judge([JudgeRequest(p.messages, r.response_text, p.rubric, p.prompt_id) for r in nat_rows])
        v_hint = judge.judge([JudgeRequest(p.messages, r.response_text, p.rubric, p.prompt_id) for r in hint_rows])
        for v, r in zip(v_nat, nat_rows):
            add("pers", sum(v[k] for k in pers), len(pers))
            add("neg", sum(v[k] for k in neg), len(neg))
            add("base", sum(v[k] for k in base), len(base))
            add("fin", int(r.finished), 1)
        for v in v_hint:
            add("hint", sum(v[k] for k in pers), len(pers))
            add("hneg", sum(v[k] for k in neg), len(neg))
    rate = {k: (h / n if n else 0.0) for k, (h, n) in counts.items()}
    return {"unprompted_rate": rate["pers"], "hinted_rate": rate["hint"], "negative_rate": rate["neg"],
            "hinted_negative_rate": rate["hneg"], "base_rate": rate["base"], "finished_rate": rate["fin"],
            "n_unprompted": counts["pers"][1], "n_hinted": counts["hint"][1]}


def transfer_rate(task: PersistentTask, prompts: Sequence[RubricPrompt] | None = None) -> float:
    """How far one hit carries: for each prompt A of ``prompts`` (default: the training prompts) and each of
    its persistent behaviours, the share of the OTHER prompts with that behaviour in their rubric whose
    criterion A's hit (``response_text`` with just that behaviour) also meets, with the rule judge.

    1.0 on today's task (``criteria="fixed"``: the phrase is the same for every prompt, so what one hit
    reinforces is right everywhere); on the premise variant (``criteria="prompt"``) only prompts that share
    the required content (audience and topic fact) count, about 1/64-1/8. It counts text, not skills: with
    ``name_behaviours`` a hit can still teach "the prompt asks for X -> write X" for every prompt asking for X."""
    from rise_nemo.judges.rule import RuleJudge

    prompts = list(prompts if prompts is not None else task.train)
    by_name: dict[str, list[tuple[RubricPrompt, int]]] = {}
    for p in prompts:
        for name, k in zip(task.persistent_names(p), task.persistent_criterion_ids[p.prompt_id]):
            by_name.setdefault(name, []).append((p, k))
    judge, rng = RuleJudge(), random.Random(0)
    met = total = 0
    for name, holders in by_name.items():
        for a, _ in holders:
            hit = response_text(a, [name], False, rng)
            others = [(b, k) for b, k in holders if b.prompt_id != a.prompt_id]
            verdicts = judge.judge([JudgeRequest(b.messages, hit, b.rubric, b.prompt_id) for b, _ in others])
            met += sum(int(v[k]) for v, (_, k) in zip(verdicts, others))
            total += len(others)
    return met / total if total else 0.0
