"""Sparse GRPO: group advantages (eq. 1) on the verifier's 0/1 reward (docs/DESIGN.md §7)."""

from rise_nemo.methods.registry import ReasoningMethod, register_method

register_method(ReasoningMethod("grpo", "GRPO on a sparse 0/1 verifier reward (group advantages)",
                                defaults={"sampling.temperature": 0.8, "sampling.top_p": 0.9}))
