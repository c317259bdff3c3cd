"""The one method registry: every ``method:`` a recipe may name, and the behaviour it is made of.

A method is ONE registered object (``Method``) that names its behaviour, each piece registered by name in
a registry of its kind (verl's ``@register_adv_est("gae")`` / ``@register_policy_loss("vanilla")`` style):

  step          the training step it runs (``@register_step``): ``rubric`` (rise_nemo.steps.rubric),
                ``reasoning`` and ``sft`` (rise_nemo.steps.reasoning); None = runs elsewhere
                (``elsewhere`` says where). The step object builds the step's context (which owns the
                method's checkpoint state), trains one step, evaluates and names the progress-bar columns.
  scorer        what turns rollouts into rewards (``@register_scorer``): ``verifier`` (0/1),
                ``reference_outcome`` / ``reference_process`` (ExpRL's reference judge), ``reward_model``
                (a Bradley-Terry reward model's score); the rubric step scores with its rubric judge
                (``rubric_judge``). A recipe's ``reward.scorer`` replaces a reasoning method's own scorer
                (e.g. ppo / rrl on HH-RLHF with ``reward.scorer: reward_model``)
  advantage     the advantage estimator of the reasoning step (``@register_advantage``): ``group`` (eq. 1),
                ``gae`` (critic), ``segment`` (ExpRL-Process), ``self_distillation``; the rubric step's
                group / coupled advantages are its own (``rubric``)
  loss          the loss factory (``@register_loss``): ``policy_gradient`` (core.losses, eq. 12) or ``sft_nll``
  hooks         stages around the reasoning step (``@register_hooks``): ``none`` or ``rrl`` (replay buffer)
  judge         which judge the run builds: ``rubric``, ``reference`` or None; ``verifier``: the task's
                verifier scores or evaluates rollouts; ``critic``: a value model is trained
  defaults      recipe keys this method sets unless the recipe sets them itself

The behaviour modules register themselves when imported (rise_nemo.orchestration imports them); this
module imports none of them, so the config layer can list the methods. ``register_method`` adds a method
(a test registers a toy one from its own file: tests/test_method_registry.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

T = TypeVar("T")

# The method a recipe without ``method:`` runs (the schema's default: rise_nemo.config.schema).
DEFAULT_METHOD = "rise"


class Registry:
    """Name -> behaviour, filled by ``register`` decorators; ``get`` fails with one line naming the kind."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, Any] = {}

    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and not replace and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj
        return deco

    def get(self, name: str) -> Any:
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {sorted(self._items)}")
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)


STEPS = Registry("training step")
SCORERS = Registry("scorer")
ADVANTAGES = Registry("advantage estimator")
LOSSES = Registry("loss")
HOOKS = Registry("step hooks")


def register_step(name: str) -> Callable[[T], T]:
    return STEPS.register(name)


def register_scorer(name: str) -> Callable[[T], T]:
    return SCORERS.register(name)


def register_advantage(name: str) -> Callable[[T], T]:
    return ADVANTAGES.register(name)


def register_loss(name: str) -> Callable[[T], T]:
    return LOSSES.register(name)


def register_hooks(name: str) -> Callable[[T], T]:
    return HOOKS.register(name)


Judge = Literal["rubric", "reference"]


@dataclass
class RunParts:
    """What the trainer hands a training step's ``build_context`` (built by loop.run)."""

    cfg: Any
    policy: Any
    generator: Any
    judge: Any  # the rubric judge, ExpRL's reference judge, or None (Method.judge)
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
    """A registered training step (``@register_step``)."""

    def build_context(self, method: Method, run: RunParts) -> StepState: ...

    def train_step(self, ctx: Any, batch: Any, step: int) -> dict[str, Any]: ...

    def evaluate(self, ctx: Any, eval_prompts: Any, step: int) -> tuple[dict[str, Any], dict[str, Any]]: ...

    def progress_keys(self, method: Method) -> tuple[tuple[str, str], ...]: ...


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    step: str | None  # registered training step; None: runs elsewhere (``elsewhere``)
    scorer: str = "verifier"  # registered scorer (rubric step: its rubric judge, "rubric_judge")
    advantage: str = "group"  # registered advantage estimator (rubric step: its own, "rubric")
    loss: str = "policy_gradient"  # registered loss factory
    hooks: str = "none"  # registered reasoning-step hooks
    judge: Judge | None = None  # the judge the run builds (rubric judge / ExpRL's reference judge)
    verifier: bool = True  # the task's verifier scores or evaluates rollouts (reasoning data)
    critic: bool = False  # train a value model (GAE advantages)
    guidance: bool = False  # rubric: privileged rollouts while the schedule is active
    coupled: bool = False  # rubric: privileged rows join the natural GRPO group
    ruscarl: bool = False  # rubric: natural rollouts under RuscaRL scaffolds
    token_weighting: str = "policy_support"  # rubric: guide-loss token weights (eqs. 9-10) or "uniform"
    elsewhere: str = ""  # step None: the one-line pointer to where this method runs
    # Recipe keys this method sets unless the recipe sets them itself (dotted key -> value).
    defaults: dict[str, Any] = field(default_factory=dict)

    def check_runnable(self) -> None:
        """A one-line ValueError naming where the method runs when it has no training step here."""
        if self.step is None:
            raise ValueError(f"config key 'method': {self.elsewhere or repr(self.name) + ' has no training step'}")

    def training_step(self) -> TrainingStep:
        self.check_runnable()
        return STEPS.get(str(self.step))

    def scorer_fn(self, override: str | None = None) -> Any:
        """The registered scorer: ``override`` (the recipe's ``reward.scorer``) or the method's own."""
        return SCORERS.get(override or self.scorer)

    def advantage_fn(self) -> Any:
        return ADVANTAGES.get(self.advantage)

    def loss_factory(self) -> Any:
        return LOSSES.get(self.loss)

    def hooks_type(self) -> Any:
        return HOOKS.get(self.hooks)


