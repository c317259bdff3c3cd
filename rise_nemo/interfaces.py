"""The three small interfaces the orchestration layer is written against (docs/DESIGN.md §3).

Backends implement them: ``rise_nemo.backends.local`` (transformers, one process) and
``rise_nemo.backends.nemo`` (NeMo-RL Megatron policy + vLLM generation). Judges implement ``Judge``:
``rise_nemo.judges.rule`` (embedded default) and ``rise_nemo.judges.http`` (OpenAI-compatible LLM judge).

Tensor conventions (shared with NeMo-RL so the nemo backend is a thin adapter):
- A training batch is a ``dict[str, torch.Tensor]`` (NeMo-RL's BatchedDataDict is a dict too).
- ``input_ids`` [B, T] is prompt + response, right-padded; ``input_lengths`` [B] the unpadded lengths.
- Per-token tensors are aligned with ``input_ids``: ``logprobs[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``,
  with ``logprobs[:, 0] = 0`` (NeMo-RL's convention). ``token_mask`` [B, T] is 1 on response tokens only.
- Per-sample columns [B]: ``sample_mask``, ``advantages``, ``kind`` (``KIND_NATURAL`` / ``KIND_GUIDED``),
  plus any extra keys the loss needs (see ``rise_nemo.core.losses``).
- Per-token advantages: a batch may carry ``token_advantages`` [B, T] (aligned with ``input_ids``, 0 off the
  loss mask) instead of ``advantages`` [B]; the PG loss uses whichever is present (GAE for PPO/RRL, segment
  advantages for ExpRL-Process).
- Given (replayed) response prefixes are context only: their tokens have ``token_mask`` 0.
- Values: ``values[b, t]`` is V of the state *before* token t, i.e. of ``input_ids[b, :t]`` (NeMo-RL's right
  shift), so the value of the state a response token is sampled from sits at that token's position.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

# The row kinds are the loss's (core.losses reads the ``kind`` column); the interfaces re-export them.
from rise_nemo.core.losses import KIND_GUIDED as KIND_GUIDED
from rise_nemo.core.losses import KIND_NATURAL as KIND_NATURAL
from rise_nemo.core.problem import ReasoningProblem
from rise_nemo.core.rubric import Conversation, Rubric, judged_text

Verdict = bool | None  # None = unknown (judge failed after retries): the response is excluded, never scored


@dataclass
class Rollout:
    """One sampled response.

    ``prompt_messages`` is the conversation the response was *sampled under* (for a privileged rollout:
    the hinted conversation). Log-probs for training are always recomputed under the original prompt.
    """

    prompt_messages: Conversation
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_text: str
    sampling_logprobs: list[float]  # one per response token, from the generator (0.0 for given tokens)
    finished: bool = True  # False when cut at max_new_tokens without EOS (overlong)
    # The first ``given_token_count`` response tokens were given (a replayed prefix / state), not sampled:
    # they condition the continuation but are masked out of the policy loss.
    given_token_count: int = 0


@dataclass
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@runtime_checkable
class Generator(Protocol):
    def generate(
        self,
        prompts: Sequence[Conversation],
        n: int,
        params: SamplingParams,
        prefixes: Sequence[Sequence[int]] | None = None,
        *,
        seeds: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Rollout]]:
        """Sample ``n`` responses for every chat prompt; result[i][j] is prompt i's j-th sample.

        ``prefixes[i]`` (optional) are response token ids given for prompt i: every sample continues them
        under the original prompt; each Rollout's ``response_token_ids`` starts with the prefix and its
        ``given_token_count`` is ``len(prefixes[i])``. ``max_new_tokens`` counts sampled tokens only.

        ``seeds[i][j]`` (optional, request seeding): sample j of prompt i is drawn from its own seed, so it does
        not depend on what else is in the call or in which order (``params.seed`` is then unused). Without
        seeds every sample comes from the call's one random stream (``params.seed``, else the engine's).
        """
        ...

    def encode_prompt(self, messages: Conversation) -> list[int]:
        """Token ids of a conversation rendered with the chat template and the generation prompt."""
        ...


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt of a generate call: ``n`` samples of ``prompt`` continuing ``prefix`` (given response tokens),
    sample j from ``seeds[j]`` when seeds are given (``Generator.generate``'s arguments for one prompt)."""

    prompt: Conversation
    n: int
    seeds: tuple[int, ...] | None = None
    prefix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"GenerationRequest: n must be >= 1, got {self.n}")
        if self.seeds is not None and len(self.seeds) != self.n:
            raise ValueError(f"GenerationRequest: {len(self.seeds)} seeds for n={self.n} samples")


OnRollout = Callable[[Hashable, int, int, "Rollout | BaseException"], None]
"""on_rollout(call tag, slot, sample index, rollout): one finished sample of a streamed call, from any thread.
An exception in place of the rollout means the sample could not be generated (the stream is broken)."""


class GenerationCall(Protocol):
    """A generate call whose requests arrive over time (``RolloutStream.call``): every slot is either ``put``
    (its request) or ``skip``-ped, exactly once, in any order."""

    def put(self, slot: int, request: GenerationRequest) -> None: ...

    def skip(self, slot: int) -> None: ...


