"""Eq. 6 privileged prompt and the RuscaRL scaffold."""

import json
import random

import pytest

from rise_nemo.core.prompts import (
    GUIDANCE_TEMPLATES,
    build_privileged_prompt,
    build_ruscarl_prompt,
    format_hint,
    ruscarl_num_scaffold,
)
from rise_nemo.core.rubric import Criterion

CRITERIA = [
    Criterion("Advises consulting an obstetric provider before travel.", 10),
    Criterion("Recommends antibiotics {for} a viral cold.", -6),
    Criterion("Mentions hydration", 4),
]
CONVO = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "I am 35 weeks pregnant."},
    {"role": "assistant", "content": "How can I help?"},
    {"role": "user", "content": "Can I drive 4 hours to the mountains?"},
]


def test_templates_are_five_with_one_hint():
    assert len(GUIDANCE_TEMPLATES) == 5 and len(set(GUIDANCE_TEMPLATES)) == 5
    assert all(t.count("{hint}") == 1 for t in GUIDANCE_TEMPLATES)


def test_format_hint_semicolons_and_negative_as_avoid():
    hint = format_hint(CRITERIA)
    assert hint == (
        "Advises consulting an obstetric provider before travel; "
        "avoid the following: recommends antibiotics {for} a viral cold; Mentions hydration"
    )
    with pytest.raises(ValueError, match="no criteria"):
        format_hint([])


def test_privileged_prompt_appends_to_final_user_message_only():
    original = json.loads(json.dumps(CONVO))
    out = build_privileged_prompt(CONVO, CRITERIA, random.Random(0))
    assert CONVO == original  # input untouched
    assert out[:-1] == CONVO[:-1]
    assert out[-1]["role"] == "user"
    prefix = CONVO[-1]["content"] + "\n\n"
    assert out[-1]["content"].startswith(prefix)
    suffix = out[-1]["content"][len(prefix) :]
    hint = format_hint(CRITERIA)
    assert suffix in [t.replace("{hint}", hint) for t in GUIDANCE_TEMPLATES]


def test_template_choice_follows_rng():
    picks = set()
    for seed in range(40):
        a = build_privileged_prompt(CONVO, CRITERIA[:1], random.Random(seed))
        b = build_privileged_prompt(CONVO, CRITERIA[:1], random.Random(seed))
        assert a == b  # same seed, same template
        picks.add(a[-1]["content"])
    assert len(picks) == 5  # all five templates are used


def test_privileged_prompt_requires_final_user_message():
    with pytest.raises(ValueError, match="last message must be the user's.*assistant"):
        build_privileged_prompt(CONVO[:3], CRITERIA, random.Random(0))
    with pytest.raises(ValueError, match="empty conversation"):
        build_privileged_prompt([], CRITERIA, random.Random(0))


def test_ruscarl_num_scaffold_formula():
    # x = t0: phi = 1/2; sample 0 of 5 (lambda 1): round(10 * 0.5) = 5; sample 2 (lambda 0.5): round(2.5) = 3
    assert ruscarl_num_scaffold(10, 0, 5, 0.2) == 5
    assert ruscarl_num_scaffold(10, 2, 5, 0.2) == 3
    assert ruscarl_num_scaffold(10, 4, 5, 0.0) == 0  # last sample never scaffolded
    assert ruscarl_num_scaffold(10, 0, 5, 0.0) == 10  # phi(0) = 1/(1+e^-25) ~ 1
    assert ruscarl_num_scaffold(10, 0, 5, 1.0) == 0  # decayed away
    assert ruscarl_num_scaffold(7, 0, 1, 0.0) == 7  # group of one
    with pytest.raises(ValueError, match="outside the group"):
        ruscarl_num_scaffold(5, 5, 5, 0.1)


def test_ruscarl_prompt_system_message():
    rng = random.Random(1)
    out = build_ruscarl_prompt(CONVO[1:], CRITERIA, rng, num=2)
    assert out[0]["role"] == "system" and out[1:] == CONVO[1:]
    lines = out[0]["content"].splitlines()[1:]
    assert len(lines) == 2
    assert all(any(c.text.rstrip(".") in line for c in CRITERIA) for line in lines)
    # existing system message is kept and extended
    out2 = build_ruscarl_prompt(CONVO, CRITERIA, random.Random(1), num=None)
    assert out2[0]["content"].startswith("You are helpful.\n\n") and len(out2) == len(CONVO)
    assert "[-6] Avoid: Recommends antibiotics" in out2[0]["content"]
    assert build_ruscarl_prompt(CONVO, CRITERIA, rng, num=0) == CONVO
    with pytest.raises(ValueError, match="outside"):
        build_ruscarl_prompt(CONVO, CRITERIA, rng, num=4)
