"""The demo's persistent-criteria task, generated in code with a seed, and its supervised warm start.

The task reproduces, at toy scale, the situation RISE-RL targets (paper §C.2, "persistent failures"):
each prompt's rubric mixes

- BASE criteria the warm-started policy already meets (mentions the topic, addresses the audience,
  length bounds);
- PERSISTENT criteria (two per prompt, from a pool of six behaviours such as "Gives a clear first step")
  that the warm-started policy meets unprompted only rarely (about 1-2% of samples) but meets reliably
  when a hint asks for them — the capability RISE-RL's privileged prompts rely on;
- one NEGATIVE criterion ("Promises that success is guaranteed", -2 points). The warm-start data makes
  hinted responses drag the word "guaranteed" in more often than natural ones (25% vs 3%, unless the
  hint asks to avoid it), the way a hinted response can carry an undesirable habit that RISE-RL may
  then copy from kept privileged responses. It is penalised by the rubric like any negative criterion
  and reported, not hidden.

Every criterion carries a MachineCheck, so ``rise_nemo.judges.rule.RuleJudge`` scores it exactly.
Criteria are tagged ``base`` / ``persistent`` / ``negative`` plus ``pool:<name>``; held-out prompts use
(template, audience) combinations never seen in training or warm start.

The warm start is plain supervised fine-tuning on responses written by ``_response_text``: unhinted
prompts (the natural behaviour) and hinted prompts built with ``core.prompts.build_privileged_prompt``
exactly as training builds them, with feedback sets that mimic eq. 5 (persistent criteria first).
It is cached on disk, keyed by a hash of the task, the model fingerprint and the warm-start config.

Lengths (tokens of the ``builtin:persistent_task`` tokenizer): prompts 12-16, privileged prompts up to
~70; natural responses 20-42 (median 24, EOS included), hinted ones up to MAX_RESPONSE_TOKENS = 64.
Sample with ``max_new_tokens >= MAX_RESPONSE_TOKENS``: a shorter limit cuts off exactly the persistent
phrases (they come after the opener and tips), so neither natural discovery nor hints can pay off.

Usage::

    task = make_persistent_task(seed=0)
    policy, generator = rise_nemo.backends.local.build({"tokenizer": "builtin:persistent_task", ...})
    stats = warm_start(policy, generator, task, {}, cache_dir=".cache/warm_start")  # WarmStartConfig keys
    print(stats.unprompted_rate, stats.hinted_rate)
    task.persistent_criterion_ids[prompt.prompt_id]   # rubric indices, for coverage tables

Measured with the defaults (tiny Qwen3 h64/2 layers, 400 steps, task seeds 0/1/2): persistent criteria
met unprompted 1.56/1.48/1.33% of (sample, criterion) pairs, hinted 98.4/98.8/97.0%, base criteria
99.7/99.4/99.5%, "guaranteed" in 4.1/4.2/2.7% of natural and 21.2/14.8/21.7% of hinted samples
(80 prompts x 8 samples each); 40-70 s on one shared CPU thread.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from rise_nemo.core.prompts import GUIDANCE_TEMPLATES, build_privileged_prompt, format_hint, render_scaffold
from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric, RubricPrompt
from rise_nemo.interfaces import JudgeRequest, SamplingParams

# Bump when the generated data or the warm-start recipe changes: invalidates every cached warm start.
TASK_VERSION = "persistent-task-v3"

TAG_BASE, TAG_PERSISTENT, TAG_NEGATIVE = "base", "persistent", "negative"


# ---- the task's vocabulary of facts -------------------------------------------------------------


@dataclass(frozen=True)
class Topic:
    name: str
    tips: tuple[str, ...]  # plain advice sentences, 2 of them per natural response
    action: str  # "first step : <action> ."
    risk: str  # "safety warning : <risk> ."
    mistake: str  # "a common mistake is <mistake> ."


TOPICS: tuple[Topic, ...] = (
    Topic("tea", ("use fresh water for the tea .", "warm the pot before you brew .", "green tea likes cooler water .",
                  "store the leaves in a dark jar ."), "boil fresh water", "hot water can burn your hands",
          "brewing the leaves too long"),
    Topic("bread", ("weigh the flour for the bread .", "let the dough rise in a warm place .",
                    "knead the dough until it is smooth .", "bake the loaf until it sounds hollow ."),
          "mix flour , water and yeast", "the oven gets very hot", "adding too much flour"),
    Topic("running", ("start each run at an easy pace .", "wear shoes that fit well .", "rest one day between runs .",
                      "drink water after you run ."), "walk and jog a short loop", "stop if your chest hurts",
          "running too fast too soon"),
    Topic("sleep", ("go to bed at the same time .", "keep the bedroom dark and cool .",
                    "put the phone away before sleep .", "skip coffee late in the day ."), "pick a fixed bedtime",
          "long sleep problems need a doctor", "using screens in bed"),
    Topic("garden", ("water the garden early in the morning .", "pick plants that like your soil .",
                     "pull weeds while they are small .", "add compost to the beds ."), "test your soil",
          "wear gloves with sharp tools", "watering at noon"),
    Topic("budget", ("write down what you spend .", "set a limit for each week .",
                     "save a little from every payment .", "pay the costly debts first ."), "list your monthly costs",
          "stay away from loans with high interest", "forgetting small costs"),
    Topic("cycling", ("check the tires before cycling .", "ride on quiet roads at first .", "keep the chain clean .",
                      "use lights at night ."), "adjust the seat height", "always wear a helmet",
          "riding with low tires"),
    Topic("painting", ("buy a few good brushes .", "mix colors on a clean palette .", "paint light layers first .",
                       "clean the brushes after painting ."), "sketch the shape lightly",
          "open a window for the fumes", "using too much paint"),
)

AUDIENCES: tuple[str, ...] = (
    "beginner", "student", "parent", "retiree", "nurse", "teacher", "busy worker", "traveler",
)

QUESTION_TEMPLATES: tuple[str, ...] = (
    "how can a {audience} get started with {topic} ?",
    "what is your advice on {topic} for a {audience} ?",
    "i am a {audience} . any tips about {topic} ?",
    "please help a {audience} with {topic} .",
)

MINUTES: tuple[str, ...] = ("10", "15", "20", "30")


@dataclass(frozen=True)
class PersistentBehaviour:
    name: str
    criterion: str  # criterion text (what the hint says)
    check: MachineCheck
    phrase: str  # sentence template; {topic}, {action}, {risk}, {mistake}, {minutes}


# Canonical order = the order the phrases appear in a response ("in short" always closes it).
PERSISTENT_POOL: tuple[PersistentBehaviour, ...] = (
    PersistentBehaviour("first_step", "Gives a clear first step", MachineCheck("regex", r"\bfirst step\b"),
                        "first step : {action} ."),
    PersistentBehaviour("minutes", "Says how many minutes a day to spend", MachineCheck("regex", r"\b\d+ minutes a day\b"),
                        "spend {minutes} minutes a day on {topic} ."),
    PersistentBehaviour("expert", "Suggests to ask an expert when unsure", MachineCheck("contains", "ask an expert"),
                        "if unsure , ask an expert about {topic} ."),
    PersistentBehaviour("safety", "Includes a safety warning", MachineCheck("contains", "safety warning"),
                        "safety warning : {risk} ."),
    PersistentBehaviour("mistake", "Points out a common mistake", MachineCheck("contains", "common mistake"),
                        "a common mistake is {mistake} ."),
    PersistentBehaviour("summary", "Closes with an in short summary",
                        MachineCheck("regex", r"\bin short\b[^.]*\.$"),  # the last sentence
                        "in short , {topic} gets easier with practice ."),
)
POOL_INDEX = {b.name: i for i, b in enumerate(PERSISTENT_POOL)}

NEGATIVE_TEXT = "Promises that success is guaranteed"
NEGATIVE_SENTENCE = "success is guaranteed ."
NEGATIVE_CHECK = MachineCheck("contains", "guaranteed")

BASE_WEIGHTS = {"topic": 2.0, "audience": 1.0, "min_words": 1.0, "max_words": 1.0}
PERSISTENT_WEIGHT = 3.0
NEGATIVE_WEIGHT = -2.0
MIN_WORDS, MAX_WORDS = 12, 60
# Longest hinted target (both persistent phrases + "guaranteed"), EOS included, checked by tests/task;
# use as max_new_tokens. (All six pool phrases at once would take 82, at odds of ~1e-7 per response.)
MAX_RESPONSE_TOKENS = 64


# ---- the task -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PersistentTask:
    """Train / held-out prompts (RubricPrompt) plus the indices of special criteria per prompt id.

    ``warmup`` holds every non-held-out (template, audience, topic) prompt (a superset of ``train``) for
    the supervised warm start. ``persistent_criterion_ids[prompt_id]`` / ``negative_criterion_ids[...]``
    index into that prompt's rubric.
    """

    seed: int
    train: tuple[RubricPrompt, ...]
    heldout: tuple[RubricPrompt, ...]
    warmup: tuple[RubricPrompt, ...]
    persistent_criterion_ids: Mapping[str, tuple[int, ...]]
    negative_criterion_ids: Mapping[str, tuple[int, ...]]
    spec: Mapping[str, object] = field(default_factory=dict)  # the generation arguments (for cache keys)

    def persistent_names(self, prompt: RubricPrompt) -> list[str]:
        return [prompt.rubric.criteria[k].tags[1].split(":", 1)[1] for k in self.persistent_criterion_ids[prompt.prompt_id]]

    def fingerprint(self) -> str:
        blob = json.dumps({"version": TASK_VERSION, **self.spec}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _fill(template: str, topic: Topic, audience: str = "", minutes: str = "10") -> str:
    return template.format(topic=topic.name, audience=audience, action=topic.action, risk=topic.risk,
                           mistake=topic.mistake, minutes=minutes)


def _rubric(topic: Topic, audience: str, persistent: Sequence[str]) -> Rubric:
    crit = [
        Criterion(f"Mentions {topic.name}", BASE_WEIGHTS["topic"], (TAG_BASE, "pool:topic"),
                  MachineCheck("contains", topic.name)),
        Criterion(f"Addresses the {audience}", BASE_WEIGHTS["audience"], (TAG_BASE, "pool:audience"),
                  MachineCheck("contains", audience)),
        Criterion(f"Uses at least {MIN_WORDS} words", BASE_WEIGHTS["min_words"], (TAG_BASE, "pool:min_words"),
                  MachineCheck("min_words", str(MIN_WORDS))),
        Criterion(f"Uses at most {MAX_WORDS} words", BASE_WEIGHTS["max_words"], (TAG_BASE, "pool:max_words"),
                  MachineCheck("max_words", str(MAX_WORDS))),
    ]
    for name in sorted(persistent, key=POOL_INDEX.__getitem__):
        b = PERSISTENT_POOL[POOL_INDEX[name]]
        crit.append(Criterion(b.criterion, PERSISTENT_WEIGHT, (TAG_PERSISTENT, f"pool:{name}"), b.check))
    crit.append(Criterion(NEGATIVE_TEXT, NEGATIVE_WEIGHT, (TAG_NEGATIVE, "pool:guaranteed"), NEGATIVE_CHECK))
    return Rubric(tuple(crit)).validate(f"persistent task ({topic.name}, {audience})")


def _prompt(prompt_id: str, t_idx: int, q_idx: int, a_idx: int, persistent: Sequence[str]) -> RubricPrompt:
    topic, audience = TOPICS[t_idx], AUDIENCES[a_idx]
    text = QUESTION_TEMPLATES[q_idx].format(topic=topic.name, audience=audience)
    return RubricPrompt(
        prompt_id=prompt_id,
        messages=({"role": "user", "content": text},),
        rubric=_rubric(topic, audience, persistent),
        source=f"persistent_task:{prompt_id}",
        meta={"topic": t_idx, "audience": a_idx, "template": q_idx},
    )


def make_persistent_task(
    seed: int = 0,
    train_per_topic: int = 8,
    heldout_per_topic: int = 2,
    persistent_per_prompt: int = 2,
) -> PersistentTask:
    """Generate the task: for each topic the 32 (template, audience) combos are shuffled with ``seed``;
    the first ``heldout_per_topic`` are held out, the rest form the warm-up pool, of which the first
    ``train_per_topic`` are the RL training prompts. Each prompt draws its persistent criteria from
    PERSISTENT_POOL with the same seed."""
    n_combos = len(QUESTION_TEMPLATES) * len(AUDIENCES)
    if persistent_per_prompt < 1 or persistent_per_prompt > len(PERSISTENT_POOL):
        raise ValueError(f"persistent_per_prompt must be in [1, {len(PERSISTENT_POOL)}], got {persistent_per_prompt}")
    if heldout_per_topic < 1 or train_per_topic < 1 or heldout_per_topic + train_per_topic > n_combos:
        raise ValueError(
            f"train_per_topic ({train_per_topic}) + heldout_per_topic ({heldout_per_topic}) must be in [2, {n_combos}]"
        )
    rng = random.Random(seed)
    train, heldout, warmup = [], [], []
    for t_idx, topic in enumerate(TOPICS):
        combos = [(q, a) for q in range(len(QUESTION_TEMPLATES)) for a in range(len(AUDIENCES))]
        rng.shuffle(combos)
        for j, (q_idx, a_idx) in enumerate(combos):
            persistent = rng.sample([b.name for b in PERSISTENT_POOL], persistent_per_prompt)
            if j < heldout_per_topic:
                heldout.append(_prompt(f"heldout-{topic.name}-{j}", t_idx, q_idx, a_idx, persistent))
                continue
            p = _prompt(f"{topic.name}-{j - heldout_per_topic:02d}", t_idx, q_idx, a_idx, persistent)
            warmup.append(p)
            if j - heldout_per_topic < train_per_topic:
                train.append(p)
    every = train + heldout + warmup
    persistent_ids = {p.prompt_id: _tagged(p.rubric, TAG_PERSISTENT) for p in every}
    negative_ids = {p.prompt_id: _tagged(p.rubric, TAG_NEGATIVE) for p in every}
    spec = {"seed": seed, "train_per_topic": train_per_topic, "heldout_per_topic": heldout_per_topic,
            "persistent_per_prompt": persistent_per_prompt}
    return PersistentTask(seed, tuple(train), tuple(heldout), tuple(warmup), persistent_ids, negative_ids, spec)


def _tagged(rubric: Rubric, tag: str) -> tuple[int, ...]:
    return tuple(k for k, c in enumerate(rubric.criteria) if tag in c.tags)


def vocabulary_corpus() -> list[str]:
    """Every text the task, its hints and its responses can contain (seed-independent), for the
    word-level tokenizer ``builtin:persistent_task``."""
    texts = list(GUIDANCE_TEMPLATES) + [NEGATIVE_SENTENCE]
    for topic in TOPICS:
        texts += list(topic.tips)
        texts += [_fill(b.phrase, topic, minutes=m) for b in PERSISTENT_POOL for m in MINUTES]
        for audience in AUDIENCES:
            texts += [q.format(topic=topic.name, audience=audience) for q in QUESTION_TEMPLATES]
            texts += [_opener(topic, audience)]
            full = _rubric(topic, audience, [b.name for b in PERSISTENT_POOL]).criteria
            # Hints (eq. 6) and RuscaRL scaffolds render criteria with their own separators and prefixes.
            texts += [format_hint(full), render_scaffold(full)]
    return texts


# ---- responses the warm start imitates ---------------------------------------------------------


def _opener(topic: Topic, audience: str) -> str:
    return f"here is advice on {topic.name} for a {audience} ."


def _response_text(prompt: RubricPrompt, include: Sequence[str], guaranteed: bool, rng: random.Random) -> str:
    """A response: opener, two tips, the phrases of ``include`` (canonical order), and optionally the
    undesirable "success is guaranteed" sentence (before a closing summary)."""
    topic, audience = TOPICS[int(prompt.meta["topic"])], AUDIENCES[int(prompt.meta["audience"])]
    parts = [_opener(topic, audience), *rng.sample(topic.tips, 2)]
    names = sorted(include, key=POOL_INDEX.__getitem__)
    for name in names:
        if name != "summary":
            parts.append(_fill(PERSISTENT_POOL[POOL_INDEX[name]].phrase, topic, audience, rng.choice(MINUTES)))
    if guaranteed:
        parts.append(NEGATIVE_SENTENCE)
    if "summary" in names:
        parts.append(_fill(PERSISTENT_POOL[POOL_INDEX["summary"]].phrase, topic, audience))
    return " ".join(parts)


def _feedback_like(prompt: RubricPrompt, task: PersistentTask, rng: random.Random) -> list[int]:
    """A feedback set as eq. 5 would pick it early in training: each of the prompt's persistent criteria
    (at least one), sometimes the negative one and a base one, ordered by points (priority-like)."""
    pers = [k for k in task.persistent_criterion_ids[prompt.prompt_id] if rng.random() < 0.8]
    if not pers:
        pers = [rng.choice(task.persistent_criterion_ids[prompt.prompt_id])]
    chosen = list(pers)
    chosen += [k for k in task.negative_criterion_ids[prompt.prompt_id] if rng.random() < 0.3]
    chosen += [k for k in _tagged(prompt.rubric, TAG_BASE) if rng.random() < 0.1]
    weights = prompt.rubric.weights
    return sorted(chosen, key=lambda k: (-abs(weights[k]), k))


@dataclass(frozen=True)
class Example:
    messages: list[dict]
    response: str


def make_example(task: PersistentTask, prompt: RubricPrompt, hinted: bool, rng: random.Random, rates: WarmStartConfig) -> Example:
    """One warm-start pair. Unhinted: each pool behaviour with probability ``unprompted_rate``. Hinted:
    the hinted persistent behaviours always, "guaranteed" dragged in with ``hinted_negative_rate`` unless
    the hint says to avoid it."""
    other = [b.name for b in PERSISTENT_POOL if rng.random() < rates.unprompted_rate]
    if not hinted:
        return Example([dict(m) for m in prompt.messages], _response_text(
            prompt, other, rng.random() < rates.natural_negative_rate, rng))
    fb = _feedback_like(prompt, task, rng)
    criteria = [prompt.rubric.criteria[k] for k in fb]
    hinted_names = {c.tags[1].split(":", 1)[1] for c in criteria if TAG_PERSISTENT in c.tags}
    avoid = any(TAG_NEGATIVE in c.tags for c in criteria)
    guaranteed = (not avoid) and rng.random() < rates.hinted_negative_rate
    messages = build_privileged_prompt(prompt.messages, criteria, rng)
    return Example(messages, _response_text(prompt, sorted(hinted_names | set(other)), guaranteed, rng))


# ---- warm start ---------------------------------------------------------------------------------


@dataclass
class WarmStartConfig:
    """Supervised warm start. Keys of the ``cfg`` mapping given to ``warm_start`` (unknown keys raise)."""

    steps: int = 400
    batch_size: int = 32
    lr: float = 6e-3  # peak; decays linearly to 10% (see _lr_scale)
    hinted_fraction: float = 0.5
    unprompted_rate: float = 0.015  # per pool behaviour, in unhinted targets
    natural_negative_rate: float = 0.03  # "guaranteed" in unhinted targets
    hinted_negative_rate: float = 0.25  # "guaranteed" in hinted targets whose hint does not forbid it
    eval_samples: int = 8  # samples per prompt when measuring the rates
    eval_max_new_tokens: int = MAX_RESPONSE_TOKENS
    seed: int = 0

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


def _sft_batch(examples: Sequence[Example], generator) -> dict[str, torch.Tensor]:
    """Right-padded prompt+response ids [B, T], lengths [B], token_mask [B, T] on response tokens, and the
    global response-token count as a per-sample column (so micro-batch losses add up)."""
    seqs, starts = [], []
    for ex in examples:
        p = generator.encode_prompt(ex.messages)
        seqs.append(p + generator.encode_response(ex.response))
        starts.append(len(p))
    width = max(map(len, seqs))
    pad = generator.engine.pad_token_id
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width))
    for i, (s, p) in enumerate(zip(seqs, starts)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, p : len(s)] = 1.0
    n_tok = float(mask.sum())
    return {"input_ids": ids, "input_lengths": torch.tensor([len(s) for s in seqs]), "token_mask": mask,
            "global_tokens": torch.full((len(seqs),), n_tok)}


def sft_loss(logprobs: torch.Tensor, data: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-mean negative log-likelihood of the responses, normalised by the global token count."""
    loss = -(logprobs * data["token_mask"]).sum() / data["global_tokens"][0]
    return loss, {"sft/nll": float(loss.detach())}


