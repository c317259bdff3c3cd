"""Supervised fine-tuning on the reference solutions, ExpRL's baseline (docs/DESIGN.md §8; rise_nemo.steps.sft)."""

from rise_nemo.methods.registry import SFTMethod, register_method

register_method(SFTMethod("sft", "supervised fine-tuning on the reference solutions (no sampling)"))
