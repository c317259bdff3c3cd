"""The one method registry: every ``method:`` a recipe may name, what it switches on, its own defaults.

The schema (``rise_nemo.config.schema``) takes its list of methods from here, the RISE-family step builds
its ``MethodSpec`` from here and the trainer picks the step of the method's ``family`` from here.

Families (one step module each, docs/DESIGN.md §7):
  rubric        rubric-judged GRPO family (rise_nemo.orchestration.step): rise, rubric_rl, uniform, coupled,
                ruscarl
  reasoning     verifier-rewarded reasoning family (rise_nemo.orchestration.reasoning_step): ppo (critic + GAE),
                grpo (sparse 0/1 reward, group advantages); ExpRL's Stage I methods exprl_outcome / exprl_process
                and its baselines sft / self_distillation (docs/DESIGN.md §8); rrl (PPO + retrospective replay of
                value-selected states, rise_nemo.orchestration.rrl, docs/DESIGN.md §9)
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
    # reasoning: what scores a rollout (rise_nemo.orchestration.exprl): verifier (0/1), reference_outcome /
    # reference_process (ExpRL's reference judge), self_distillation (reference-in-context teacher), sft
    reward: str = "verifier"
    # Recipe keys this method sets unless the recipe sets them itself (dotted key -> value).
    defaults: dict[str, Any] = field(default_factory=dict)


# The paper settings of PPO-family reasoning methods (RRL's paper, docs/DESIGN.md §7): token KL 0.001,
# temperature 0.8, top-p 0.9.
_PPO_DEFAULTS = {"grpo.kl_coef": 0.001, "grpo.temperature": 0.8, "grpo.top_p": 0.9}

# ExpRL's Stage I scripts (docs/DESIGN.md §2c, §8): k3 KL loss 0.001, temperature 0.8, asymmetric clip
# 0.2 / 0.28 (outcome) and 0.2 / 0.26 (process).
_EXPRL_DEFAULTS = {"grpo.kl_coef": 0.001, "grpo.temperature": 0.8, "grpo.top_p": 1.0, "grpo.clip_low": 0.2,
                   "grpo.clip_high": 0.28}

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
    Method("rrl", "reasoning", "RRL: PPO whose rollouts may continue value-selected states from a per-problem "
           "replay buffer (Algorithm 1; state tokens masked, eq. 3)", critic=True, defaults=dict(_PPO_DEFAULTS)),
    Method("grpo", "reasoning", "GRPO on a sparse 0/1 verifier reward (group advantages)",
           defaults={"grpo.temperature": 0.8, "grpo.top_p": 0.9}),
    Method("exprl_outcome", "reasoning", "ExpRL-Outcome: GRPO on a reference judge's normalised 1-5 score",
           reward="reference_outcome", defaults=dict(_EXPRL_DEFAULTS)),
    Method("exprl_process", "reasoning", "ExpRL-Process: per-segment reference scores, A_1 = s_1 - s_T, "
           "A_t = s_t - s_(t-1) per token, no group normalisation", reward="reference_process",
           defaults={**_EXPRL_DEFAULTS, "grpo.clip_high": 0.26}),
    Method("self_distillation", "reasoning", "on-policy self-distillation: the policy with the reference in "
           "context is the teacher on the student's own samples", reward="self_distillation",
           defaults=dict(_EXPRL_DEFAULTS)),
    Method("sft", "reasoning", "supervised fine-tuning on the reference solutions (no sampling)", reward="sft"),
)}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"config key 'method': unknown method {name!r}; expected one of {sorted(METHODS)}")
    return METHODS[name]
