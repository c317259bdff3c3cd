"""The one set of policy-loss defaults and range rules (no torch import, so the config schema can use it).

``core.losses.ObjectiveConfig`` takes its defaults and its validation from here, and so does the recipe
schema (``policy_loss.clip_low`` ... ``rise.a_max``), so a bad value is rejected when the recipe is loaded, with
the same rule the loss applies. Defaults are the RISE-RL paper's (docs/DESIGN.md §2): clip 0.2 / 0.28, KL 0,
entropy 0, gamma 0.1, lambda_guide 0.05 (writing/chat; 0.01 for health/science), a_max 1.0.
"""

from __future__ import annotations

LOSS_DEFAULTS: dict[str, float] = {
    "clip_low": 0.2,
    "clip_high": 0.28,
    "kl_coef": 0.0,
    "entropy_coef": 0.0,
    "lambda_guide": 0.05,
    "gamma": 0.1,
    "a_max": 1.0,
}

# field -> (predicate, what it must be)
LOSS_RULES: dict[str, tuple] = {
    "clip_low": (lambda v: v >= 0, ">= 0"),
    "clip_high": (lambda v: v >= 0, ">= 0"),
    "kl_coef": (lambda v: v >= 0, ">= 0"),
    "entropy_coef": (lambda v: v >= 0, ">= 0"),
    "lambda_guide": (lambda v: v >= 0, ">= 0"),
    "gamma": (lambda v: v > 0, "> 0 (rho = p/(p+gamma))"),
    "a_max": (lambda v: v >= 0, ">= 0"),
}


def loss_rule_violations(values: dict[str, float]) -> list[tuple[str, str]]:
    """[(field, message)] for every value in ``values`` that breaks its rule."""
    out = []
    for key, value in values.items():
        rule = LOSS_RULES.get(key)
        if rule is not None and not rule[0](value):
            out.append((key, f"must be {rule[1]}, got {value!r}"))
    return out
