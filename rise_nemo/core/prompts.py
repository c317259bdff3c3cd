"""Prompt construction: RISE-RL's privileged prompt (eq. 6) and the RuscaRL scaffold baseline.

Both functions copy the conversation and never edit it in place; the originals stay the prompts under
which log-probs are recomputed and responses are judged (docs/DESIGN.md §2).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from rise_nemo.core.rubric import Conversation, Criterion

__all__ = [
    "GUIDANCE_TEMPLATES",
    "LENGTH_NEUTRAL_TEMPLATES",
    "hint_templates",
    "format_hint",
    "build_privileged_prompt",
    "ruscarl_num_scaffold",
    "build_ruscarl_prompt",
    "render_scaffold",
]

# Our own wording (the paper's five templates are not in its text). Each holds one ``{hint}``.
GUIDANCE_TEMPLATES: tuple[str, ...] = (
    "While answering, make sure your response does the following: {hint}.",
    "A strong answer here should cover these points: {hint}. Please take them into account.",
    "Before you reply, note what a reviewer will look for in your answer: {hint}.",
    "Keep these requirements in mind as you write your response: {hint}.",
    "Some guidance for a complete answer: {hint}. Address these naturally in your reply.",
)

# Length-neutral variants (our extension, docs/DESIGN.md §2): the same requests plus a closing ask to stay
# short, so hinted responses are not systematically longer than natural ones (the per-response length check is in
# rise_nemo.core.guidance). Worded with the demo tokenizer's existing vocabulary, so no word is unknown.
LENGTH_NEUTRAL_TEMPLATES: tuple[str, ...] = (
    "While answering, make sure your response does the following: {hint}. Keep it short.",
    "A strong answer here should cover these points: {hint}. Use few words.",
    "Before you reply, note what a reviewer will look for in your answer: {hint}. A short answer is good.",
    "Keep these requirements in mind as you write your response: {hint}. Keep your answer short.",
    "Some guidance for a complete answer: {hint}. Keep your reply short.",
)


def hint_templates(style: str) -> tuple[str, ...]:
    """The template set of ``rise.hints``: ``paper`` (GUIDANCE_TEMPLATES) or ``length_neutral``."""
    sets = {"paper": GUIDANCE_TEMPLATES, "length_neutral": LENGTH_NEUTRAL_TEMPLATES}
    if style not in sets:
        raise ValueError(f"config key 'rise.hints': unknown template set {style!r}; expected one of {sorted(sets)}")
    return sets[style]


_AVOID_PREFIX = "avoid the following: "


def _clean(text: str) -> str:
    """Criterion text without trailing punctuation, so '; ' joins read naturally."""
    return text.strip().rstrip(".;").strip()


def format_hint(criteria: Sequence[Criterion]) -> str:
    """The {hint} of eq. 6: criterion texts joined by '; ', negative criteria phrased as things to avoid.

    A negative-points criterion describes an undesirable behaviour ("Recommends antibiotics"), so stating
    it verbatim would ask for it; it becomes "avoid the following: recommends antibiotics".
    """
    if not criteria:
        raise ValueError("format_hint: no criteria selected (eq. 5 gave an empty feedback set)")
    parts = []
    for c in criteria:
        text = _clean(c.text)
        if c.is_negative:
            text = _AVOID_PREFIX + (text[:1].lower() + text[1:])
        parts.append(text)
    return "; ".join(parts)


def _copy_conversation(messages: Conversation) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        if "role" not in m or "content" not in m:
            raise ValueError(f"message {i} needs 'role' and 'content' keys, got {sorted(m)}")
        out.append(dict(m))
    return out


def build_privileged_prompt(
    messages: Conversation, criteria: Sequence[Criterion], rng: random.Random,
    templates: Sequence[str] = GUIDANCE_TEMPLATES,
) -> list[dict]:
    """Eq. 6, q_priv = q (+) C_fb(q): one of ``templates``, chosen with ``rng``, filled with the hint
    and appended (after a blank line) to the FINAL user message; every other message stays verbatim.

    Raises ValueError if the conversation is empty or its last message is not the user's.
    """
    out = _copy_conversation(messages)
    if not out:
        raise ValueError("build_privileged_prompt: empty conversation")
    if out[-1]["role"] != "user":
        raise ValueError(
            f"build_privileged_prompt: the last message must be the user's, got role {out[-1]['role']!r} "
            f"(message {len(out) - 1})"
        )
    template = templates[rng.randrange(len(templates))]
    # str.replace, not str.format: criterion texts may contain braces.
    suffix = template.replace("{hint}", format_hint(criteria))
    out[-1]["content"] = f"{out[-1]['content']}\n\n{suffix}"
    return out


def _sigmoid_decay(x: float, alpha: float, t0: float) -> float:
    """phi(x) = 1 / (1 + exp(alpha (x - t0))), evaluated without overflow for large alpha."""
    z = alpha * (x - t0)
    if z >= 0:
        e = math.exp(-z)
        return e / (1.0 + e)
    return 1.0 / (1.0 + math.exp(z))


def ruscarl_num_scaffold(
    num_criteria: int,
    sample_index: int,
    group_size: int,
    progress: float,
    alpha: float = 125.0,
    t0: float = 0.2,
) -> int:
    """RuscaRL's scaffold size: round(K * lambda_i * phi(x)) (docs/DESIGN.md §2).

    lambda_i = (n-1-i)/(n-1) staggers the scaffolding inside a group of n samples (sample 0 gets the most,
    sample n-1 none; lambda = 1 when n = 1); phi(x) = 1/(1+exp(alpha (x - t0))) decays it over training
    progress x in [0, 1]. Rounding is half-up (Python's round() would round 0.5 to even).
    """
    if not 0 <= sample_index < group_size:
        raise ValueError(f"sample_index {sample_index} outside the group of size {group_size}")
    if num_criteria < 0:
        raise ValueError(f"num_criteria must be >= 0, got {num_criteria}")
    lam = 1.0 if group_size == 1 else (group_size - 1 - sample_index) / (group_size - 1)
    value = num_criteria * lam * _sigmoid_decay(progress, alpha, t0)
    return min(num_criteria, int(math.floor(value + 0.5)))


def render_scaffold(criteria: Sequence[Criterion]) -> str:
    """The RuscaRL system text: one line per criterion with its points; negative ones as things to avoid."""
    lines = ["When answering, your response will be evaluated against these criteria:"]
    for c in criteria:
        points = f"{c.weight:+g}"
        text = _clean(c.text)
        lines.append(f"- [{points}] {'Avoid: ' + text if c.is_negative else text}")
    return "\n".join(lines)


def build_ruscarl_prompt(
    messages: Conversation, criteria: Sequence[Criterion], rng: random.Random, num: int | None = None
) -> list[dict]:
    """RuscaRL scaffold: a system message listing ``num`` criteria drawn at random (with ``rng``) from
    ``criteria`` (``None`` = all of them, in an rng-shuffled order). An existing leading system message is
    kept and the scaffold is appended to it after a blank line; otherwise a system message is inserted
    first. With nothing to list (num == 0) the conversation is returned unchanged (as a copy).
    The response is later trained under the ORIGINAL prompt as plain GRPO.
    """
    out = _copy_conversation(messages)
    k = len(criteria) if num is None else num
    if not 0 <= k <= len(criteria):
        raise ValueError(f"build_ruscarl_prompt: num={num} outside [0, {len(criteria)}]")
    if k == 0:
        return out
    chosen = rng.sample(list(criteria), k)
    text = render_scaffold(chosen)
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{text}"
    else:
        out.insert(0, {"role": "system", "content": text})
    return out