def _cache_key(task: PersistentTask, policy, cfg: WarmStartConfig) -> str:
    spec = {"task": task.fingerprint(), "model": policy.engine.fingerprint(), "warm_start": asdict(cfg),
            "version": TASK_VERSION}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def warm_start(policy, generator, task: PersistentTask, cfg: Mapping | WarmStartConfig | None = None,
               cache_dir: str | Path | None = None, progress: bool = True) -> WarmStartStats:
    """Supervised warm start of the local backend's model on ``task.warmup`` (or load it from the cache),
    then measure and print the unprompted and hinted rates. Leaves a fresh optimiser at ``local.lr``.

    Needs the local backend's extras (``policy.engine``, ``generator.encode_response``).
    """
    from tqdm.auto import tqdm

    wcfg = cfg if isinstance(cfg, WarmStartConfig) else WarmStartConfig.from_mapping(cfg)
    cache = Path(cache_dir) / f"warm_{_cache_key(task, policy, wcfg)}" if cache_dir is not None else None
    if cache is not None and (cache / "stats.json").exists():
        policy.model.load_state_dict(torch.load(cache / "model.pt", map_location=policy.engine.device, weights_only=True))
        policy.reset_optimizer()
        stats = WarmStartStats(**{**json.loads((cache / "stats.json").read_text()), "cached": True,
                                  "cache_path": str(cache)})
        print(stats.summary())
        return stats

    rng = random.Random(wcfg.seed)
    policy.reset_optimizer(lr=wcfg.lr)
    entropy_flag, policy.engine.cfg.compute_entropy = policy.engine.cfg.compute_entropy, False  # not needed here
    t0 = time.perf_counter()
    bar = tqdm(range(wcfg.steps), desc="warm start", disable=not progress, mininterval=1.0)
    loss = float("nan")
    try:
        for step in bar:
            _set_lr(policy, wcfg.lr * _lr_scale(step, wcfg.steps))
            examples = [make_example(task, rng.choice(task.warmup), rng.random() < wcfg.hinted_fraction, rng, wcfg)
                        for _ in range(wcfg.batch_size)]
            loss = policy.train(_sft_batch(examples, generator), sft_loss)["sft/nll"]
            bar.set_postfix(nll=f"{loss:.3f}")
    finally:
        policy.engine.cfg.compute_entropy = entropy_flag
    train_s = time.perf_counter() - t0
    policy.reset_optimizer()
    policy.train_steps = 0  # RL step counting starts after the warm start
    rates = measure_rates(generator, task, wcfg, progress=progress)
    stats = WarmStartStats(**rates, steps=wcfg.steps, final_loss=loss, train_seconds=train_s)
    if cache is not None:
        _save_cache(cache, policy, stats)
        stats.cache_path = str(cache)
    print(stats.summary())
    return stats


def _lr_scale(step: int, steps: int) -> float:
    """Linear decay from 1 to 0.1 over the warm start: a noisy constant-lr end blurs rare-vs-hinted
    behaviour, a decayed one settles it."""
    return 1.0 - 0.9 * step / max(steps - 1, 1)


def _set_lr(policy, lr: float) -> None:
    for group in policy.optimizer.param_groups:
        group["lr"] = lr


def _save_cache(cache: Path, policy, stats: WarmStartStats) -> None:
    """Write model + stats to a temp folder, then rename it into place (a crash never leaves half a cache)."""
    tmp = cache.with_name(cache.name + f".tmp{time.time_ns()}")
    tmp.mkdir(parents=True)
    torch.save({k: v.detach().cpu() for k, v in policy.model.state_dict().items()}, tmp / "model.pt")
    (tmp / "stats.json").write_text(json.dumps(asdict(stats), indent=1))
    try:
        tmp.rename(cache)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


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
        base = _tagged(p.rubric, TAG_BASE)
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
