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

Variants (``make_persistent_task``; docs/results.md has the measurements): ``criteria="prompt"`` makes each
persistent criterion demand the prompt's own audience and topic fact; ``name_behaviours=True`` appends the
request ("please cover safety and a summary ."), so a prompt says which behaviours its rubric asks for;
``persistent_per_prompt=1`` leaves one persistent criterion per prompt.

``response_text`` writes the task's responses; the supervised warm start that teaches them (cached on
disk) and ``measure_rates`` (with the rule judge) live in ``rise_nemo.tasks.persistent_warm_start``, so
this module needs no model and no judge.

Lengths (tokens of the ``builtin:persistent_task`` tokenizer): prompts 12-16, privileged prompts up to
~70; natural responses 20-42 (median 24, EOS included), hinted ones up to MAX_RESPONSE_TOKENS = 64.
Sample with ``max_new_tokens >= MAX_RESPONSE_TOKENS``: a shorter limit cuts off exactly the persistent
phrases (they come after the opener and tips), so neither natural discovery nor hints can pay off.

Usage::

    task = make_persistent_task(seed=0)
    policy, generator = rise_nemo.backends.local.build({"tokenizer": "builtin:persistent_task", ...})
    stats = rise_nemo.tasks.persistent_warm_start.warm_start(policy, generator, task, {}, cache_dir=".cache/warm_start")
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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rise_nemo.core.prompts import GUIDANCE_TEMPLATES, format_hint, render_scaffold
from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric, RubricPrompt

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
    # The premise variant (``criteria="prompt"``): the required content depends on the prompt. The
    # sentence names the prompt's audience and (but for "minutes") the topic's own fact; the check
    # (kind, pattern template filled like ``phrase``; regex templates get escaped values) demands both.
    prompt_phrase: str = ""
    prompt_check: tuple[str, str] = ("contains", "")
    # What a prompt of the named variant (``name_behaviours=True``) asks for: "please cover <subject> ."
    # Words of the control's vocabulary only, so the tokenizer (and every cached warm start) is unchanged.
    subject: str = ""


