"""Every key under a recipe's ``nemo:`` is READ by a NeMo-RL component the nemo backend constructs, DERIVED from a
rise_nemo key (``DERIVED_KEYS``), or REFUSED with one line naming it. A key NeMo-RL accepts but nothing on
our path reads would otherwise change nothing silently (``nemo.loss_fn.ratio_clip_max`` next to
``policy_loss.clip_high``, which is what trains).

``RULES`` classifies NeMo-RL's whole ``MasterConfig`` tree by prefix, per entry point: ``grpo`` (rise_nemo's own
loop on NeMo-RL's ``grpo.setup``, its Policy, vLLM and the critic's Value; NeMo-RL's ``grpo_train``, its loss,
data, environments and logger are never used) and ``distillation`` (NeMo-RL's own ``distillation_train``).
``tests/nemo`` walks NeMo-RL's MasterConfig classes and checks that every key they define has a rule here.
No NeMo-RL import.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

READ, DERIVED, REFUSED = "read", "derived", "refused"

# NeMo-RL's entry points (``nemo.algorithm``): its GRPO loop (every RL method here) or its distillation loop (opd).
NEMO_GRPO, NEMO_DISTILLATION = "grpo", "distillation"
ALGORITHMS = (NEMO_GRPO, NEMO_DISTILLATION)

# NeMo-RL key (under nemo:) -> the rise_nemo key it is derived from.
DERIVED_KEYS: dict[str, str] = {
    "policy.generation.temperature": "sampling.temperature",
    "policy.generation.top_p": "sampling.top_p",
    "policy.generation.max_new_tokens": "sampling.max_new_tokens",
    "grpo.num_prompts_per_step": "sampling.prompts_per_step",
    "grpo.num_generations_per_prompt": "sampling.group_size",
    "grpo.seed": "run.seed",
    "grpo.max_num_steps": "train.steps",
    "grpo.max_num_epochs": "train.steps",
    # evaluation is rise_nemo's (the eval: block); NeMo-RL's validation loop never runs (grpo.setup gets no
    # validation set and asserts when any of these is on)
    "grpo.val_period": "eval.every",
    "grpo.val_at_start": "eval.at_start",
    "grpo.val_at_end": "eval.every",
    "loss_fn.reference_policy_kl_penalty": "policy_loss.kl_coef",
    "grpo.skip_reference_policy_logprobs_calculation": "policy_loss.kl_coef",
    "checkpointing.enabled": "train.checkpoint_every",
    "checkpointing.save_period": "train.checkpoint_every",
    "checkpointing.keep_top_k": "train.keep_checkpoints",
    "checkpointing.metric_name": "train.keep_checkpoints",
    # distillation (NeMo-RL's own loop): it stops on whichever of its step and epoch limits comes first
    # (distillation.py:717) and sizes the LR schedule from the smaller (train_iters, :571-576)
    "distillation.max_num_steps": "train.steps",
    "distillation.max_num_epochs": "train.steps",
    "distillation.seed": "run.seed",
    # where NeMo-RL writes its logs and checkpoints: inside the run directory
    "logger.log_dir": "run.dir",
    "checkpointing.checkpoint_dir": "run.dir",
}
# Derived on rise_nemo's own loop (nemo.algorithm: grpo) only. grpo.setup builds NeMo-RL's ClippedPGLossFn and
# Logger although the loop uses neither; they are written from ours so that nothing NeMo-RL prints or asserts
# contradicts what trains (its FP8 check reads use_importance_sampling_correction, grpo.py:986-989), and so that
# an unfed Logger opens no W&B / MLflow run and starts no GPU monitor. On distillation NeMo-RL's loss and Logger
# are the real ones: their keys are read there (rise_nemo.backends.nemo.keys).
_OWN_LOGGING = "train.tensorboard / train.wandb (rise_nemo logs each step; NeMo-RL's Logger stays off)"
DERIVED_GRPO: dict[str, str] = {
    "loss_fn.ratio_clip_min": "policy_loss.clip_low",
    "loss_fn.ratio_clip_max": "policy_loss.clip_high",
    "loss_fn.use_importance_sampling_correction": "nemo.adapter.importance_sampling",
    "logger.wandb_enabled": _OWN_LOGGING,
    "logger.tensorboard_enabled": _OWN_LOGGING,
    "logger.mlflow_enabled": _OWN_LOGGING,
    "logger.swanlab_enabled": _OWN_LOGGING,
    "logger.monitor_gpus": _OWN_LOGGING,
}


def derived_keys(algo: str) -> dict[str, str]:
    """NeMo-RL key -> the rise_nemo key it is derived from, on entry point ``algo``."""
    return {**DERIVED_KEYS, **DERIVED_GRPO} if algo == NEMO_GRPO else dict(DERIVED_KEYS)


@dataclass(frozen=True)
class KeyRule:
    prefix: str  # a dotted NeMo-RL key, or the subtree under it
    kind: str  # READ | REFUSED (DERIVED keys come from DERIVED_KEYS)
    why: str  # READ: the component that reads it; REFUSED: the one-line reason, naming what to set instead


_LOOP = "rise_nemo's loop runs the method's own step, not NeMo-RL's grpo_train, the only reader of this key"
_AUTOMODEL_SAVE = ("the DTensor v2 workers' checkpoint save, from the checkpointing block rise_nemo passes with "
                   "each save (nemo_rl/models/automodel/checkpoint.py:285-296)")
_LOGGER = ("on backend nemo the loop logs metrics.jsonl itself and TensorBoard / W&B through train.tensorboard / "
           "train.wandb; NeMo-RL's Logger is not fed by it (its GPU monitor neither)")

RULES: dict[str, tuple[KeyRule, ...]] = {
    "grpo": (
        KeyRule("policy", READ, "NeMo-RL's Policy and VllmGeneration, built by grpo.setup"),
        KeyRule("cluster", READ, "grpo.setup's RayVirtualCluster"),
        KeyRule("value", READ, "NeMo-RL's Value (the critic), through rise_nemo.planner.critic.value_config"),
        KeyRule("checkpointing", REFUSED, "rise_nemo writes <run dir>/checkpoints itself; set train.checkpoint_every "
                "/ train.keep_checkpoints (NeMo-RL's CheckpointManager stays off)"),
        KeyRule("checkpointing.pretrained_checkpoint", READ, "grpo.setup, which hands it to the Policy "
                "(grpo.py:299-301)"),
        *(KeyRule(f"checkpointing.{k}", READ, _AUTOMODEL_SAVE) for k in (
            "model_save_format", "save_consolidated", "is_peft", "peft_config", "model_cache_dir", "model_repo_id",
            "is_async")),
        KeyRule("loss_fn", REFUSED, "the loss on backend nemo is rise_nemo's (policy_loss:); NeMo-RL's "
                "ClippedPGLossFn, which grpo.setup builds, is never called"),
        KeyRule("grpo", REFUSED, _LOOP),
        KeyRule("data", REFUSED, "prompts come from the recipe's data: block"),
        KeyRule("env", REFUSED, "rewards come from the recipe's judge: / reward: blocks"),
        KeyRule("logger", REFUSED, _LOGGER),
        KeyRule("data_plane", REFUSED, "NeMo-RL's data plane serves its own grpo_train loop only"),
        KeyRule("on_policy_distillation", REFUSED, "on-policy distillation runs through `rise-nemo distill` "
                "(nemo.algorithm: distillation)"),
        KeyRule("teacher", REFUSED, "only a distillation recipe (nemo.algorithm: distillation) has a teacher"),
    ),
    "distillation": (
        KeyRule("policy", READ, "the student's Policy and VllmGeneration, built by distillation.setup"),
        KeyRule("teacher", READ, "the teacher's Policy, built by distillation.setup"),
        KeyRule("cluster", READ, "distillation.setup's RayVirtualCluster"),
        KeyRule("loss_fn", READ, "NeMo-RL's DistillationLossFn"),
        KeyRule("distillation", READ, "NeMo-RL's distillation_train"),
        KeyRule("logger", READ, "NeMo-RL's Logger, fed by distillation_train"),
        KeyRule("checkpointing", READ, "NeMo-RL's CheckpointManager, driven by distillation_train"),
        KeyRule("data", REFUSED, "prompts come from the recipe's data: block"),
        KeyRule("env", REFUSED, "the reward is the recipe's judge: block (the rubric environment)"),
        KeyRule("value", REFUSED, "distillation trains no value model"),
        KeyRule("grpo", REFUSED, "a distillation recipe runs NeMo-RL's distillation loop, not GRPO"),
        KeyRule("data_plane", REFUSED, "NeMo-RL's data plane serves its GRPO loop only"),
        KeyRule("on_policy_distillation", REFUSED, "NeMo-RL's GRPO-side distillation is not this entry point"),
    ),
}
UNKNOWN = KeyRule("", REFUSED, "not a key of NeMo-RL's config that the nemo backend uses")


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".")


def classify(algorithm: str, key: str) -> KeyRule:
    """The rule for a dotted NeMo-RL key (relative to ``nemo:``): DERIVED when rise_nemo writes it, else the most
    specific rule of ``RULES[algorithm]``, else ``UNKNOWN``."""
    for derived, ours in derived_keys(algorithm).items():
        if _under(key, derived):
            return KeyRule(derived, DERIVED, ours)
    matches = [r for r in RULES[algorithm] if _under(key, r.prefix)]
    return max(matches, key=lambda r: len(r.prefix)) if matches else UNKNOWN


def leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of a nested mapping's leaves (a list or a scalar is a leaf; an empty mapping is one too)."""
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            yield from leaves(v, path + ".")
        else:
            yield path


def refusal(algorithm: str, key: str, has_critic: bool = False) -> str | None:
    """The one-line refusal of recipe key ``nemo.<key>``, or None when it is read (or is ours)."""
    rule = classify(algorithm, key)
    if rule.kind == DERIVED:
        return f"recipe key nemo.{key} is set from {rule.why}; set it there, not under nemo:"
    if rule.prefix == "value" and not has_critic and algorithm == NEMO_GRPO:
        return "recipe key nemo.value: only a method with a critic (ppo, rrl) trains a value model"
    if rule.kind == REFUSED:
        return f"recipe key nemo.{key} is not used on backend nemo: {rule.why}"
    return None


__all__ = ["DERIVED", "READ", "REFUSED", "RULES", "KeyRule", "classify", "leaves", "refusal"]
