"""On-policy self-distillation, ExpRL's baseline (docs/DESIGN.md §8): the policy with the reference in its
context is the teacher on the student's own samples (implemented in rise_nemo.steps.exprl)."""

from rise_nemo.methods.exprl import EXPRL_DEFAULTS
from rise_nemo.methods.registry import REASONING, ReasoningMethod, register_method

REASONING.advantages.declare("self_distillation", "log pi(y_t | x, reference, y_<t) - log pi(y_t | x, y_<t) per "
                             "token (the reverse-KL reward)")

register_method(ReasoningMethod("self_distillation", "on-policy self-distillation: the policy with the reference in "
                                "context is the teacher on the student's own samples", advantage="self_distillation",
                                defaults=dict(EXPRL_DEFAULTS)))
