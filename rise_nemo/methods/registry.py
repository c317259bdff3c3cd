"""The method registry: every ``method:`` a recipe may name and what it is made of, typed by the step it runs.

Torch-free on purpose: the config loader (each method's defaults, the pairing checks) and the planner read it,
and `rise-nemo plan` imports no torch. A method's behaviour is named here and implemented where its step kind
lives (rise_nemo.steps), by name.

Three step kinds (``StepKind``), each with its own registries of the pieces a method of that kind may name:

  rubric      RISE-RL and its baselines on rubric prompts, scored by the rubric judge (rise_nemo.steps.rubric);
              a ``RubricMethod`` turns guidance, coupling and scaffolds on and off
  reasoning   verifier-rewarded methods on problems with reference solutions (rise_nemo.steps.reasoning): a
              ``ReasoningMethod`` names its scorer (rollouts -> rewards), advantage estimator (rewards ->
              advantages; the estimator says whether a critic is trained, as verl's ``need_critic`` derives it
              from ``adv_estimator``) and hooks around the step
  sft         teacher-forced NLL of the reference solutions (rise_nemo.steps.sft)

A piece is declared with what it needs (``Scorer``, ``Advantage``, ``Hooks``) in the method module that
introduces it, and implemented by the step module that runs it (``REASONING.advantages.implement("gae")``); a
method module may also carry its own implementation (``register``). A method names pieces of its own step kind
only: ``Method.check_recipe`` refuses any other pairing at config time, one line naming the key.

Each module of this package declares one method or family (rise, ppo, grpo, exprl, self_distillation, sft, opd)
and is imported with the package, so a new method is one new file here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

from rise_nemo.recipe_keys import get

T = TypeVar("T")

# The method a recipe without ``method:`` runs (the schema's default: rise_nemo.config.schema).
DEFAULT_METHOD = "rise"


class MethodRecipeError(ValueError):
    """A recipe pairs a method with something it cannot run with; ``key`` is the recipe key to change."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


# ----------------------------------------------------------------------------------------------------------
# Pieces and their registries


@dataclass
class Piece:
    """One pluggable piece of a step kind: declared here with what it needs, implemented by its step module."""

    name: str
    summary: str = ""
    impl: Any = field(default=None, repr=False, compare=False)  # bound by ``Registry.implement`` / ``register``


@dataclass
class Scorer(Piece):
    """Rollouts -> rewards [N, G] and a valid mask (``steps.reasoning.StepScores``)."""

    judge: Literal["reference"] | None = None  # the run builds ExpRL's reference judge for it
    reward_model: bool = False  # it scores with the recipe's reward model (``reward_model:`` block)
    token_advantages: bool = False  # it also gives per-token advantages (segment scores)


@dataclass
class Advantage(Piece):
    """Scored rollouts -> the batch's advantage columns."""

    critic: bool = False  # it reads a value model's values: the run trains a critic
    token_advantages: bool = False  # it needs a scorer that gives per-token advantages


@dataclass
class Hooks(Piece):
    """Stages around the reasoning step (start states, after scoring, after training)."""

    critic: bool = False  # it reads the critic's values


P = TypeVar("P", bound=Piece)


# Where the declared pieces are implemented. A caller that imports only the step it runs (a bench building
# ReasoningContext itself) still gets pieces implemented next door (RRL's hooks in steps/rrl.py, ExpRL's scorers
# in steps/exprl.py): the first lookup of an unimplemented piece imports every module of this package. By name,
# not by an import statement: the steps import this registry, never the other way round.
STEP_IMPLEMENTATIONS = "rise_nemo.steps"


def load_step_implementations() -> None:
    """Imports every module of ``STEP_IMPLEMENTATIONS`` (each binds the pieces it implements)."""
    package = importlib.import_module(STEP_IMPLEMENTATIONS)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{STEP_IMPLEMENTATIONS}.{info.name}")


