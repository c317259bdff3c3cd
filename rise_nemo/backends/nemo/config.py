"""The recipe's ``nemo:`` block: validation, and the NeMo-RL master config built from it.

The block is NeMo-RL's own config tree (``policy``, ``cluster``, ``loss_fn``, ``grpo`` / ``distillation``,
``teacher``, ``logger``, ``checkpointing``, ...) plus three keys of ours, removed before NeMo-RL sees it:

- ``base``: a NeMo-RL example config (a path, or a name under ``$NEMO_RL_DIR/examples/configs``) that
  supplies every key the recipe does not set;
- ``adapter``: ``importance_sampling`` (``none`` | ``behaviour_ratio``), ``nemo_rl_dir``;
- ``plan``: node count and judge placement for ``rise-nemo plan``;
- ``algorithm``: ``grpo`` (the rise_nemo loop on NeMo-RL's pieces, default) or ``distillation``.

``value`` (NeMo-RL's own key for PPO's value model) holds only what differs from the policy: the critic's
full ``ValueConfig`` is derived from the policy block by ``rise_nemo.planner.critic.value_config`` (same
model, layout, batch shape).

Settings that live in rise_nemo's own blocks are written into the NeMo-RL tree here and must not be
repeated under ``nemo:`` (two places for one value drift apart): see ``keys.DERIVED_KEYS``.
No NeMo-RL import: ``validate_nemo_block`` runs in CPU tests and in ``rise-nemo plan``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rise_nemo.backends.nemo.keys import ALGORITHMS, NEMO_DISTILLATION, NEMO_GRPO
from rise_nemo.errors import UserError
from rise_nemo.recipe_keys import RecipeKeyError, get

OUR_KEYS = ("base", "adapter", "plan", "algorithm")
IS_MODES = ("none", "behaviour_ratio")
DEFAULT_NEMO_RL_DIR = "/opt/nemo-rl"  # where the NeMo-RL container keeps its checkout



class NemoConfigError(UserError):
    """A bad ``nemo:`` block; the message names the dotted recipe key. A UserError (a ValueError): the commands report
    it in one line with exit code 2, also when it is found as the master config is built, after the early checks."""


def _has(tree: Mapping[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _set(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def uses_async_engine(generation: Mapping[str, Any] | None) -> bool:
    """Whether a ``policy.generation`` block (the recipe's, or the merged master config's) runs NeMo-RL's async vLLM
    engine (``vllm_cfg.async_engine``): the engine that streams samples and takes a seed per request."""
    vllm_cfg = generation.get("vllm_cfg") if isinstance(generation, Mapping) else None
    return isinstance(vllm_cfg, Mapping) and bool(vllm_cfg.get("async_engine", False))


def algorithm(recipe: Mapping[str, Any]) -> str:
    return str(get(recipe, "nemo.algorithm", NEMO_GRPO))


def validate_nemo_block(recipe: Mapping[str, Any]) -> None:
    """Checks that need no NeMo-RL: our keys, derived keys not duplicated, features the backend lacks.

    The parallel layout and memory are checked by ``rise_nemo.planner.plan_recipe`` (called by build_backend()).
    """
    nemo = recipe.get("nemo")
    if not isinstance(nemo, Mapping) or not nemo:
        raise NemoConfigError("recipe key nemo: missing or empty; backend: nemo needs NeMo-RL's config tree there")
    algo = algorithm(recipe)
    if algo not in ALGORITHMS:
        raise NemoConfigError(f"recipe key nemo.algorithm: {algo!r} is not one of {ALGORITHMS}")
    if not isinstance(nemo.get("base", ""), str):
        raise NemoConfigError("recipe key nemo.base must be the name or path of a NeMo-RL example config")
    mode = get(recipe, "nemo.adapter.importance_sampling", "none")
    if mode not in IS_MODES:
        raise NemoConfigError(f"recipe key nemo.adapter.importance_sampling: {mode!r} is not one of {IS_MODES}")
    from rise_nemo.backends.nemo.keys import leaves, refusal
    from rise_nemo.backends.nemo.placement import has_critic

    critic = has_critic(recipe)
    for key in leaves({k: v for k, v in nemo.items() if k not in OUR_KEYS}):
        message = refusal(algo, key, has_critic=critic)
        if message is not None:
            raise NemoConfigError(message)
    try:
        for key in ("nemo.policy.model_name", "nemo.cluster.num_nodes", "nemo.cluster.gpus_per_node",
                    "nemo.policy.max_total_sequence_length", "nemo.policy.train_micro_batch_size"):
            get(recipe, key)
    except RecipeKeyError as exc:
        raise NemoConfigError(str(exc)) from exc
    if algo == NEMO_GRPO and get(recipe, "nemo.policy.generation.backend", "vllm") != "vllm":
        raise NemoConfigError("recipe key nemo.policy.generation.backend: the nemo backend generates with vllm only")
    if uses_async_engine(get(recipe, "nemo.policy.generation", None)) and \
            get(recipe, "nemo.policy.generation.quant_cfg", None) is not None:
        # NeMo-RL then builds its ModelOpt worker (vllm/utils.py:394-403), which does not take a request's seed
        # (rise_nemo.backends.nemo.seeding): streamed samples would depend on what vLLM batches them with.
        raise NemoConfigError("recipe keys nemo.policy.generation.vllm_cfg.async_engine and "
                              "nemo.policy.generation.quant_cfg: the nemo backend's async engine seeds every request, "
                              "which NeMo-RL's ModelOpt worker cannot; unset one of them")
    if str(get(recipe, "nemo.policy.generation.vllm_cfg.kv_cache_dtype", "auto")).startswith("fp8"):
        # NeMo-RL recalibrates FP8 KV scales after every train step (calibrate_qkv_fp8_scales) and passes them
        # to the refit; the nemo backend's step does not do that yet.
        raise NemoConfigError("recipe key nemo.policy.generation.vllm_cfg.kv_cache_dtype: fp8 KV cache is not "
                              "supported by the nemo backend yet; use auto")
    if algo == NEMO_DISTILLATION and get(recipe, "nemo.teacher", None) is None:
        raise NemoConfigError("recipe key nemo.teacher is missing (distillation needs a teacher policy)")
    check_critic_layout(recipe)


def check_critic_layout(recipe: Mapping[str, Any]) -> None:
    """A method with a critic (PPO, RRL) trains its value model colocated with the policy and vLLM, as NeMo-RL's
    PPO does: it needs the ``nemo.value`` block and colocated generation (NeMo-RL's ppo.setup asserts it,
    ppo.py:371-375: "Non-colocated PPO is not yet supported")."""
    from rise_nemo.backends.nemo.placement import has_critic

    if not has_critic(recipe):
        return
    method = recipe.get("method")
    if get(recipe, "nemo.value", None) is None:
        raise NemoConfigError(f"recipe key nemo.value is missing: method {method!r} trains a value model, configured "
                              "there (see recipes/ppo_math_7b.yaml)")
    if not bool(get(recipe, "nemo.policy.generation.colocated.enabled", True)):
        raise NemoConfigError(f"recipe key nemo.policy.generation.colocated.enabled: false, but method {method!r} "
                              "trains a value model, which shares the GPUs with the policy and colocated vLLM as in "
                              "NeMo-RL's PPO (non-colocated PPO is not supported there); set it to true")


def derived_values(recipe: Mapping[str, Any], run_dir: str) -> dict[str, Any]:
    """NeMo-RL keys written from rise_nemo's blocks (dotted key -> value)."""
    kl = float(get(recipe, "policy_loss.kl_coef", 0.0))
    out = {
        "policy.generation.temperature": float(get(recipe, "sampling.temperature", 1.0)),
        "policy.generation.top_p": float(get(recipe, "sampling.top_p", 1.0)),
        "policy.generation.max_new_tokens": int(get(recipe, "sampling.max_new_tokens")),
        "logger.log_dir": str(Path(run_dir) / "nemo_rl_logs"),
        # rise_nemo checkpoints into <run>/checkpoints itself; NeMo-RL's manager must not find them.
        "checkpointing.checkpoint_dir": str(Path(run_dir) / "nemo_rl_checkpoints"),
    }
    if algorithm(recipe) == NEMO_GRPO:
        out.update({
            "grpo.num_prompts_per_step": int(get(recipe, "sampling.prompts_per_step")),
            "grpo.num_generations_per_prompt": int(get(recipe, "sampling.group_size")),
            "grpo.seed": int(get(recipe, "run.seed", 0)),
            "grpo.max_num_steps": int(get(recipe, "train.steps")),
            # setup() sizes Megatron's scheduler as min(max_num_steps, max_num_epochs x batches per epoch);
            # rise_nemo samples its own prompts, so epochs must never be the binding limit.
            "grpo.max_num_epochs": max(1, int(get(recipe, "train.steps"))),
            "grpo.val_period": 0,
            "grpo.val_at_start": False,
            "grpo.val_at_end": False,
            "loss_fn.reference_policy_kl_penalty": kl,
            "grpo.skip_reference_policy_logprobs_calculation": kl == 0.0,
            "loss_fn.ratio_clip_min": float(get(recipe, "policy_loss.clip_low", 0.2)),
            "loss_fn.ratio_clip_max": float(get(recipe, "policy_loss.clip_high", 0.2)),
            "loss_fn.use_importance_sampling_correction":
                get(recipe, "nemo.adapter.importance_sampling", "none") == "behaviour_ratio",
            **{key: False for key in ("logger.wandb_enabled", "logger.tensorboard_enabled", "logger.mlflow_enabled",
                                      "logger.swanlab_enabled", "logger.monitor_gpus")},
        })
    else:
        out.update({
            "distillation.seed": int(get(recipe, "run.seed", 0)),
            "distillation.max_num_steps": int(get(recipe, "train.steps")),
            # NeMo-RL's distillation loop ends after max_num_epochs passes over its dataloader whatever
            # max_num_steps says (distillation.py:717) and sizes the LR schedule as min(max_num_steps,
            # max_num_epochs x batches per epoch) (:571-576). Every epoch has at least one batch (nemo_dataset
            # repeats a short prompt set to one full batch), so train.steps epochs never bind before train.steps
            # steps: the run ends at train.steps, with the schedule sized for it.
            "distillation.max_num_epochs": max(1, int(get(recipe, "train.steps"))),
        })
    out.update(checkpointing_values(recipe))
    return out