# Canonical order = the order the phrases appear in a response ("in short" always closes it).
PERSISTENT_POOL: tuple[PersistentBehaviour, ...] = (
    PersistentBehaviour("first_step", "Gives a clear first step", MachineCheck("regex", r"\bfirst step\b"),
                        "first step : {action} .",
                        "first step for a {audience} : {action} .",
                        ("contains", "first step for a {audience} : {action}"), subject="a first step"),
    PersistentBehaviour("minutes", "Says how many minutes a day to spend", MachineCheck("regex", r"\b\d+ minutes a day\b"),
                        "spend {minutes} minutes a day on {topic} .",
                        "a {audience} can spend {minutes} minutes a day on {topic} .",
                        ("regex", r"\b{audience} can spend \d+ minutes a day on {topic}\b"), subject="time"),
    PersistentBehaviour("expert", "Suggests to ask an expert when unsure", MachineCheck("contains", "ask an expert"),
                        "if unsure , ask an expert about {topic} .",
                        "if unsure , a {audience} can ask an expert about {topic} .",
                        ("contains", "a {audience} can ask an expert about {topic}"), subject="an expert"),
    PersistentBehaviour("safety", "Includes a safety warning", MachineCheck("contains", "safety warning"),
                        "safety warning : {risk} .",
                        "safety warning for a {audience} : {risk} .",
                        ("contains", "safety warning for a {audience} : {risk}"), subject="safety"),
    PersistentBehaviour("mistake", "Points out a common mistake", MachineCheck("contains", "common mistake"),
                        "a common mistake is {mistake} .",
                        "a common mistake for a {audience} is {mistake} .",
                        ("contains", "common mistake for a {audience} is {mistake}"), subject="a common mistake"),
    PersistentBehaviour("summary", "Closes with an in short summary",
                        MachineCheck("regex", r"\bin short\b[^.]*\.$"),  # the last sentence
                        "in short , {topic} gets easier with practice .",
                        "in short , {topic} gets easier for a {audience} .",
                        ("regex", r"\bin short , {topic} gets easier for a {audience} \.$"), subject="a summary"),
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


CRITERIA_MODES = ("fixed", "prompt")  # make_persistent_task(criteria=...): today's task (control) / the premise


def _fill(template: str, topic: Topic, audience: str = "", minutes: str = "10", escape: bool = False) -> str:
    values = {"topic": topic.name, "audience": audience, "action": topic.action, "risk": topic.risk,
              "mistake": topic.mistake, "minutes": minutes}
    return template.format(**({k: re.escape(v) for k, v in values.items()} if escape else values))


def persistent_criterion(b: PersistentBehaviour, topic: Topic, audience: str, criteria: str = "fixed") -> Criterion:
    """Behaviour ``b``'s criterion on a (topic, audience) prompt. ``fixed``: today's prompt-independent
    phrase check, so one hit on any prompt meets it on every prompt. ``prompt``: the check demands the
    prompt's own content (audience, and the topic's fact), so a hit on one prompt meets it on another only
    when both share that content (``tasks.persistent_warm_start.transfer_rate`` measures it)."""
    tags = (TAG_PERSISTENT, f"pool:{b.name}")
    if criteria == "fixed":
        return Criterion(b.criterion, PERSISTENT_WEIGHT, tags, b.check)
    kind, pattern = b.prompt_check
    return Criterion(f"{b.criterion} for a {audience}", PERSISTENT_WEIGHT, tags,
                     MachineCheck(kind, _fill(pattern, topic, audience, escape=kind == "regex")))


def _rubric(topic: Topic, audience: str, persistent: Sequence[str], criteria: str = "fixed") -> Rubric:
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
        crit.append(persistent_criterion(PERSISTENT_POOL[POOL_INDEX[name]], topic, audience, criteria))
    crit.append(Criterion(NEGATIVE_TEXT, NEGATIVE_WEIGHT, (TAG_NEGATIVE, "pool:guaranteed"), NEGATIVE_CHECK))
    return Rubric(tuple(crit)).validate(f"persistent task ({topic.name}, {audience})")


def request_text(persistent: Sequence[str]) -> str:
    """What a prompt of the named variant appends: "please cover <subject> and <subject> ." (canonical
    order), the subjects of its persistent behaviours, so a policy can know what the rubric asks for."""
    names = sorted(persistent, key=POOL_INDEX.__getitem__)
    return "please cover " + " and ".join(PERSISTENT_POOL[POOL_INDEX[n]].subject for n in names) + " ."


def _prompt(prompt_id: str, t_idx: int, q_idx: int, a_idx: int, persistent: Sequence[str],
            criteria: str = "fixed", named: bool = False) -> RubricPrompt:
    topic, audience = TOPICS[t_idx], AUDIENCES[a_idx]
    text = QUESTION_TEMPLATES[q_idx].format(topic=topic.name, audience=audience)
    if named:
        text = f"{text} {request_text(persistent)}"
    meta = {"topic": t_idx, "audience": a_idx, "template": q_idx}
    if criteria != "fixed":
        meta["criteria"] = criteria  # response_text writes the matching phrases
    return RubricPrompt(
        prompt_id=prompt_id,
        messages=({"role": "user", "content": text},),
        rubric=_rubric(topic, audience, persistent, criteria),
        source=f"persistent_task:{prompt_id}",
        meta=meta,
    )


def make_persistent_task(
    seed: int = 0,
    train_per_topic: int = 8,
    heldout_per_topic: int = 2,
    persistent_per_prompt: int = 2,
    criteria: str = "fixed",
    name_behaviours: bool = False,
    heldout_pool_per_topic: int | None = None,
    replicate: int | None = None,
) -> PersistentTask:
    """Generate the task: for each topic the 32 (template, audience) combos are shuffled with ``seed``;
    the first ``heldout_per_topic`` are held out, the rest form the warm-up pool, of which the first
    ``train_per_topic`` are the RL training prompts. Each prompt draws its persistent criteria from
    PERSISTENT_POOL with the same seed (the same draws whatever ``criteria``).

    ``criteria``: ``fixed`` (today's task; RISE-RL's premise is weak there, one hit teaches the phrase
    for every prompt: the premise-absent control) or ``prompt`` (the premise variant: each persistent
    criterion demands the prompt's own audience and topic fact, see ``persistent_criterion``).

    ``name_behaviours``: False (today's prompts) or True: every prompt ends with ``request_text``, the
    subjects of its persistent behaviours ("please cover safety and a summary ."), so a policy can know
    which of the six its rubric asks for, on held-out prompts too (coverage ceiling 1 whatever
    ``persistent_per_prompt``). The warm start's natural targets ignore the request (each behaviour at the
    unprompted rate), so the request is there to be learned, for every method alike.
    ``persistent_per_prompt``: 1 makes each prompt's coverage 0 or 1 (one criterion to learn per prompt).

    Replicates (independent seeds of a comparison that share one warm start, bench/embedded_methods.py):
    ``heldout_pool_per_topic`` H holds out the first H combos of each topic (never in the warm start), and
    ``replicate`` r then draws this replicate's ``heldout_per_topic`` held-out prompts from those H and its
    ``train_per_topic`` training prompts from the rest, with its own seeded stream. ``warmup`` (what the warm
    start trains on) and the fingerprint (its cache key) depend on H, not on r, so every replicate of a pool
    shares one warm start. Both null: today's task."""
    n_combos = len(QUESTION_TEMPLATES) * len(AUDIENCES)
    if criteria not in CRITERIA_MODES:
        raise ValueError(f"data.task.criteria: expected one of {list(CRITERIA_MODES)}, got {criteria!r}")
    if not isinstance(name_behaviours, bool):
        raise ValueError(f"data.task.name_behaviours: expected true or false, got {name_behaviours!r}")
    for key, value in (("seed", seed), ("persistent_per_prompt", persistent_per_prompt),
                       ("train_per_topic", train_per_topic), ("heldout_per_topic", heldout_per_topic)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"data.task.{key}: expected an integer, got {value!r}")
    if persistent_per_prompt < 1 or persistent_per_prompt > len(PERSISTENT_POOL):
        raise ValueError(f"data.task.persistent_per_prompt: expected an integer in [1, {len(PERSISTENT_POOL)}], "
                         f"got {persistent_per_prompt}")
    pool = heldout_per_topic if heldout_pool_per_topic is None else heldout_pool_per_topic
    for key, value in (("heldout_pool_per_topic", heldout_pool_per_topic), ("replicate", replicate)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"data.task.{key}: expected null or an integer >= 0, got {value!r}")
    if replicate is not None and heldout_pool_per_topic is None:
        raise ValueError("data.task.replicate: needs data.task.heldout_pool_per_topic (the pool it draws from)")
    if heldout_per_topic < 1 or train_per_topic < 1 or heldout_per_topic + train_per_topic > n_combos:
        raise ValueError(
            f"data.task.train_per_topic ({train_per_topic}) + data.task.heldout_per_topic ({heldout_per_topic}) "
            f"must be in [2, {n_combos}], each at least 1"
        )
    if heldout_pool_per_topic is not None and (pool < heldout_per_topic or pool + train_per_topic > n_combos):
        raise ValueError(f"data.task.heldout_pool_per_topic ({pool}): expected heldout_per_topic "
                         f"({heldout_per_topic}) .. {n_combos - train_per_topic}")
    rng = random.Random(seed)
    draw = random.Random(f"persistent-replicate-{seed}-{replicate}") if replicate is not None else None
    train, heldout, warmup = [], [], []
    for t_idx, topic in enumerate(TOPICS):
        combos = [(q, a) for q in range(len(QUESTION_TEMPLATES)) for a in range(len(AUDIENCES))]
        rng.shuffle(combos)
        pool_held, pool_rest = [], []
        for j, (q_idx, a_idx) in enumerate(combos):
            persistent = rng.sample([b.name for b in PERSISTENT_POOL], persistent_per_prompt)
            if j < pool:
                pool_held.append(_prompt(f"heldout-{topic.name}-{j}", t_idx, q_idx, a_idx, persistent, criteria,
                                         name_behaviours))
                continue
            p = _prompt(f"{topic.name}-{j - pool:02d}", t_idx, q_idx, a_idx, persistent, criteria, name_behaviours)
            warmup.append(p)
            pool_rest.append(p)
        if draw is None:  # today's task: the first ones of the shuffled combos
            heldout += pool_held[:heldout_per_topic]
            train += pool_rest[:train_per_topic]
        else:
            heldout += sorted(draw.sample(pool_held, heldout_per_topic), key=pool_held.index)
            train += sorted(draw.sample(pool_rest, train_per_topic), key=pool_rest.index)
    every = train + heldout + warmup
    persistent_ids = {p.prompt_id: tagged_criteria(p.rubric, TAG_PERSISTENT) for p in every}
    negative_ids = {p.prompt_id: tagged_criteria(p.rubric, TAG_NEGATIVE) for p in every}
    spec = {"seed": seed, "train_per_topic": train_per_topic, "heldout_per_topic": heldout_per_topic,
            "persistent_per_prompt": persistent_per_prompt}
    if criteria != "fixed":  # the control's spec (and so its cached warm starts) stays as it was
        spec["criteria"] = criteria
    if name_behaviours:
        spec["name_behaviours"] = True
    if heldout_pool_per_topic is not None:  # not the replicate: every replicate of a pool shares the warm start
        spec["heldout_pool_per_topic"] = heldout_pool_per_topic
    return PersistentTask(seed, tuple(train), tuple(heldout), tuple(warmup), persistent_ids, negative_ids, spec)


def tagged_criteria(rubric: Rubric, tag: str) -> tuple[int, ...]:
    return tuple(k for k, c in enumerate(rubric.criteria) if tag in c.tags)


def vocabulary_corpus() -> list[str]:
    """Every text the task, its hints and its responses can contain (seed-independent), for the
    word-level tokenizer ``builtin:persistent_task``."""
    texts = list(GUIDANCE_TEMPLATES) + [NEGATIVE_SENTENCE]
    texts += [request_text([a, b.name]) for a in POOL_INDEX for b in PERSISTENT_POOL if a != b.name]
    for topic in TOPICS:
        texts += list(topic.tips)
        texts += [_fill(b.phrase, topic, minutes=m) for b in PERSISTENT_POOL for m in MINUTES]
        for audience in AUDIENCES:
            texts += [q.format(topic=topic.name, audience=audience) for q in QUESTION_TEMPLATES]
            texts += [_opener(topic, audience)]
            texts += [_fill(b.prompt_phrase, topic, audience, m) for b in PERSISTENT_POOL for m in MINUTES]
            for mode in CRITERIA_MODES:
                full = _rubric(topic, audience, [b.name for b in PERSISTENT_POOL], mode).criteria
                # Hints (eq. 6) and RuscaRL scaffolds render criteria with their own separators and prefixes.
                texts += [format_hint(full), render_scaffold(full)]
    return texts


# ---- responses the warm start imitates ---------------------------------------------------------


def _opener(topic: Topic, audience: str) -> str:
    return f"here is advice on {topic.name} for a {audience} ."


def response_text(prompt: RubricPrompt, include: Sequence[str], guaranteed: bool, rng: random.Random) -> str:
    """A response: opener, two tips, the phrases of ``include`` (canonical order), and optionally the
    undesirable "success is guaranteed" sentence (before a closing summary)."""
    topic, audience = TOPICS[int(prompt.meta["topic"])], AUDIENCES[int(prompt.meta["audience"])]
    parts = [_opener(topic, audience), *rng.sample(topic.tips, 2)]
    names = sorted(include, key=POOL_INDEX.__getitem__)
    premise = prompt.meta.get("criteria", "fixed") == "prompt"

    def phrase(name: str) -> str:
        b = PERSISTENT_POOL[POOL_INDEX[name]]
        return b.prompt_phrase if premise else b.phrase

    for name in names:
        if name != "summary":
            parts.append(_fill(phrase(name), topic, audience, rng.choice(MINUTES)))
    if guaranteed:
        parts.append(NEGATIVE_SENTENCE)
    if "summary" in names:
        parts.append(_fill(phrase("summary"), topic, audience))
    return " ".join(parts)