class Registry(Generic[P]):
    """Name -> piece of one kind of one step (e.g. the reasoning step's scorers); one-line errors naming both."""

    def __init__(self, step: str, what: str, piece: type[P]):
        self.step, self.what, self.piece = step, what, piece
        self._items: dict[str, P] = {}

    def declare(self, name: str, summary: str = "", **needs: Any) -> P:
        """Declares a piece (its name and what it needs); its step module implements it."""
        if name in self._items:
            raise ValueError(f"{self.step} {self.what} {name!r} is already declared")
        self._items[name] = self.piece(name, summary, **needs)
        return self._items[name]

    def implement(self, name: str) -> Callable[[T], T]:
        """Binds the implementation of a declared piece (a decorator)."""
        def deco(obj: T) -> T:
            piece = self.get(name)
            if piece.impl is not None and piece.impl is not obj:
                raise ValueError(f"{self.step} {self.what} {name!r} is already implemented")
            piece.impl = obj
            return obj
        return deco

    def register(self, name: str, summary: str = "", **needs: Any) -> Callable[[T], T]:
        """Declares and implements a piece in one place (a method module that carries its own code)."""
        self.declare(name, summary, **needs)
        return self.implement(name)

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def get(self, name: str) -> P:
        if name not in self._items:
            raise ValueError(f"unknown {self.what} {name!r} of the {self.step} step; its {self.what}s: {self.names()}")
        return self._items[name]

    def impl(self, name: str) -> Any:
        """The implementation of ``name`` (its step module is imported on first use); a one-line error when no
        step module implements it."""
        piece = self.get(name)
        if piece.impl is None:
            load_step_implementations()
        if piece.impl is None:
            raise ValueError(f"{self.step} {self.what} {name!r} is declared but no module of "
                             f"{STEP_IMPLEMENTATIONS} implements it")
        return piece.impl

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def names(self) -> list[str]:
        return sorted(self._items)


class StepKind:
    """A kind of training step: the data it trains on, its registries of pieces, and (bound by its step module)
    the step object the trainer runs (a ``TrainingStep``)."""

    def __init__(self, name: str, summary: str, data: Literal["rubric_prompts", "problems"]):
        self.name, self.summary, self.data = name, summary, data
        self.scorers: Registry[Scorer] = Registry(name, "scorer", Scorer)
        self.advantages: Registry[Advantage] = Registry(name, "advantage estimator", Advantage)
        self.hooks: Registry[Hooks] = Registry(name, "hooks", Hooks)
        self._step: TrainingStep | None = None

    def implement_step(self, step: T) -> T:
        """Binds the step object (a decorator on the class implementing ``TrainingStep``)."""
        self._step = step  # type: ignore[assignment]
        return step

    def step(self) -> TrainingStep:
        if self._step is None:
            load_step_implementations()
        if self._step is None:
            raise ValueError(f"the {self.name} step is not implemented (import rise_nemo.steps.{self.name})")
        return self._step

    def __repr__(self) -> str:
        return f"StepKind({self.name!r})"


RUBRIC = StepKind("rubric", "RISE-RL and its baselines on rubric prompts, scored by the rubric judge", "rubric_prompts")
REASONING = StepKind("reasoning", "verifier-rewarded methods on problems with reference solutions", "problems")
SFT = StepKind("sft", "teacher-forced NLL of the reference solutions (no sampling)", "problems")
STEP_KINDS: tuple[StepKind, ...] = (RUBRIC, REASONING, SFT)

# What every step kind brings with it: the pieces a method of that kind gets unless it names others.
RUBRIC.scorers.declare("rubric_judge", "the rubric judge's per-criterion verdicts -> eq. 3 rewards")
REASONING.scorers.declare("verifier", "the task's verifier: 1 correct, 0 wrong, undecided excluded")
REASONING.scorers.declare("reward_model", "a Bradley-Terry reward model's score of the conversation "
                          "(docs/methods.md \"Reward-model reward\")", reward_model=True)
