"""What decides a run's problems (the reasoning and SFT steps' data) and the checks before any of it is built.

The verifier follows the data: the embedded task's rule verifier (with its step-accuracy checker) for
``data.source: chain_arithmetic``; for files (``data.source: jsonl``) the sandboxed unit-test reward
(``CodeVerifier``) for APPS code (``data.format: apps``, docs/DESIGN.md §10), the reward model's preference
over the chosen reply (``PreferenceVerifier``) for HH-RLHF pairs (``data.format: hh_rlhf``), and math-verify
(``MathVerifier``) for the others (math, gsm8k, reasoning rows). ``check_verifier`` checks what that verifier
needs (its extra, the reward model's path) before any data is read or model built; ``build_verifier`` builds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.errors import UserError, require_extra
from rise_nemo.methods.registry import Scorer
from rise_nemo.steps.rollouts import flat_call

VerifierKind = Literal["rule", "code", "reward_model", "math"]


def verifier_kind(cfg: Any) -> VerifierKind:
    """Which verifier decides the recipe's problems (module docstring)."""
    if cfg.data.source == "chain_arithmetic":
        return "rule"
    return {"apps": "code", "hh_rlhf": "reward_model"}.get(str(cfg.data.format), "math")  # type: ignore[return-value]


def check_verifier(cfg: Any, scorer: Scorer | None = None) -> None:
    """What the verifier (and a reward-model scorer) needs, as one-line UserErrors, before anything is read or
    built: math-verify's extra, the reward model's path, the code sandbox's Ray extra."""
    kind = verifier_kind(cfg)
    if kind == "math":
        require_extra("math", "math_verify", what=f"checking math answers (data.format {cfg.data.format})")
    if kind == "code" and int(cfg.code_reward.ray_actors) > 0:
        require_extra("judge", "ray", what="the code sandbox's Ray actors (code_reward.ray_actors > 0)")
    elif kind == "code":  # the sandbox pool runs here: bubblewrap must start (SandboxUnavailable is one line)
        from rise_nemo.judges.sandbox import BubblewrapSandbox

        BubblewrapSandbox().check()
    if needs_reward_model(cfg, scorer):
        check_reward_model(cfg)


def build_verifier(cfg: Any, reward_model: Any = None) -> tuple[Any, Any]:
    """(verifier, step-accuracy checker or None) of the recipe's problems (module docstring). HH-RLHF's verifier
    scores with ``reward_model``, or with the one the ``reward_model:`` block builds."""
    kind = verifier_kind(cfg)
    if kind == "rule":
        from rise_nemo.data.chain_task import RuleArithmeticVerifier, step_accuracy

        return RuleArithmeticVerifier(), step_accuracy
    if kind == "reward_model":
        return PreferenceVerifier(reward_model if reward_model is not None else build_reward_model(cfg)), None
    if kind == "code":
        return code_verifier(cfg), None  # unit tests in the bubblewrap sandbox (docs/DESIGN.md §10)
    require_extra("math", "math_verify", what=f"checking math answers (data.format {cfg.data.format})")
    from rise_nemo.judges.verifiers import MathVerifier

    return MathVerifier(), None


def build_problem_parts(cfg: Any, scorer: Scorer | None = None) -> dict[str, Any]:
    """The run parts of a step on problems (rise_nemo.methods.registry.RunParts): the reward model when the
    scorer or the verifier scores with one (built once for both), the verifier and the step-accuracy checker."""
    reward_model = build_reward_model(cfg) if needs_reward_model(cfg, scorer) else None
    verifier, step_accuracy = build_verifier(cfg, reward_model=reward_model)
    return {"reward_model": reward_model, "verifier": verifier, "step_accuracy": step_accuracy}


def check_reward_model(cfg: Any) -> None:
    """The recipe names a reward model the backend can load: a one-line UserError otherwise, raised before
    anything is read or built."""
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


def needs_reward_model(cfg: Any, scorer: Scorer | None = None) -> bool:
    """The run's scorer is the reward model's, or its problems are HH-RLHF pairs (verified with it)."""
    return (scorer is not None and scorer.reward_model) or verifier_kind(cfg) == "reward_model"


def check_real_model(cfg: Any, scorer: Scorer | None = None) -> None:
    """Real-text reasoning data (``data.source: jsonl`` of a reasoning method: GSM8K, MATH, our own rows) on
    the local backend needs a pretrained model: ``local.model_path``, a directory holding a Hugging Face causal
    LM and its tokenizer. Without one the backend would build the tiny random model of the embedded task, whose
    word tokenizer turns real text into unknown tokens, and train garbage: a one-line error naming the key. A
    tiny model on a tokenizer of the user's own (``local.tokenizer`` a path, e.g. a word vocabulary built for a
    small code task) is a deliberate choice and passes here; ``check_tokenizer_covers`` then refuses any prompt
    or reference it cannot encode. On any backend, a reference-judge scorer (ExpRL) on such data needs an LLM
    reference judge (the rule judge reads the embedded task only)."""
    if cfg.data.source != "jsonl":
        return
    judge = cfg.judge.get("type") if cfg.judge is not None else None
    if scorer is not None and scorer.judge == "reference" and judge == "rule":
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


def conversation(problem: ReasoningProblem, response: str) -> list[dict[str, str]]:
    """The dialogue a reward model scores: the problem's messages, then the response as the assistant's turn."""
    return [dict(m) for m in problem.messages] + [{"role": "assistant", "content": response}]


def require_reward_model(reward_model: Any, what: str) -> Any:
    if reward_model is None:
        raise ValueError(f"config key 'reward_model.path': {what} needs a reward model; set reward_model.path")
    return reward_model


class PreferenceVerifier:
    """interfaces.Verifier for HH-RLHF problems (``data.format: hh_rlhf``), so pass@1 during training is the reward
    model's win rate against the chosen replies (the pairwise LLM-judge evaluation is the ``hh_win_rate`` suite,
    rise_nemo.evals): ``True`` when the reward model prefers the response to the
    problem's reference reply (``reference_solution``, HH's chosen turn); ties count as not preferred."""

    def __init__(self, reward_model: Any):
        self.reward_model = require_reward_model(reward_model, "data.format=hh_rlhf (its verifier)")

    def verify(self, problems: Sequence[ReasoningProblem], responses: Sequence[str]) -> list[bool | None]:
        convs = [conversation(p, r) for p, r in zip(problems, responses)]
        refs = [conversation(p, p.reference_solution) for p in problems]
        mine, theirs = flat_call(self.reward_model.score, [convs, refs], "reward model")
        return [bool(a > b) for a, b in zip(mine, theirs)]

    def close(self) -> None:
        self.reward_model.close()
