"""The ``nemo`` backend: rise_nemo's Policy and Generator on NVIDIA NeMo-RL (Megatron policy, vLLM rollouts).

Coded against NeMo-RL tag v0.7.0, commit 81aa43dda4765b0429cf31dab44441e4e4383911 (GitHub NVIDIA-NeMo/RL,
2026-07-29): ``nemo_rl.algorithms.grpo.setup`` / ``refit_policy_generation``, ``Policy.get_logprobs`` /
``get_reference_policy_logprobs`` / ``train(data, loss_fn, gbs=, mbs=)`` / ``save_checkpoint``,
``VllmGeneration.generate`` (``GenerationOutputSpec``), ``LossFunction`` (called as
``loss_fn(data=, global_valid_seqs=, global_valid_toks=, next_token_logprobs=)``), ``EnvironmentInterface``
with ``register_env`` + ``ACTOR_ENVIRONMENT_REGISTRY``, and ``nemo_rl.algorithms.distillation``.

Modules (NeMo-RL is imported lazily, inside functions, except in ``env_actor``):
  config       the recipe's ``nemo:`` block: validation and NeMo-RL's master config
  batch        driver-side batch plumbing on plain tensors (counts, padding, generation I/O)
  loss         ``RiseLossFunction``: the core objective as a NeMo-RL LossFunction (picklable)
  runtime      ``NemoPolicy`` / ``NemoGenerator`` / ``NemoSession`` on NeMo-RL's objects
  streaming    streamed generation on NeMo-RL's async vLLM engine; ``seeding`` / ``vllm_seeds`` its request seeds
  critic       ``NemoCritic`` (interfaces.Critic) on NeMo-RL's ``Value``; ``ValueLossFunction``
  environment  rubric scoring for NeMo-RL's rollout loops; ``env_actor`` its Ray actor
  distill      the on-policy distillation baseline on NeMo-RL's distillation path
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rise_nemo.backends.nemo.config import (
    NEMO_DISTILLATION,
    NemoConfigError,
    algorithm,
    build_master_config,
    uses_async_engine,
    validate_nemo_block,
)
from rise_nemo.recipe_keys import get

NEMO_RL_COMMIT = "81aa43dda4765b0429cf31dab44441e4e4383911"  # tag v0.7.0
log = logging.getLogger("rise_nemo.backends.nemo")


def plain_recipe(cfg: Any) -> dict[str, Any]:
    """A validated recipe (OmegaConf DictConfig or dict) as plain, resolved dicts."""
    if isinstance(cfg, Mapping) and not hasattr(cfg, "_metadata"):
        return dict(cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def run_dir_of(recipe: Mapping[str, Any]) -> str:
    run = recipe.get("run") or {}
    return str(run.get("dir") or Path("runs") / str(run.get("name", "run")))


def check_recipe(recipe: Mapping[str, Any]) -> None:
    """Everything that can be checked without NeMo-RL: the block itself and `rise-nemo plan`'s checks, at the
    size the run actually has (``nemo.cluster.num_nodes``, which a Slurm launcher sets to its allocation)."""
    from rise_nemo.planner import format_report, plan_recipe
    from rise_nemo.planner.layout import nodes_from_cluster

    validate_nemo_block(recipe)
    report = plan_recipe(recipe, nodes=nodes_from_cluster(recipe))
    if not report.ok:
        raise NemoConfigError("recipe cannot run as laid out:\n" + format_report(report))


def encode_chat(tokenizer: Any, messages: list[dict], chat_template_kwargs: Mapping[str, Any]) -> list[int]:
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True,
                                         **dict(chat_template_kwargs))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def nemo_dataset(prompts, encode, min_size: int) -> list[dict[str, Any]]:
    """NeMo-RL datums for grpo.setup()'s dataloader (drop_last batches of prompts_per_step): repeated up to
    one full batch so a small prompt set still gives NeMo-RL a non-empty epoch."""
    from rise_nemo.backends.nemo.environment import prompt_datum

    if not prompts:
        raise NemoConfigError("recipe key data.train_path: no training prompts")
    datums = [prompt_datum(p, encode, i) for i, p in enumerate(prompts)]
    while len(datums) < min_size:
        datums += datums[: min_size - len(datums)]
    return datums


MEGATRON_COMMON = ("iter_0000000", "common.pt")  # Megatron-Bridge's first-iteration common state file


def resume_paths(policy_dir: Path) -> tuple[str, str | None]:
    """(weights_path, optimizer_path) for building a NeMo-RL Policy from ``<checkpoint>/policy``.

    NeMo-RL's own rule (``CheckpointManager.get_resume_paths``, nemo_rl/utils/checkpoint.py:150-193):
    a DTensor checkpoint has a separate ``optimizer`` directory; a Megatron checkpoint embeds optimizer and
    LR-scheduler state in ``weights/iter_0000000/common.pt`` (the worker's save_checkpoint writes it there,
    megatron_policy_worker.py:1666-1724), and ``optimizer_path`` is then only the flag that turns on
    ``load_optim`` (models/megatron/setup.py:918). Passing None there restarts Adam and the LR schedule.
    """
    weights, optimizer = policy_dir / "weights", policy_dir / "optimizer"
    if optimizer.exists():
        return str(weights), str(optimizer)
    common = weights.joinpath(*MEGATRON_COMMON)
    if common.exists():
        import torch

        if "optimizer" in torch.load(common, map_location="cpu"):  # the same load NeMo-RL does
            return str(weights), str(optimizer)
    log.warning("resuming from %s without optimizer state (none saved): Adam and the LR schedule restart", weights)
    return str(weights), None


def _policy_with_resume(policy_cls: Any, resume_dir: Path | None, **kwargs: Any) -> Any:
    """``policy_factory`` for grpo.setup(): NeMo-RL loads weights/optimizer only when the Policy is built,
    so resuming from rise_nemo's own checkpoint (runs/<name>/checkpoints/step_N/policy) happens here."""
    if resume_dir is not None:
        kwargs["weights_path"], kwargs["optimizer_path"] = resume_paths(resume_dir)
    return policy_cls(**kwargs)