REASONING.advantages.declare("group", "eq. 1: group-normalised rewards, one per rollout (GRPO)")
REASONING.hooks.declare("none", "nothing around the step")


# ----------------------------------------------------------------------------------------------------------
# Methods, typed by step kind

# What a ``data.source`` gives (``jsonl`` files: either, read as the method's ``data``).
SOURCE_DATA: dict[str, Literal["rubric_prompts", "problems"]] = {"persistent": "rubric_prompts",
                                                                 "chain_arithmetic": "problems"}


def _recipe_get(recipe: Mapping[str, Any], dotted: str) -> Any:
    return get(recipe, dotted, None)  # None when the key is missing (a recipe tree before the schema's defaults)


@dataclass(frozen=True)
class Method:
    """What every method has: a name, a one-line summary, and the recipe keys it sets unless the recipe sets
    them itself (dotted key -> value). ``kind`` is the step it runs (None: it runs elsewhere)."""

    name: str
    summary: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    kind: ClassVar[StepKind | None] = None
    takes_no_scorer: ClassVar[str] = ""  # why a ``reward.scorer`` cannot replace what scores it

    @property
    def data(self) -> Literal["rubric_prompts", "problems"]:
        """What the method trains and evaluates on: rubric prompts (judged) or problems (verified)."""
        assert self.kind is not None
        return self.kind.data

    @property
    def guided_rows(self) -> bool:
        """Whether its steps add privileged (guided) rows to the train batch (the planner sizes batches by it)."""
        return False

    def check_data_source(self, recipe: Mapping[str, Any]) -> None:
        """``data.source`` gives what the method trains on (``data``); checked when a run is assembled (the
        schema's default source is the rubric demo's, which a recipe of another method always overrides)."""
        source = _recipe_get(recipe, "data.source")
        gives = SOURCE_DATA.get(source)
        if gives is not None and gives != self.data:
            raise MethodRecipeError("data.source", f"{source!r} gives {gives.replace('_', ' ')}; method {self.name!r} "
                                    f"trains on {self.data.replace('_', ' ')}")

    def training_step(self) -> TrainingStep:
        """The step object of its kind; a one-line ValueError naming where it runs when that is elsewhere."""
        assert self.kind is not None
        return self.kind.step()

    def check_recipe(self, recipe: Mapping[str, Any]) -> None:
        """Refuses (``MethodRecipeError`` naming the key) a recipe pairing this method with data or a piece of
        another step kind, or with one it cannot run with."""
        if _recipe_get(recipe, "reward.scorer") is not None:
            raise MethodRecipeError("reward.scorer", f"method {self.name!r} {self.takes_no_scorer}; remove the key (a "
                                    "scorer replaces a reasoning method's own)")


@dataclass(frozen=True)
class RubricMethod(Method):
    """A method of the rubric step: which of RISE-RL's mechanisms it turns on (docs/DESIGN.md §2)."""

    guidance: bool = False  # privileged rollouts while the schedule is active (eq. 6-13)
    coupled: bool = False  # privileged rows join the natural GRPO group (kind 0) instead of the guide loss
    ruscarl: bool = False  # natural rollouts sampled under RuscaRL scaffolds, trained under the original prompt
    token_weighting: Literal["policy_support", "uniform"] = "policy_support"  # guide-loss token weights (eqs. 9-10)
    kind: ClassVar[StepKind | None] = RUBRIC
    takes_no_scorer: ClassVar[str] = "runs the rubric step, which scores with its rubric judge"

    @property
    def guided_rows(self) -> bool:
        return self.guidance


