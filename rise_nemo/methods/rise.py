"""RISE-RL and its baselines on rubric prompts (docs/DESIGN.md §2; the rubric step, rise_nemo.steps.rubric)."""

from rise_nemo.methods.registry import RubricMethod, register_method

register_method(RubricMethod("rise", "GRPO + decoupled guide loss on retained privileged rollouts (RISE-RL eq. 12)",
                             guidance=True))
register_method(RubricMethod("rubric_rl", "GRPO on rubric rewards, no guidance"))
register_method(RubricMethod("coupled", "privileged rollouts join the natural GRPO group (ablation)", guidance=True,
                             coupled=True))
register_method(RubricMethod("uniform", "rise with uniform guide-loss token weights (ablation)", guidance=True,
                             token_weighting="uniform"))
register_method(RubricMethod("ruscarl", "RuscaRL: rollouts under rubric scaffolds, trained as GRPO", ruscarl=True))