def build_reward_model(cfg: Any):
    """NeMo-RL's RewardModelEnvironment for the recipe's ``reward_model:`` block (backends.nemo.reward_model)."""
    from rise_nemo.backends.nemo.reward_model import build_reward_model as build

    return build(cfg)


def build_critic(cfg: Any, policy: Any, *, checkpoint: str | Path | None = None):
    """A ``NemoCritic`` on NeMo-RL's ``Value`` for a recipe with a ``nemo.value`` block (PPO-style methods).

    The value model goes on the policy's training cluster, configured from the policy
    (``rise_nemo.planner.critic.value_config``) plus the block's overrides; NeMo-RL loads weights only when it
    is built, so a resumed run passes its ``checkpoint`` (the value model comes from ``<checkpoint>/critic``)."""
    recipe = plain_recipe(cfg)
    overrides = (recipe.get("nemo") or {}).get("value")
    if overrides is None:
        raise NemoConfigError(f"method {recipe.get('method')!r} trains a value model: the recipe needs a "
                              "nemo.value block (see recipes/ppo_math_7b.yaml)")
    from rise_nemo.backends.nemo.checkpoints import model_dir
    from rise_nemo.backends.nemo.config import check_dtensor_worker
    from rise_nemo.backends.nemo.critic import NemoCritic, build_value, value_config
    from rise_nemo.backends.nemo.placement import check_room, layout_line, placement_errors

    session = policy.session
    config = value_config(session.config["policy"], overrides)
    check_dtensor_worker({"value": config}, blocks=("value",))  # a DTensor critic is NeMo-RL's v2 value worker
    resume = model_dir(checkpoint, "critic")
    layout = layout_line(recipe)
    # the value model is one more colocated worker group on the policy's cluster (placement.colocated_groups)
    check_room(session.train_cluster, session.colocated_groups, "value model", layout)
    with placement_errors(layout):
        value = build_value(session.train_cluster, session.tokenizer, config, resume, policy=session.policy)
    session.colocated_groups += 1
    return NemoCritic(session, value, config, resumed_from=resume)


_WATCHDOG: list[Any] = []  # the placement watchdog of this process (one for every build_* call)


def watch_placement(recipe: Mapping[str, Any]) -> None:
    """From here on (Ray initialised), a Ray actor of this run that waits longer than
    ``nemo.adapter.placement_timeout_s`` for its resources ends the run with one line (placement.PlacementWatchdog)."""
    from rise_nemo.backends.nemo.placement import start_watchdog

    if not _WATCHDOG:
        watchdog = start_watchdog(recipe)
        if watchdog is not None:
            _WATCHDOG.append(watchdog)


