"""Training/evaluation prompts for a run and the checkpointable prompt sampler.

``data.source``:
  persistent  the generated persistent-criteria task (rise_nemo.data.persistent_task), parameters in
              ``data.task``; a fresh run first warm-starts the policy (``data.warm_start``, cached; tasks.persistent_warm_start)
  jsonl       rubric files (``data.train_path`` / ``data.eval_path``, JSONL or parquet) in any format
              rise_nemo.data.loaders reads (healthbench, rubrichub, rar, rise; ``data.format``)
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


def reasoning_tools(cfg: Any, reward_model: Any = None) -> tuple[Any, Any]:
    """(verifier, step_accuracy checker or None) for the recipe's reasoning data source: the embedded task's
    rule verifier, the sandboxed unit-test reward (``CodeVerifier``) for APPS code files (``data.format:
    apps``), the reward model's preference over the chosen reply (``PreferenceVerifier``) for HH-RLHF pairs
    (``data.format: hh_rlhf``; ``reward_model`` or the one the ``reward_model:`` block builds), or
    math-verify (``MathVerifier``) for other reasoning files (``data.source: jsonl`` of a reasoning method:
    formats math, gsm8k, reasoning)."""
    if cfg.data.source == "jsonl" and _reasoning_method(cfg) and str(cfg.data.format) == "hh_rlhf":
        from rise_nemo.steps.reward_model import PreferenceVerifier

        return PreferenceVerifier(reward_model if reward_model is not None else build_reward_model(cfg)), None
    if cfg.data.source == "chain_arithmetic":
        from rise_nemo.data.chain_task import RuleArithmeticVerifier, step_accuracy

        return RuleArithmeticVerifier(), step_accuracy
    if cfg.data.source == "jsonl" and _reasoning_method(cfg) and str(cfg.data.format) == "apps":
        return code_verifier(cfg), None  # unit tests in the bubblewrap sandbox (docs/DESIGN.md §10)
    if cfg.data.source == "jsonl" and _reasoning_method(cfg):
        require_verifier_extras(cfg)
        from rise_nemo.judges.verifiers import MathVerifier

        return MathVerifier(), None
    raise ValueError(f"config key 'data.source': {cfg.data.source!r} has no verifier for method {cfg.method!r}")


def check_reward_model(cfg: Any) -> None:
    """A recipe that needs a reward model (``needs_reward_model``) names one: a one-line UserError otherwise,
    raised before anything is read or built."""
    if not needs_reward_model(cfg):
        return
    path = cfg.reward_model.path
    if not path:
        raise UserError("config key 'reward_model.path': is null, but the recipe needs a reward model "
                        f"(reward.scorer={cfg.reward.scorer}, data.format={cfg.data.format}); set it to a "
                        "Bradley-Terry sequence classifier")
    if cfg.backend == "local" and not Path(str(path)).expanduser().is_dir():  # nemo: a hub name is fine
        raise UserError(f"config key 'reward_model.path': {path} is not a directory; the local backend loads the "
                        "reward model from a local directory holding a sequence classifier and its tokenizer")


def code_verifier(cfg: Any) -> Any:
    """The unit-test reward of the ``code_reward:`` block: the local sandbox pool, or ``ray_actors`` Ray actors
    (judges.ray_actor.RayCodeVerifier) on the run's Ray cluster."""
    c = cfg.code_reward
    kwargs = {"per_test_seconds": float(c.per_test_seconds), "total_seconds": float(c.total_seconds)}
    if int(c.ray_actors) == 0:
        from rise_nemo.judges.code_verifier import CodeVerifier

        return CodeVerifier(workers=c.workers, **kwargs)
    from rise_nemo.errors import require_extra

    require_extra("judge", "ray", what="the code sandbox's Ray actors (code_reward.ray_actors > 0)")
    from rise_nemo.judges.ray_actor import RayCodeVerifier

    try:
        return RayCodeVerifier(actors=int(c.ray_actors), workers=int(c.workers or 4), chunk_size=int(c.chunk_size),
                               verifier_kwargs=kwargs)
    except RuntimeError as exc:
        raise UserError(f"config key 'code_reward.ray_actors': {str(exc).splitlines()[0]}") from None


def build_reward_model(cfg: Any) -> Any:
    """The backend's reward model for the ``reward_model:`` block; config problems as one-line UserErrors."""
    check_reward_model(cfg)
    from rise_nemo.backends import build_reward_model as build

    try:
        return build(cfg)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def needs_reward_model(cfg: Any) -> bool:
    """The recipe's scorer is the reward model's, or its data are HH-RLHF pairs (evaluated with it)."""
    from rise_nemo.steps.reward_model import SCORER

    hh = cfg.data.source == "jsonl" and _reasoning_method(cfg) and str(cfg.data.format) == "hh_rlhf"
    return cfg.reward.scorer == SCORER or bool(hh)


def require_verifier_extras(cfg: Any) -> None:
    """Reasoning files are checked with math-verify (the 'math' extra): a one-line UserError naming it, raised
    before any data is read or model built (rise_nemo.loop.run)."""
    if cfg.data.source == "jsonl" and _reasoning_method(cfg) and str(cfg.data.format) != "hh_rlhf":
        from rise_nemo.errors import require_extra

        require_extra("math", "math_verify", what="checking math answers (data.source: jsonl, method "
                      f"{cfg.method})")