# The paper settings of PPO-family reasoning methods (RRL's paper, docs/DESIGN.md §7): token KL 0.001,
# temperature 0.8, top-p 0.9.
_PPO_DEFAULTS = {"policy_loss.kl_coef": 0.001, "sampling.temperature": 0.8, "sampling.top_p": 0.9}

# ExpRL's Stage I scripts (docs/DESIGN.md §2c, §8): k3 KL loss 0.001, temperature 0.8, asymmetric clip
# 0.2 / 0.28 (outcome) and 0.2 / 0.26 (process).
_EXPRL_DEFAULTS = {"policy_loss.kl_coef": 0.001, "sampling.temperature": 0.8, "sampling.top_p": 1.0, "policy_loss.clip_low": 0.2,
                   "policy_loss.clip_high": 0.28}

_RUBRIC = dict(step="rubric", scorer="rubric_judge", advantage="rubric", judge="rubric", verifier=False)
_OPD_ELSEWHERE = ("'opd' (on-policy distillation) runs on NeMo-RL's distillation path: "
                  "`rise-nemo distill --config RECIPE`")

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("rise", "GRPO + decoupled guide loss on retained privileged rollouts (RISE-RL eq. 12)", **_RUBRIC,
           guidance=True),
    Method("rubric_rl", "GRPO on rubric rewards, no guidance", **_RUBRIC),
    Method("coupled", "privileged rollouts join the natural GRPO group (ablation)", **_RUBRIC, guidance=True,
           coupled=True),
    Method("uniform", "rise with uniform guide-loss token weights (ablation)", **_RUBRIC, guidance=True,
           token_weighting="uniform"),
    Method("ruscarl", "RuscaRL: rollouts under rubric scaffolds, trained as GRPO", **_RUBRIC, ruscarl=True),
    Method("opd", "on-policy distillation (NeMo-RL's distillation path)", step=None, scorer="none",
           advantage="none", loss="none", verifier=False, elsewhere=_OPD_ELSEWHERE),
    Method("ppo", "PPO with a critic and GAE on a sparse verifier reward", step="reasoning", advantage="gae",
           critic=True, defaults=dict(_PPO_DEFAULTS)),
    Method("rrl", "RRL: PPO whose rollouts may continue value-selected states from a per-problem "
           "replay buffer (Algorithm 1; state tokens masked, eq. 3)", step="reasoning", advantage="gae",
           critic=True, hooks="rrl", defaults=dict(_PPO_DEFAULTS)),
    Method("grpo", "GRPO on a sparse 0/1 verifier reward (group advantages)", step="reasoning",
           defaults={"sampling.temperature": 0.8, "sampling.top_p": 0.9}),
    Method("exprl_outcome", "ExpRL-Outcome: GRPO on a reference judge's normalised 1-5 score", step="reasoning",
           scorer="reference_outcome", judge="reference", defaults=dict(_EXPRL_DEFAULTS)),
    Method("exprl_process", "ExpRL-Process: per-segment reference scores, A_1 = s_1 - s_T, "
           "A_t = s_t - s_(t-1) per token, no group normalisation", step="reasoning",
           scorer="reference_process", advantage="segment", judge="reference",
           defaults={**_EXPRL_DEFAULTS, "policy_loss.clip_high": 0.26}),
    Method("self_distillation", "on-policy self-distillation: the policy with the reference in "
           "context is the teacher on the student's own samples", step="reasoning",
           advantage="self_distillation", defaults=dict(_EXPRL_DEFAULTS)),
    Method("sft", "supervised fine-tuning on the reference solutions (no sampling)", step="sft", scorer="none",
           advantage="none", loss="sft_nll"),
)}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)  # the built-in methods (METHODS also holds registered ones)


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