@runtime_checkable
class RolloutStream(Protocol):
    """Generation that reports each sample as it finishes (``StreamingGenerator.open_stream``).

    A call returns exactly what ``Generator.generate`` returns for its put requests in SLOT order (skipped slots
    left out) with the same ``params``: a generator whose samples depend on the batch they are decoded in keeps
    each call's rows in slot order; requests with seeds may be generated in any order and grouping."""

    def call(self, tag: Hashable, slots: int, params: SamplingParams) -> GenerationCall: ...

    def close(self) -> None:
        """Stop generating (work in flight is abandoned); the stream reports nothing after it returns."""
        ...


@runtime_checkable
class StreamingGenerator(Protocol):
    """Optional extension of ``Generator``: streamed generation (the pipelined rubric step, docs/nemo_rl.md)."""

    def open_stream(self, on_rollout: OnRollout) -> RolloutStream: ...


@runtime_checkable
class ResponseDecoder(Protocol):
    """Optional extension of ``Generator`` (both backends have it): response token ids -> text, as the
    generator decodes its samples (penalised-span masks map text spans back to tokens with it)."""

    def decode_response(self, token_ids: Sequence[int]) -> str: ...


@runtime_checkable
class ResponseEncoder(Protocol):
    """Optional extension of ``Generator`` (local backend): response text -> token ids ending with EOS, as a
    finished generation would be (reference solutions); without it the backend's tokenizer is used."""

    def encode_response(self, text: str) -> list[int]: ...