def _reasoning_method(cfg: Any) -> bool:
    from rise_nemo.methods import get_method

    return get_method(str(cfg.method)).verifier


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


def load_prompts(cfg: Any) -> tuple[list[RubricPrompt], list[RubricPrompt]]:
    """(train prompts, held-out eval prompts) for the recipe, truncated to ``data.max_*_prompts``."""
    if cfg.data.source == "persistent":
        task = persistent_task(cfg)
        train, held_out = list(task.train), list(task.heldout)
    elif cfg.data.source == "chain_arithmetic":
        task = chain_task(cfg)
        train, held_out = list(task.train), list(task.heldout)
    elif cfg.data.source == "jsonl" and _reasoning_method(cfg):  # verifiable problems with references
        if not cfg.data.train_path:
            raise ValueError("config key 'data.train_path' is required when data.source is jsonl")
        from rise_nemo.data.reasoning import load_reasoning_problems

        fmt, skip = str(cfg.data.format), bool(cfg.data.skip_invalid)
        train = load_reasoning_problems(cfg.data.train_path, fmt, skip).problems
        held_out = load_reasoning_problems(cfg.data.eval_path, fmt, skip).problems if cfg.data.eval_path else []
    elif cfg.data.source == "jsonl":
        if not cfg.data.train_path:
            raise ValueError("config key 'data.train_path' is required when data.source is jsonl")
        fmt, skip = str(cfg.data.format), bool(cfg.data.skip_invalid)
        train = load_rubric_prompts(cfg.data.train_path, fmt, skip).prompts
        held_out = load_rubric_prompts(cfg.data.eval_path, fmt, skip).prompts if cfg.data.eval_path else []
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


def check_real_model(cfg: Any) -> None:
    """Real-text reasoning data (``data.source: jsonl`` of a reasoning method: GSM8K, MATH, our own rows) on
    the local backend needs a pretrained model: ``local.model_path``, a directory holding a Hugging Face causal
    LM and its tokenizer. Without one the backend would build the tiny random model of the embedded task, whose
    word tokenizer turns real text into unknown tokens, and train garbage: a one-line error naming the key. A
    tiny model on a tokenizer of the user's own (``local.tokenizer`` a path, e.g. a word vocabulary built for a
    small code task) is a deliberate choice and passes here; ``check_tokenizer_covers`` then refuses any prompt
    or reference it cannot encode. On
    any backend, ExpRL on such data needs an LLM reference judge (the rule judge reads the embedded task only)."""
    if cfg.data.source != "jsonl" or not _reasoning_method(cfg):
        return
    from rise_nemo.methods import get_method

    judge = cfg.judge.get("type") if cfg.judge is not None else None
    if get_method(str(cfg.method)).judge == "reference" and judge == "rule":
        raise UserError(f"config key 'judge.type': the rule reference judge grades only the embedded task's steps; "
                        f"ExpRL on data.source=jsonl ({cfg.data.train_path}) needs an LLM judge: judge.type=http "
                        "(docs/DESIGN.md §8)")
    if cfg.backend != "local":
        return
    local = cfg.local or {}
    if local.get("model_path") is not None or local.get("model") is not None:
        return
    if not str(local.get("tokenizer") or "builtin:").startswith("builtin:"):
        return  # the user's own tokenizer on a tiny model: check_tokenizer_covers refuses unknown tokens
    raise UserError(
        f"config key 'local.model_path': data.source=jsonl (format {cfg.data.format}, {cfg.data.train_path}) is real "
        "text, which the local backend's tiny random model and word tokenizer cannot read; set local.model_path to "
        "a local directory holding a Hugging Face causal LM and its tokenizer (e.g. a downloaded "
        "Qwen2.5-0.5B-Instruct), or train on the embedded task (data.source=chain_arithmetic)")


UNK_CHECK_PROMPTS = 64  # training prompts (and references) encoded by check_tokenizer_covers


def check_tokenizer_covers(cfg: Any, generator: Any, prompts: Sequence[Any]) -> None:
    """A tokenizer with an unknown token (the word-level vocabularies of the embedded tasks) must not meet
    text outside its vocabulary: the first ``UNK_CHECK_PROMPTS`` training prompts (rendered with the chat
    template) and reference solutions are encoded, and any unknown token is a one-line error naming the key.
    Byte-level tokenizers (every real LLM's) have no unknown token and pass untouched."""
    tokenizer = getattr(getattr(generator, "engine", None), "tokenizer", None)
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not hasattr(generator, "encode_prompt"):
        return
    for prompt in list(prompts)[:UNK_CHECK_PROMPTS]:
        texts = [("prompt", generator.encode_prompt(list(prompt.messages)))]
        reference = getattr(prompt, "reference_solution", None)
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


def load_prompts_checked(cfg: Any, env_sources: Mapping[str, str] | None = None):
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
        return load_prompts(cfg)
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