def checkpointing_values(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """NeMo-RL's ``checkpointing`` block from ``train.checkpoint_every`` / ``train.keep_checkpoints``.

    grpo: rise_nemo's own loop writes ``<run>/checkpoints`` (policy weights + optimizer through NeMo-RL), so
    NeMo-RL's manager stays off. distillation: NeMo-RL's ``distillation_train`` is the loop, so its manager
    must save, with the same meaning as rise_nemo's keys: every ``checkpoint_every`` steps and always at
    the last step (0 = only at the end), the newest ``keep_checkpoints`` kept (0 = all: ``train.steps``). NeMo-RL saves
    when ``(step + 1) % save_period == 0`` or at the last step (algorithms/distillation.py:950-961), and
    keeps the newest ``keep_top_k`` when ``metric_name`` is None (utils/checkpoint.py remove_old_checkpoints).
    """
    if algorithm(recipe) != NEMO_DISTILLATION:
        return {"checkpointing.enabled": False}
    every = int(get(recipe, "train.checkpoint_every", 10))
    keep = int(get(recipe, "train.keep_checkpoints", 2))
    return {
        "checkpointing.enabled": True,
        "checkpointing.save_period": every if every > 0 else max(1, int(get(recipe, "train.steps"))),
        # "keep all" (0) cannot be None: NeMo-RL's MasterConfig types keep_top_k as int (pydantic refuses None)
        # and CheckpointManager reads the key unconditionally; a run saves at most once per step, so keeping
        # train.steps checkpoints keeps them all.
        "checkpointing.keep_top_k": keep if keep > 0 else max(1, int(get(recipe, "train.steps"))),
        "checkpointing.metric_name": None,
    }


def nemo_rl_dir(recipe: Mapping[str, Any]) -> Path:
    return Path(str(get(recipe, "nemo.adapter.nemo_rl_dir", None) or os.environ.get("NEMO_RL_DIR")
                    or DEFAULT_NEMO_RL_DIR))


def put_nemo_rl_on_path() -> None:
    """NeMo-RL comes from the environment (the NeMo-RL container) or from ``$NEMO_RL_DIR`` (a v0.7.0 source
    checkout): when ``nemo_rl`` is not importable and ``$NEMO_RL_DIR/nemo_rl`` exists, that directory goes on
    ``sys.path`` and on ``PYTHONPATH``, which the Ray workers NeMo-RL starts inherit."""
    import importlib.util
    import sys

    if importlib.util.find_spec("nemo_rl") is not None:
        return
    root = os.environ.get("NEMO_RL_DIR")
    if not root or not (Path(root) / "nemo_rl").is_dir():
        return
    root = str(Path(root).resolve())
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)


