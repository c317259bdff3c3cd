"""The one method registry: every ``method:`` a recipe may name, what it switches on, its own defaults.

The schema (``rise_nemo.config.schema``) takes its list of methods from here, the RISE-family step builds
its ``MethodSpec`` from here and the trainer picks the step of the method's ``family`` from here.

Families (one step module each, docs/DESIGN.md §7):
  rubric        rubric-judged GRPO family (rise_nemo.orchestration.step): rise, rubric_rl, uniform, coupled,
                ruscarl
  reasoning     verifier-rewarded reasoning family (rise_nemo.orchestration.reasoning_step): ppo (critic + GAE),
                grpo (sparse 0/1 reward, group advantages); RRL and ExpRL join this family
  distillation  on-policy distillation, which runs on NeMo-RL's distillation entry point (opd)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Family = Literal["rubric", "reasoning", "distillation"]


@dataclass(frozen=True)
class Method:
    name: str
    family: Family
    summary: str
    guidance: bool = False  # rubric: privileged rollouts while the schedule is active
    coupled: bool = False  # rubric: privileged rows join the natural GRPO group
    ruscarl: bool = False  # rubric: natural rollouts under RuscaRL scaffolds
    token_weighting: str = "policy_support"  # rubric: guide-loss token weights (eqs. 9-10) or "uniform"
    critic: bool = False  # reasoning: train a value model and use GAE advantages
    # Recipe keys this method sets unless the recipe sets them itself (dotted key -> value).
    defaults: dict[str, Any] = field(default_factory=dict)


# The paper settings of PPO-family reasoning methods (RRL's paper, docs/DESIGN.md §7): token KL 0.001,
# temperature 0.8, top-p 0.9.
_PPO_DEFAULTS = {"grpo.kl_coef": 0.001, "grpo.temperature": 0.8, "grpo.top_p": 0.9}

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("rise", "rubric", "GRPO + decoupled guide loss on retained privileged rollouts (RISE-RL eq. 12)",
           guidance=True),
    Method("rubric_rl", "rubric", "GRPO on rubric rewards, no guidance"),
    Method("coupled", "rubric", "privileged rollouts join the natural GRPO group (ablation)", guidance=True,
           coupled=True),
    Method("uniform", "rubric", "rise with uniform guide-loss token weights (ablation)", guidance=True,
           token_weighting="uniform"),
    Method("ruscarl", "rubric", "RuscaRL: rollouts under rubric scaffolds, trained as GRPO", ruscarl=True),
    Method("opd", "distillation", "on-policy distillation (NeMo-RL's distillation path)"),
    Method("ppo", "reasoning", "PPO with a critic and GAE on a sparse verifier reward", critic=True,
           defaults=dict(_PPO_DEFAULTS)),
    Method("grpo", "reasoning", "GRPO on a sparse 0/1 verifier reward (group advantages)",
           defaults={"grpo.temperature": 0.8, "grpo.top_p": 0.9}),
)}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"config key 'method': unknown method {name!r}; expected one of {sorted(METHODS)}")
    return METHODS[name]
