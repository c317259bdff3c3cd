"""ExpRL's Stage I (docs/DESIGN.md §2c, §8): a reference judge scores rollouts against the hidden reference
solution, as a whole (outcome, then group advantages) or per segment (process, per-token segment advantages).
Implemented in rise_nemo.steps.exprl."""

from rise_nemo.methods.registry import REASONING, ReasoningMethod, register_method

# ExpRL's Stage I scripts (docs/DESIGN.md §2c, §8): k3 KL loss 0.001, temperature 0.8, asymmetric clip
# 0.2 / 0.28 (outcome) and 0.2 / 0.26 (process).
EXPRL_DEFAULTS = {"policy_loss.kl_coef": 0.001, "sampling.temperature": 0.8, "sampling.top_p": 1.0,
                  "policy_loss.clip_low": 0.2, "policy_loss.clip_high": 0.28}

REASONING.scorers.declare("reference_outcome", "the reference judge's normalised 1-5 score of the whole rollout",
                          judge="reference")
REASONING.scorers.declare("reference_process", "the reference judge's per-segment scores and segment token "
                          "advantages", judge="reference", token_advantages=True)
REASONING.advantages.declare("segment", "the scorer's per-token segment advantages, no group normalisation",
                             token_advantages=True)

register_method(ReasoningMethod("exprl_outcome", "ExpRL-Outcome: GRPO on a reference judge's normalised 1-5 score",
                                scorer="reference_outcome", defaults=dict(EXPRL_DEFAULTS)))
register_method(ReasoningMethod("exprl_process", "ExpRL-Process: per-segment reference scores, A_1 = s_1 - s_T, "
                                "A_t = s_t - s_(t-1) per token, no group normalisation", scorer="reference_process",
                                advantage="segment", defaults={**EXPRL_DEFAULTS, "policy_loss.clip_high": 0.26}))