def base_config_path(recipe: Mapping[str, Any]) -> Path | None:
    base = get(recipe, "nemo.base", None)
    if not base:
        return None
    p = Path(base)
    if not p.is_absolute() and not p.exists():
        p = nemo_rl_dir(recipe) / "examples" / "configs" / base
    if not p.exists():
        raise NemoConfigError(
            f"recipe key nemo.base: {base!r} not found (looked in {p.parent}; set NEMO_RL_DIR or nemo.adapter.nemo_rl_dir)"
        )
    return p


def nemo_overrides(recipe: Mapping[str, Any], run_dir: str) -> dict[str, Any]:
    """The recipe's NeMo-RL tree without our keys, with the derived values written in."""
    tree = {k: copy.deepcopy(v) for k, v in recipe["nemo"].items() if k not in OUR_KEYS}
    for key, value in derived_values(recipe, run_dir).items():
        _set(tree, key, value)
    return tree


def build_master_config(recipe: Mapping[str, Any], run_dir: str) -> dict[str, Any]:
    """NeMo-RL's master config as a plain dict: base example config <- recipe's nemo tree <- derived values.

    Uses NeMo-RL's own loader (``defaults:`` inheritance, its ``${mul:...}`` resolvers), so it imports
    nemo_rl; call it only where NeMo-RL is installed.
    """
    put_nemo_rl_on_path()
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigTypeError

    register_omegaconf_resolvers()  # ${mul:a,b} etc. in NeMo-RL's example configs
    base_path = base_config_path(recipe)
    base = load_config(base_path) if base_path is not None else OmegaConf.create({})
    overrides = nemo_overrides(recipe, run_dir)
    try:
        merged = OmegaConf.merge(base, OmegaConf.create(overrides))
    except ConfigTypeError as exc:  # omegaconf names no key ("Cannot merge DictConfig with ListConfig")
        where = shape_mismatch(OmegaConf.to_container(base), overrides) or "?"
        raise NemoConfigError(f"recipe key nemo.{where}: {exc.msg.splitlines()[0]} (the base config "
                              f"{base_path.name if base_path else '-'} has another shape there; replace it in the "
                              "same shape)") from None
    master = OmegaConf.to_container(merged, resolve=True)
    check_dtensor_worker(master)
    check_dtensor_top_p(master)
    check_streaming_keys(recipe, master)
    return master


