"""Training/evaluation prompts for a run and the checkpointable prompt sampler.

``data.source``:
  persistent  the generated persistent-criteria task (rise_nemo.data.persistent_task), parameters in
              ``data.task``; a fresh run first warm-starts the policy (``data.warm_start``, cached; tasks.persistent_warm_start)
  jsonl       files (``data.train_path`` / ``data.eval_path``, JSONL or parquet) of what the method trains on
              (``Method.data``): rubric prompts in any format rise_nemo.data.loaders reads (healthbench,
              rubrichub, rar, rise), or problems with reference solutions (rise_nemo.data.reasoning: math, gsm8k,
              reasoning, apps, hh_rlhf; ``data.format``)
  chain_arithmetic  the embedded reasoning task (rise_nemo.data.chain_task), parameters in ``data.task``;
              a fresh run first warm-starts the policy (``data.warm_start``), cached under
              rise_nemo.cache.cache_dir() (``$RISE_NEMO_CACHE``) unless ``data.warm_start_cache`` is null
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rise_nemo.core.rubric import RubricError, RubricPrompt
from rise_nemo.data.loaders import load_rubric_prompts
from rise_nemo.errors import UserError
from rise_nemo.methods.registry import Method, get_method
from rise_nemo.steps.rollouts import find_tokenizer


def persistent_task(cfg: Any):
    """The generated persistent-criteria task of ``data.task`` (seeded, deterministic); an unknown key is a
    one-line ValueError naming it and the known ones (not a TypeError from the call)."""
    import inspect

    from rise_nemo.data.persistent_task import make_persistent_task

    kwargs, known = _plain(cfg.data.task), list(inspect.signature(make_persistent_task).parameters)
    for key in kwargs:
        if key not in known:
            raise ValueError(f"data.task.{key}: unknown key for data.source {cfg.data.source}; known: {known}")
    return make_persistent_task(**kwargs)


def chain_task(cfg: Any):
    """The embedded reasoning task of ``data.task`` (seeded, deterministic)."""
    from rise_nemo.data.chain_task import make_chain_task

    return make_chain_task(**_plain(cfg.data.task))


def warm_start_policy(cfg: Any, policy: Any, generator: Any, progress: bool = True) -> Any:
    """Supervised warm start of a fresh local policy on the embedded task (cached on disk): the persistent
    task (answering + hint-following) or the chain-arithmetic task. No-op for other data sources and with
    ``data.warm_start.enabled: false`` (the policy starts from its model as is). Returns the stats or None."""
    if cfg.data.source not in ("chain_arithmetic", "persistent"):
        return None
    options = _plain(cfg.data.warm_start)
    if not options.pop("enabled", True):
        return None
    if str(cfg.backend) != "local":
        raise UserError(f"data.warm_start: the embedded task's supervised warm start trains the local backend's "
                        f"model; on backend {cfg.backend} set data.warm_start.enabled=false (the policy starts "
                        "from nemo.policy.model_name)")
    if cfg.data.source == "chain_arithmetic":
        from rise_nemo.tasks.reasoning import warm_start_reasoning

        return warm_start_reasoning(policy, generator, chain_task(cfg), options,
                                    cache_dir=warm_start_cache_dir(cfg), progress=progress)
    from rise_nemo.tasks.persistent_warm_start import warm_start

    return warm_start(policy, generator, persistent_task(cfg), options,
                      cache_dir=warm_start_cache_dir(cfg), progress=progress)


def warm_start_cache_dir(cfg: Any) -> Path | None:
    """``data.warm_start_cache``: ``auto`` -> ``rise_nemo.cache.cache_dir("warm_start")`` (``$RISE_NEMO_CACHE``,
    default ``~/.cache/rise_nemo``), a path -> that folder, null -> never cache."""
    value = cfg.data.warm_start_cache
    if value is None:
        return None
    if str(value) == "auto":
        from rise_nemo.cache import cache_dir

        return cache_dir("warm_start")
    return Path(str(value)).expanduser()


def _plain(node: Any) -> dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def _rubric_prompts(path: str, fmt: str, skip: bool) -> list[RubricPrompt]:
    return load_rubric_prompts(path, fmt, skip).prompts


def _problems(path: str, fmt: str, skip: bool) -> list[Any]:
    from rise_nemo.data.reasoning import load_reasoning_problems

    return load_reasoning_problems(path, fmt, skip).problems


# data.source jsonl: the reader of what the method trains on (``Method.data``)
FILE_READERS = {"rubric_prompts": _rubric_prompts, "problems": _problems}


def load_prompts(cfg: Any, method: Method | None = None) -> tuple[list[Any], list[Any]]:
    """(train prompts, held-out eval prompts) for the recipe, truncated to ``data.max_*_prompts``: rubric prompts
    or problems, as ``method`` trains on (default: the recipe's method)."""
    method = method if method is not None else get_method(str(cfg.method))
    if cfg.data.source == "persistent":
        task = persistent_task(cfg)
        train, held_out = list(task.train), list(task.heldout)
    elif cfg.data.source == "chain_arithmetic":
        task = chain_task(cfg)
        train, held_out = list(task.train), list(task.heldout)
    elif cfg.data.source == "jsonl":
        if not cfg.data.train_path:
            raise ValueError("config key 'data.train_path' is required when data.source is jsonl")
        read, fmt, skip = FILE_READERS[method.data], str(cfg.data.format), bool(cfg.data.skip_invalid)
        train = read(cfg.data.train_path, fmt, skip)
        held_out = read(cfg.data.eval_path, fmt, skip) if cfg.data.eval_path else []
    else:
        raise ValueError(f"config key 'data.source': unknown source {cfg.data.source!r}")
    if cfg.data.max_train_prompts:
        train = train[: int(cfg.data.max_train_prompts)]
    if cfg.data.max_eval_prompts:
        held_out = held_out[: int(cfg.data.max_eval_prompts)]
    if cfg.eval.max_prompts:
        held_out = held_out[: int(cfg.eval.max_prompts)]
    if not train:
        where = f" in {cfg.data.train_path}" if cfg.data.source == "jsonl" else ""
        raise ValueError(f"data.source={cfg.data.source}: no training prompts{where}")
    return list(train), list(held_out)


UNK_CHECK_PROMPTS = 64  # training prompts (and references) encoded by check_tokenizer_covers


def check_tokenizer_covers(cfg: Any, generator: Any, prompts: Sequence[Any]) -> None:
    """A tokenizer with an unknown token (the word-level vocabularies of the embedded tasks) must not meet
    text outside its vocabulary: the first ``UNK_CHECK_PROMPTS`` training prompts (rendered with the chat
    template) and reference solutions are encoded, and any unknown token is a one-line error naming the key.
    Byte-level tokenizers (every real LLM's) have no unknown token and pass untouched."""
    try:
        tokenizer = find_tokenizer(generator)
    except ValueError:
        return  # a generator without a tokenizer (a test double) encodes nothing here
    unk = getattr(tokenizer, "unk_token_id", None)  # a Hugging Face tokenizer's; byte-level ones have none
    if unk is None:
        return
    for prompt in list(prompts)[:UNK_CHECK_PROMPTS]:
        texts = [("prompt", generator.encode_prompt(list(prompt.messages)))]
        reference = getattr(prompt, "reference_solution", None)  # rubric prompts have none
        if reference:
            texts.append(("reference solution", tokenizer.encode(reference, add_special_tokens=False)))
        for what, ids in texts:
            if unk in ids:
                words = [tokenizer.decode([i]) for i in ids]
                where = f" ({cfg.data.train_path})" if cfg.data.source == "jsonl" else ""
                raise UserError(
                    f"config key 'local.tokenizer': {cfg.local.get('tokenizer') or cfg.local.get('model_path')!r} "
                    f"cannot encode the {what} of training prompt {prompt.prompt_id!r}{where}: {ids.count(unk)} of "
                    f"{len(ids)} tokens are unknown (near {' '.join(words[:12])!r}); a word-level tokenizer only "
                    "covers its own task: set local.model_path to a pretrained model for real text")


def load_prompts_checked(cfg: Any, env_sources: Mapping[str, str] | None = None, method: Method | None = None):
    """``load_prompts`` with every data problem as a one-line ``UserError``: a missing file names the
    config key and, when an environment variable set it (``${oc.env:RISE_TRAIN_DATA,...}``), the variable."""
    env_sources = env_sources or {}
    for key in ("train_path", "eval_path"):
        value = cfg.data.get(key) if cfg.data.source == "jsonl" else None
        if value and not Path(str(value)).is_file():
            var = env_sources.get(f"data.{key}")
            how = f" (set ${var} to the file)" if var else ""  # the key is named once, up front
            what = (f"{value} is a directory, not a data file (JSONL or parquet)" if Path(str(value)).is_dir()
                    else f"file not found: {value}")
            raise UserError(f"config key 'data.{key}': {what}{how}")
    try:
        return load_prompts(cfg, method)
    except (RubricError, ValueError) as exc:
        raise UserError(str(exc)) from None


class PromptSampler:
    """Epoch-wise shuffled batches of prompts; the position is part of the checkpoint.

    The order of epoch e is a permutation drawn from a NumPy generator seeded by (seed, e), so it never
    depends on any other RNG use and resumes exactly from (epoch, position)."""

    def __init__(self, prompts: Sequence[RubricPrompt], per_step: int, seed: int, shuffle: bool = True):
        if not prompts:
            raise ValueError("PromptSampler needs at least one prompt")
        self.prompts = list(prompts)
        self.per_step = per_step
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.prompts)))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts)).tolist()

    def next_batch(self) -> list[RubricPrompt]:
        batch = []
        while len(batch) < self.per_step:
            order = self._order(self.epoch)
            take = order[self.position : self.position + self.per_step - len(batch)]
            batch.extend(self.prompts[i] for i in take)
            self.position += len(take)
            if self.position >= len(order):
                self.epoch, self.position = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