def _import_nemo_rl():
    from rise_nemo.backends.nemo.config import put_nemo_rl_on_path

    put_nemo_rl_on_path()
    try:
        from nemo_rl.algorithms import grpo
    except ImportError as exc:
        raise ImportError(
            "backend: nemo needs NeMo-RL (run inside the NeMo-RL container, or set NEMO_RL_DIR to a NeMo-RL "
            f"v0.7.0 checkout with its dependencies installed: {exc}); `rise-nemo plan` checks a recipe without it"
        ) from exc
    return grpo


def build_backend(cfg: Any, *, checkpoint: str | Path | None = None, train_prompts: Sequence[Any] | None = None):
    """``(NemoPolicy, NemoGenerator)`` for a validated recipe with ``backend: nemo`` (needs NeMo-RL).

    ``checkpoint``: the checkpoint directory the caller restores (``rise-nemo train`` resuming: the latest;
    ``rise-nemo eval``: the one asked for; rise_nemo.backends.nemo.checkpoints), None for the initial
    policy. NeMo-RL loads weights and optimizer only when a Policy is created, so the policy is built from
    ``<checkpoint>/policy`` here. ``train_prompts``: the training set, handed to ``grpo.setup()``'s
    dataloader so NeMo-RL's bookkeeping (sizes, logs) is truthful; rise_nemo samples its own prompts.
    A distillation recipe builds its student for evaluation only (``build_student``): its training loop is
    NeMo-RL's (`rise-nemo distill`; `rise-nemo train` refuses the method before building anything)."""
    recipe = plain_recipe(cfg)
    check_recipe(recipe)
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    if algorithm(recipe) == NEMO_DISTILLATION:
        return build_student(recipe, checkpoint)
    grpo = _import_nemo_rl()
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.distributed.virtual_cluster import init_ray
    from nemo_rl.models.generation import configure_generation_config
    from nemo_rl.models.policy.lm_policy import Policy

    from rise_nemo.backends.nemo.checkpoints import policy_dir
    from rise_nemo.backends.nemo.placement import (
        CRITIC_COLOCATED_GROUPS,
        NemoPlacementError,
        colocated_groups,
        has_critic,
        layout_line,
        placement_errors,
    )
    from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoPolicy, NemoSession

    master = grpo.MasterConfig(**build_master_config(recipe, run_dir_of(recipe)))
    init_ray()
    watch_placement(recipe)
    tokenizer = get_tokenizer(master.policy["tokenizer"])
    master.policy["generation"] = configure_generation_config(master.policy["generation"], tokenizer)
    chat_kwargs = master.policy["tokenizer"].get("chat_template_kwargs") or {}
    dataset = nemo_dataset(list(train_prompts or []), partial(encode_chat, tokenizer, chat_template_kwargs=chat_kwargs),
                           int(recipe["sampling"]["prompts_per_step"]))
    resume = policy_dir(checkpoint)
    # A method with a critic gets the cluster NeMo-RL's PPO builds: room for a third colocated group, the value
    # model (rise_nemo.backends.nemo.placement).
    groups = CRITIC_COLOCATED_GROUPS if has_critic(recipe) else None
    layout = layout_line(recipe)
    # seeded_workers: the async engine's workers honour request seeds
    with placement_errors(layout), colocated_groups(grpo, groups), seeded_workers(master.policy["generation"]):
        out = grpo.setup(master, tokenizer, dataset, None, policy_factory=partial(_policy_with_resume, Policy, resume))
    policy, generation, master = out[0], out[1], out[10]
    train_cluster = out[3][0]
    if groups is not None and train_cluster.max_colocated_worker_groups != groups:
        raise NemoPlacementError(f"NeMo-RL's grpo.setup built {train_cluster.name!r} for "
                                 f"{train_cluster.max_colocated_worker_groups} colocated worker group(s), not the "
                                 f"{groups} a critic needs ({layout})")
    # the checkpointing block reaches the DTensor v2 workers' save (Automodel's format keys), as NeMo-RL's own
    # loops pass it (ppo.py:1559-1571, grpo.py): they refuse to save without one
    session = NemoSession(policy, generation, tokenizer, {"policy": master.policy, "checkpointing": master.checkpointing},
                          refit=grpo.refit_policy_generation)
    session.resumed_from = resume
    session.train_cluster = train_cluster
    behaviour = (recipe["nemo"].get("adapter") or {}).get("importance_sampling", "none") == "behaviour_ratio"
    return NemoPolicy(session, behaviour_ratio=behaviour), NemoGenerator(session)


