"""On-policy distillation: NeMo-RL's own distillation loop (rise_nemo.backends.nemo.distill), not a step here."""

from rise_nemo.methods.registry import ExternalMethod, register_method

register_method(ExternalMethod("opd", "on-policy distillation (NeMo-RL's distillation path)",
                               elsewhere="'opd' (on-policy distillation) runs on NeMo-RL's distillation path: "
                                         "`rise-nemo distill --config RECIPE`"))