@dataclass(frozen=True)
class ReasoningMethod(Method):
    """A method of the reasoning step: its scorer, advantage estimator and hooks (pieces of that step)."""

    scorer: str = "verifier"
    advantage: str = "group"
    hooks: str = "none"
    kind: ClassVar[StepKind | None] = REASONING

    @property
    def critic(self) -> bool:
        """A value model is trained: its advantage estimator reads one (GAE)."""
        return REASONING.advantages.get(self.advantage).critic

    def scorer_for(self, recipe: Mapping[str, Any]) -> Scorer:
        """The scorer a run uses: the recipe's ``reward.scorer`` or the method's own."""
        return REASONING.scorers.get(_recipe_get(recipe, "reward.scorer") or self.scorer)

    def check_recipe(self, recipe: Mapping[str, Any]) -> None:
        for what, registry, name in (("advantage estimator", REASONING.advantages, self.advantage),
                                     ("hooks", REASONING.hooks, self.hooks), ("scorer", REASONING.scorers, self.scorer)):
            if name not in registry:
                raise MethodRecipeError("method", f"method {self.name!r} names {what} {name!r}, which is not one of "
                                        f"the reasoning step's: {registry.names()}")
        chosen = _recipe_get(recipe, "reward.scorer")
        if chosen is not None and chosen not in REASONING.scorers:
            other = [k.name for k in STEP_KINDS if chosen in k.scorers]
            why = (f"{chosen!r} scores the {other[0]} step" if other else f"unknown scorer {chosen!r}")
            raise MethodRecipeError("reward.scorer", f"{why}; method {self.name!r} runs the reasoning step, whose "
                                    f"scorers are {REASONING.scorers.names()}")
        scorer, advantage = self.scorer_for(recipe), REASONING.advantages.get(self.advantage)
        if advantage.token_advantages and not scorer.token_advantages:
            able = [n for n in REASONING.scorers.names() if REASONING.scorers.get(n).token_advantages]
            raise MethodRecipeError("reward.scorer", f"method {self.name!r}: advantage estimator {advantage.name!r} "
                                    f"needs per-token advantages from its scorer, and scorer {scorer.name!r} gives none "
                                    f"(scorers that do: {able})")
        if REASONING.hooks.get(self.hooks).critic and not advantage.critic:
            raise MethodRecipeError("method", f"method {self.name!r}: hooks {self.hooks!r} read the critic's values, "
                                    f"and advantage estimator {advantage.name!r} trains no critic")


@dataclass(frozen=True)
class SFTMethod(Method):
    """Supervised fine-tuning on the reference solutions (the SFT step: nothing sampled, nothing scored)."""

    kind: ClassVar[StepKind | None] = SFT
    takes_no_scorer: ClassVar[str] = "runs the sft step, which samples and scores nothing"


@dataclass(frozen=True)
class ExternalMethod(Method):
    """A method whose loop is someone else's (``elsewhere`` says where and how to run it)."""

    elsewhere: str = ""
    trains_on: Literal["rubric_prompts", "problems"] = "rubric_prompts"
    takes_no_scorer: ClassVar[str] = "runs elsewhere and takes no scorer"

    @property
    def data(self) -> Literal["rubric_prompts", "problems"]:
        return self.trains_on

    def training_step(self) -> TrainingStep:
        raise ValueError(f"config key 'method': {self.elsewhere}")


METHODS: dict[str, Method] = {}  # filled by the modules of this package (and by register_method)


def register_method(method: Method, *, replace: bool = False) -> Method:
    """Adds ``method`` to the registry (recipes may then name it)."""
    if method.name in METHODS and not replace and METHODS[method.name] != method:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def unregister_method(name: str) -> None:
    METHODS.pop(name, None)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"config key 'method': unknown method {name!r}; expected one of {sorted(METHODS)}")
    return METHODS[name]


def recipe_method(recipe: Mapping[str, Any]) -> Method | None:
    """The method a plain recipe tree names (``method:``, the default when absent); None for an unknown name (the
    config loader refuses those, naming the key)."""
    return METHODS.get(str(recipe.get("method") or DEFAULT_METHOD))