def seeded_workers(generation_config: Mapping[str, Any]):
    """``seeding.seeded_generation_workers()`` for NeMo-RL's async vLLM engine, else nothing to substitute."""
    from contextlib import nullcontext

    if not uses_async_engine(generation_config):
        return nullcontext()
    from rise_nemo.backends.nemo.seeding import seeded_generation_workers

    return seeded_generation_workers()


def build_student(recipe: Mapping[str, Any], checkpoint: Path | None):
    """``(NemoPolicy, NemoGenerator)`` on a distillation recipe's STUDENT, for `rise-nemo eval`.

    What NeMo-RL's distillation.setup builds for the student with colocated vLLM (algorithms/distillation.py:
    300-320 cluster, 503-520 generation, 563-595 policy and refit info), without the teacher, the optimizer or
    the dataloaders: the Megatron student loads ``<checkpoint>/policy/weights`` (NeMo-RL's CheckpointManager
    layout, rise_nemo.backends.nemo.checkpoints), vLLM receives them through NeMo-RL's refit, exactly as in
    training. Weights only: an evaluation never steps the optimizer."""
    if not bool(get(recipe, "nemo.policy.generation.colocated.enabled", True)):
        raise NemoConfigError("recipe key nemo.policy.generation.colocated.enabled: rise-nemo eval of a distillation "
                              "run builds the student with colocated vLLM; set it to true for the evaluation")
    grpo = _import_nemo_rl()
    from nemo_rl.algorithms import distillation
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster, init_ray
    from nemo_rl.models.generation import configure_generation_config
    from nemo_rl.models.generation.vllm import VllmGeneration
    from nemo_rl.models.policy.lm_policy import Policy

    from rise_nemo.backends.nemo.checkpoints import policy_dir
    from rise_nemo.backends.nemo.placement import layout_line, placement_errors
    from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoPolicy, NemoSession

    if checkpoint is not None and policy_dir(checkpoint) is None:
        raise NemoConfigError(f"{checkpoint}: no policy/weights in this NeMo-RL checkpoint")
    master = distillation.MasterConfig(**build_master_config(recipe, run_dir_of(recipe)))
    init_ray()
    watch_placement(recipe)
    policy_config, cluster_config = master.policy, master.cluster
    tokenizer = get_tokenizer(policy_config["tokenizer"])
    generation_config = configure_generation_config(policy_config["generation"], tokenizer)
    generation_config["model_name"] = policy_config["model_name"]  # vLLM loads the architecture from it
    if "vllm_cfg" in generation_config:  # vLLM's HF overrides match the training policy's
        generation_config.setdefault("vllm_kwargs", {})["hf_overrides"] = policy_config.get("hf_config_overrides", {})
    policy_config["generation"] = generation_config
    if (policy_config.get("megatron_cfg") or {}).get("enabled"):
        # Megatron sizes its (unused) scheduler from train_iters, which distillation.setup sets the same way.
        policy_config["megatron_cfg"]["train_iters"] = int(master.distillation["max_num_steps"])
    nodes, gpus = int(cluster_config["num_nodes"]), int(cluster_config["gpus_per_node"])
    resume = policy_dir(checkpoint)
    with placement_errors(layout_line(recipe)):
        cluster = RayVirtualCluster(
            name="rise_eval_student_cluster", bundle_ct_per_node_list=[gpus] * nodes, use_gpus=True,
            num_gpus_per_node=gpus, max_colocated_worker_groups=3,
            port_range_low=cluster_config.get("master_port_range_low"),
            port_range_high=cluster_config.get("master_port_range_high"),
        )
        with seeded_workers(generation_config):
            generation = VllmGeneration(cluster=cluster, config=generation_config)
        generation.finish_generation()
        policy = Policy(name_prefix="student", cluster=cluster, config=policy_config, tokenizer=tokenizer,
                        weights_path=str(resume / "weights") if resume is not None else None, optimizer_path=None,
                        init_optimizer=False, init_reference_model=False)
    generation.prepare_refit_info(policy.prepare_refit_info())
    session = NemoSession(policy, generation, tokenizer, {"policy": policy_config}, refit=grpo.refit_policy_generation)
    session.resumed_from = resume
    return NemoPolicy(session, behaviour_ratio=False), NemoGenerator(session)


def register_rubric_environment(name: str = "rubric") -> str:
    """Make the rubric judge available to NeMo-RL's own loops as environment ``name`` (needs NeMo-RL)."""
    from rise_nemo.backends.nemo.env_actor import register

    return register(name)


__all__ = ["NEMO_RL_COMMIT", "NemoConfigError", "build_backend", "build_critic", "build_student", "check_recipe",
           "register_rubric_environment"]