LossFn = Callable[[torch.Tensor, Mapping[str, torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]
"""loss_fn(logprobs [B, T] aligned with input_ids, micro-batch data) -> (scalar loss, metrics).

Losses are globally normalised (they divide by counts computed over the whole batch and carried in the
data), so the policy may split the batch into micro-batches and simply sum their losses/gradients."""


@runtime_checkable
class Policy(Protocol):
    def get_logprobs(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-token log-probs [B, T] of ``data['input_ids']`` under the current weights (no grad)."""
        ...

    def train(self, data: Mapping[str, torch.Tensor], loss_fn: LossFn) -> dict[str, float]:
        """One optimiser step on the whole batch with ``loss_fn``; returns summed metrics. A policy whose class
        sets ``fills_prev_logprobs = True`` (the local backend) takes a batch's missing ``prev_logprobs`` from
        its own training forward, so a caller that needs them only for the loss skips ``get_logprobs``."""
        ...

    def save_checkpoint(self, path: Path) -> None:
        """Write weights + optimiser state (and any sampler RNG) into the NEW directory ``path``, in the
        backend's own format (local: one ``state.pt``; nemo: NeMo-RL's sharded ``weights/`` + ``optimizer/``).
        The orchestration publishes the surrounding checkpoint only after this returns."""
        ...

    def load_checkpoint(self, path: Path) -> None:
        """Restore exactly what ``save_checkpoint(path)`` wrote (a backend that can only load weights when
        its model is built -- NeMo-RL -- was built from this checkpoint and verifies that here)."""
        ...


@runtime_checkable
class FillsPrevLogprobs(Protocol):
    """Optional extension of ``Policy`` (local backend): ``fills_prev_logprobs`` True = ``train`` takes one
    optimiser step per call and fills a batch's missing ``prev_logprobs`` from its own training forward, which
    are pi_old exactly; a caller that needs them only for the loss then skips ``get_logprobs``."""

    fills_prev_logprobs: bool


@runtime_checkable
class StagedPolicy(Protocol):
    """Optional extension of ``Policy`` (local backend): a pipeline stage that starts from the previous stage's
    final weights loads only those (a fresh optimiser; a KL reference, if any, becomes these weights)."""

    def begin_stage(self, checkpoint: Path | None = None) -> None: ...


@runtime_checkable
class Critic(Protocol):
    """A value model V(state) for PPO-style methods (RRL, the PPO baseline)."""

    def get_values(self, data: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Values [B, T] of ``data['input_ids']``: ``values[b, t]`` = V(input_ids[b, :t]) (no grad)."""
        ...

    def train(self, data: Mapping[str, torch.Tensor], loss_fn: LossFn) -> dict[str, float]:
        """One optimiser step of the value model; ``loss_fn(values [B, T], data)`` (clipped value loss)."""
        ...

    def save_checkpoint(self, path: Path) -> None:
        """Write the value model + its optimiser into the NEW directory ``path`` (as ``Policy``)."""
        ...

    def load_checkpoint(self, path: Path) -> None:
        """Restore what ``save_checkpoint(path)`` wrote (as ``Policy``)."""
        ...


@runtime_checkable
class TunableCritic(Protocol):
    """Optional extension of ``Critic`` (local backend): its optimiser, whose learning rate critic pre-training
    sets for its own updates (rise_nemo.steps.critic_pretrain)."""

    optimizer: Any


@dataclass
class JudgeRequest:
    """Judge ``response`` against ``rubric`` in the context of the ORIGINAL conversation (never a hint).

    ``response`` is stored as ``core.rubric.judged_text(response)`` (the answer without a ``<think>``
    block), so every path that asks a judge grades the same text.
    """

    conversation: Conversation
    response: str
    rubric: Rubric
    prompt_id: str = ""

    def __post_init__(self) -> None:
        self.response = judged_text(self.response)


@dataclass
class JudgeStats:
    calls: int = 0
    cache_hits: int = 0
    unknown_verdicts: int = 0
    failures: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Judge(Protocol):
    def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
        """Per-criterion verdicts, result[i][k] for request i and criterion k of its rubric.

        "met" means the criterion's statement holds for the response; for a negative-points criterion that
        means the undesirable behaviour occurred. ``None`` marks a verdict the judge could not obtain.
        """
        ...


@runtime_checkable
class AsyncJudge(Protocol):
    """Optional extension of ``Judge``, for a judge with latency (an LLM behind HTTP, a Ray actor): ``judge``
    without blocking the caller, so responses can be judged while others are generated (the pipelined rubric
    step). The future holds exactly what ``judge`` returns, or raises what it raises (retries, unknown verdicts
    and the failure cap are the judge's own, as for ``judge``)."""

    def judge_async(self, requests: Sequence[JudgeRequest]) -> Future[list[list[Verdict]]]: ...


@runtime_checkable
class CapacityJudge(Protocol):
    """Optional extension of ``AsyncJudge``: how many calls the judge serves at once (``max_concurrency``; None:
    not known) and how much of that a request occupies over its life (``load_of``, in calls: 1.0 = one call slot
    for as long as the longest call takes). A caller that holds requests back (the pipelined step's stream,
    steps.judged_stream) keeps about that much in flight and sends the rest in its own order of urgency; calls sent
    beyond it would wait in the judge's first-come queue instead."""

    max_concurrency: int | None

    def load_of(self, request: JudgeRequest) -> float: ...


@runtime_checkable
class SpanLocatingJudge(Protocol):
    """Optional extension of ``Judge`` (a judge without it still works; nothing is masked then).

    ``locate_spans(request, k)``: character spans [start, end) of ``request.response`` holding the text
    that makes criterion k "met" (for a negative criterion: the penalised text). ``[]`` when the judge
    cannot locate it (a length criterion, an absent quote). Used to mask penalised text out of the
    guide loss (rise_nemo.core.guidance).
    """

    def locate_spans(self, request: JudgeRequest, criterion: int) -> list[tuple[int, int]]: ...


@runtime_checkable
class CountingJudge(Protocol):
    """Optional extension of a judge (rubric or ExpRL's reference judge): its cumulative counters (calls, cache
    hits, retries, failures, ...) as ``judge/<name>`` floats for metrics.jsonl."""

    def metrics(self, prefix: str = "judge/") -> dict[str, float]: ...


@runtime_checkable
class StatsJudge(Protocol):
    """Optional extension of a judge that keeps ``JudgeStats`` (the rule judge) instead of ``metrics()``."""

    stats: JudgeStats


@runtime_checkable
class Verifier(Protocol):
    """Sparse correctness of final answers (the reward of sparse GRPO / PPO / RRL, and pass@k)."""

    def verify(self, problems: Sequence[ReasoningProblem], responses: Sequence[str]) -> list[bool | None]:
        """result[i]: does responses[i] state problems[i].answer? ``None`` = could not be decided."""
        ...


@runtime_checkable
class BatchMetricsVerifier(Protocol):
    """Optional extension of ``Verifier`` (the code reward): metrics of the batch it verified last (the pass
    fraction and outcome kinds), added to the step's metrics."""

    def batch_metrics(self) -> dict[str, float]: ...


class RewardModel(Protocol):
    """A Bradley-Terry reward model (the ``reward_model`` scorer, docs/methods.md "Reward-model reward")."""

    calls: int  # conversations scored so far

    def score(self, conversations: Sequence[Conversation]) -> list[float]:
        """One scalar per conversation: the prompt's messages + the response as the final assistant turn."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class TruncatingRewardModel(Protocol):
    """Optional extension of ``RewardModel`` (local backend): how many of the conversations scored so far were
    cut to the model's max length (the scorer logs ``rm/truncated`` per step)."""

    truncated: int


@dataclass(frozen=True)
class CheckpointLayout:
    """How a run directory keeps its checkpoints, for commands that pick one (`rise-nemo eval --checkpoint`).

    ``rise_nemo.loop.checkpoint.RISE_NEMO_LAYOUT`` is every rise_nemo training loop's; a backend
    whose loop is someone else's (NeMo-RL's distillation, rise_nemo.backends.nemo.checkpoints) provides
    another. Declared here so that backends need not import the orchestration."""

    root: str  # directory under the run directory
    dir_name: Callable[[int], str]  # step -> checkpoint directory name
    list: Callable[[str | Path], list[tuple[int, Path]]]  # run dir -> complete checkpoints, oldest first
    latest: Callable[[str | Path], Path | None]  # run dir -> the one a resume starts from
    is_complete: Callable[[Path], bool]
    load: Callable[[Path, Policy], int]  # (checkpoint, policy) -> its step, policy restored