def check_streaming_keys(recipe: Mapping[str, Any], master: Mapping[str, Any]) -> None:
    """Keys set to true that only NeMo-RL's async vLLM engine can serve, refused while the merged config (the base
    example config decides where the recipe is silent) runs the synchronous engine. Unchecked, the run would build
    its cluster and load its models, then fail on its first step (NemoGenerator.open_stream / generate)."""
    if uses_async_engine((master.get("policy") or {}).get("generation")):
        return
    from rise_nemo.methods.registry import RubricMethod, recipe_method

    wanted = []
    if get(recipe, "sampling.request_seeds", "auto") is True:
        wanted.append("sampling.request_seeds: true (a seed per request)")
    if isinstance(recipe_method(recipe), RubricMethod) and \
            get(recipe, "rise.pipeline", "auto") is True:
        wanted.append("rise.pipeline: true (judging responses while others are generated)")
    if wanted:
        keys, need, them = ("recipe key", "needs", "it") if len(wanted) == 1 else ("recipe keys", "need", "them")
        raise NemoConfigError(f"{keys} {' and '.join(wanted)} {need} NeMo-RL's async vLLM engine, and "
                              "nemo.policy.generation.vllm_cfg.async_engine is false here (the synchronous engine "
                              "returns a batch only when all of it is generated): set "
                              f"nemo.policy.generation.vllm_cfg.async_engine: true, or set {them} to auto")