def made_of(method: Method) -> str:
    """What a method is made of, in a few words (the registry table of docs/methods.md)."""
    if isinstance(method, RubricMethod):
        switches = [s for s, on in (("guidance", method.guidance), ("coupled", method.coupled),
                                    ("RuscaRL scaffolds", method.ruscarl),
                                    ("uniform guide weights", method.token_weighting == "uniform")) if on]
        return "rubric judge, eq. 1" + "".join(f", {s}" for s in switches)
    if isinstance(method, ReasoningMethod):
        parts = [f"scorer `{method.scorer}`", f"advantage `{method.advantage}`"]
        parts += [f"hooks `{method.hooks}`"] if method.hooks != "none" else []
        return ", ".join(parts + (["critic"] if method.critic else []))
    if isinstance(method, ExternalMethod):
        return "runs elsewhere"
    return "teacher-forced NLL"


def method_table() -> str:
    """The Markdown table of every registered method (docs/methods.md "Method registry" holds it, and a test keeps
    the two equal): its name, step kind, what it is made of and what it does."""
    rows = ["| method | step | made of | what it does |", "|---|---|---|---|"]
    order = {kind: i for i, kind in enumerate((*STEP_KINDS, None))}
    for name, method in sorted(METHODS.items(), key=lambda item: order[item[1].kind]):
        rows.append(f"| `{name}` | {method.kind.name if method.kind else '-'} | {made_of(method)} | {method.summary} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------------------
# What the trainer and a step kind's step object exchange (implemented in rise_nemo.steps, run by rise_nemo.loop)


@dataclass
class RunParts:
    """What the trainer hands a training step's ``build_context`` (built by rise_nemo.loop.run)."""

    cfg: Any
    policy: Any
    generator: Any
    judge: Any  # the rubric judge, ExpRL's reference judge (the scorer's ``judge``), or None
    verifier: Any = None
    critic: Any = None
    step_accuracy: Any = None
    n_train_problems: int = 0
    total_steps: int = 0
    pad_id: int = 0
    rng: Any = None  # random.Random of the run seed: the method's own choices; checkpointed
    samples_per_step: int = 0
    reward_model: Any = None  # interfaces.RewardModel of the recipe's reward_model: block, or None


class StepState(Protocol):
    """The context a training step builds once per run; the trainer's only view of the method's state."""

    rng: Any  # random.Random, checkpointed by the trainer
    last_samples: list[dict[str, Any]]  # rollouts the last step recorded for samples.jsonl

    def state_dict(self) -> dict[str, Any]: ...  # the method's checkpoint state (its own keys)

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def summary(self, step: int) -> dict[str, Any]: ...  # switch_reason / switch_step for summary.json


class TrainingStep(Protocol):
    """A step kind's step object (``StepKind.implement_step``). Before a run (rise_nemo.loop.run.build_trainer)
    it checks and builds what its methods need, in this order: ``check`` before any data is read (extras, the
    reward model's path, ...), ``check_data`` on the training data, ``build_judge`` before any model is built
    (HTTP judges probed), ``build_parts`` after the backend and the warm start (verifier, critic, reward model:
    RunParts' fields), each failure one line naming the key; then ``build_context`` once per run."""

    def check(self, method: Any, cfg: Any) -> None: ...

    def check_data(self, method: Any, cfg: Any, train_prompts: Any) -> None: ...

    def build_judge(self, method: Any, cfg: Any) -> Any: ...

    def build_parts(self, method: Any, cfg: Any, policy: Any, checkpoint: Any) -> dict[str, Any]: ...

    def build_context(self, method: Any, run: RunParts) -> StepState: ...

    def train_step(self, ctx: Any, batch: Any, step: int) -> dict[str, Any]: ...

    def evaluate(self, ctx: Any, eval_prompts: Any, step: int) -> tuple[dict[str, Any], dict[str, Any]]: ...

    def progress_keys(self, method: Any) -> tuple[tuple[str, str], ...]: ...