def shape_mismatch(base: Any, override: Any, prefix: str = "") -> str | None:
    """The first dotted key where ``override`` puts a mapping over a list or a list over a mapping of ``base``."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        for key, value in override.items():
            if key in base:
                found = shape_mismatch(base[key], value, f"{prefix}{key}.")
                if found:
                    return found
        return None
    if isinstance(base, (Mapping, list)) and isinstance(override, (Mapping, list)) and \
            isinstance(base, Mapping) != isinstance(override, Mapping):
        return prefix.rstrip(".")
    return None


def check_dtensor_top_p(master: Mapping[str, Any]) -> None:
    """NeMo-RL v0.7.0's DTensor workers recompute log-probs under the generation's top-p. With plain (not
    tensor-parallel) logits that goes through ``logits[:, :-1]`` then ``.view(-1, vocab)``
    (nemo_rl/distributed/model_utils.py:1626-1631, algorithms/logits_sampling_utils.py:153), which raises
    "view size is not compatible" whenever a micro-batch holds more than one row: found executing the DTensor
    v2 policy worker in make test-nemo, and not CPU-specific (the slice is non-contiguous on any device).
    Sequence packing (one packed row), a fixed micro-batch of 1, tensor parallelism or top_p 1 avoid it; dynamic
    batching does not (its micro-batches hold several rows). Refuse the rest here, naming our key, instead of
    failing inside the first train call. (The worker's log-prob pass filters the whole, contiguous logits first:
    nemo_rl/models/automodel/train.py:826-843, so only the loss is affected.)"""
    policy = master.get("policy") or {}
    dtensor = policy.get("dtensor_cfg") or {}
    top_p = float((policy.get("generation") or {}).get("top_p", 1.0) or 1.0)
    if not dtensor.get("enabled") or top_p >= 1.0 or int(dtensor.get("tensor_parallel_size", 1) or 1) > 1:
        return
    if (policy.get("sequence_packing") or {}).get("enabled"):
        return
    dynamic = bool((policy.get("dynamic_batching") or {}).get("enabled"))
    if not dynamic and int(policy.get("train_micro_batch_size", 1) or 1) <= 1:
        return
    rows = "dynamic batching is on" if dynamic else f"train_micro_batch_size is {policy.get('train_micro_batch_size')}"
    raise NemoConfigError(
        f"recipe key sampling.top_p: {top_p} < 1 on a DTensor policy with tensor_parallel_size 1, sequence packing "
        f"off and {rows} fails in NeMo-RL v0.7.0's first train call (its top-p log-prob path views a non-contiguous "
        f"slice when a micro-batch has more than one row); turn on nemo.policy.sequence_packing.enabled, set "
        f"nemo.policy.train_micro_batch_size: 1 with dynamic batching off, or sampling.top_p: 1.0")


def check_dtensor_worker(master: Mapping[str, Any], blocks: tuple[str, ...] = ("policy", "teacher")) -> None:
    """A DTensor policy (or teacher) with ``dtensor_cfg._v2: true`` runs NeMo-RL's DTensor v2 worker, which
    imports nemo_automodel (nemo_rl/models/policy/lm_policy.py:134-138). NeMo-RL's base config sets ``_v2:
    true`` (examples/configs/grpo_math_1B.yaml), so a recipe that only turns DTensor on inherits it; where
    nemo_automodel is not installed, say so here, naming the key, instead of failing inside a Ray worker."""
    import importlib.util

    for block in blocks:
        dtensor = (master.get(block) or {}).get("dtensor_cfg") or {}
        if dtensor.get("enabled") and dtensor.get("_v2", False) and importlib.util.find_spec("nemo_automodel") is None:
            if block == "value":
                raise NemoConfigError(
                    "recipe key nemo.policy.dtensor_cfg.enabled: a DTensor policy's critic is NeMo-RL's DTensor v2 value "
                    "worker (its only DTensor one), which needs nemo_automodel (not installed); install it, or train on "
                    "Megatron (nemo.policy.megatron_cfg.enabled: true)")
            raise NemoConfigError(
                f"recipe key nemo.{block}.dtensor_cfg._v2: true (NeMo-RL's base config sets it) runs the DTensor v2 "
                f"worker, which needs nemo_automodel (not installed); install it, or set "
                f"nemo.{block}.dtensor_cfg._v2: false for the DTensor v1 worker"
            )

