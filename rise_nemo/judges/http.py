"""LLM rubric judge over an OpenAI-compatible chat-completions API (``vllm serve`` or a hosted API).

``HttpJudge`` implements ``rise_nemo.interfaces.Judge``: ``judge(requests)`` returns one verdict per
criterion of each request's rubric (``True`` = the criterion's statement holds; for a negative-points
criterion that means the undesirable behaviour occurred; ``None`` = unknown after retries). The training
side excludes a response with any unknown verdict from rewards, advantages and failure counts.

Config (the recipe's ``judge:`` block; see recipes/judge/*.yaml and ``HttpJudgeConfig``)::

    judge:
      type: http
      mode: batched            # or per_criterion
      model: openai/gpt-oss-120b
      base_urls: [http://judge-0:8000/v1, http://judge-1:8000/v1]
      api_key_env: JUDGE_API_KEY   # the key itself only ever lives in that environment variable

Counters for the training loop's metrics: ``judge.stats`` (a ``JudgeStats``, cumulative over the
judge's life) and ``judge.metrics()`` (the same as ``{"judge/<name>": float}``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from rise_nemo.core.rubric import Criterion
from rise_nemo.interfaces import JudgeRequest, JudgeStats, Verdict
from rise_nemo.judges import grading
from rise_nemo.judges.cache import VerdictCache, criterion_key, request_digest
from rise_nemo.judges.client import (
    ChatClient,
    JudgeError,
    JudgeFailureCapExceeded,
    LoopThread,
    RetryPolicy,
    counting_calls,
)
from rise_nemo.judges.stats import stats_to_metrics

__all__ = [
    "HttpJudge",
    "HttpJudgeConfig",
    "JudgeError",
    "JudgeFailureCapExceeded",
    "build_http_judge",
    "stats_to_metrics",
]

log = logging.getLogger("rise_nemo.judges")


@dataclass(frozen=True)
class HttpJudgeConfig:
    base_urls: tuple[str, ...]
    model: str
    mode: str = "per_criterion"  # grading.MODES
    batch_size: int = 10  # batched mode: at most this many criteria per call
    api_key_env: str | None = None  # name of the environment variable holding the key (never the key)
    max_concurrency: int = 64  # requests in flight, over all base URLs
    timeout_s: float = 120.0  # per attempt
    # Retries: RetryPolicy's defaults (rise_nemo.judges.client), under the judge block's names.
    max_attempts: int = RetryPolicy.max_attempts  # per request, for unusable replies / errors / timeouts, first try included
    backoff_base_s: float = RetryPolicy.backoff_base_s
    backoff_max_s: float = RetryPolicy.backoff_max_s
    retry_deadline_s: float = RetryPolicy.deadline_s  # an outage (judge unreachable, 502/503/504, 429) is waited out this long
    max_failures: int | None = 10000  # failed attempts per run before the run is stopped; None = no cap
    structured_outputs: str = "auto"  # auto (use, fall back if rejected) | on | off
    temperature: float = 0.0
    max_tokens: int | None = None  # None: 512 per criterion call, 64 + 16 n for a batch of n
    max_explanation_chars: int = 600  # per-criterion schema bound on "explanation"
    extra_body: Mapping[str, Any] | None = None  # merged into every request body (e.g. reasoning_effort)
    cache: bool = True
    cache_path: str | None = None  # SQLite file that keeps verdicts across restarts
    progress: bool = False  # tqdm bar per judge() call
    seed: int = 0  # backoff jitter
    ray_actor: bool = False  # run inside a CPU-only Ray actor (rise_nemo.judges.ray_actor)
    ray_num_cpus: float = 0.5
    ray_timeout_s: float = 3600.0  # upper bound on one judge() call through the actor
    ray_start_timeout_s: float = 300.0  # upper bound on the actor's start (a worker process on a busy node)

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any], where: str = "judge") -> HttpJudgeConfig:
        """Validate a ``judge:`` block; every error names the offending key."""
        data = _plain(cfg)
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
        data = dict(data)
        data.pop("type", None)  # the factory's dispatch key
        for secret_key in ("api_key", "key", "token", "authorization"):
            if secret_key in data:
                raise ValueError(
                    f"{where}.{secret_key}: API keys must not be written in configs; put the key in an "
                    f"environment variable and name it in {where}.api_key_env"
                )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")
        for required in ("base_urls", "model"):
            if required not in data or data[required] in (None, "", []):
                raise ValueError(f"{where}.{required} is required")
        urls = data["base_urls"]
        if isinstance(urls, str):
            urls = [urls]
        if not isinstance(urls, list | tuple) or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"{where}.base_urls: expected a list of http(s):// URLs, got {urls!r}")
        data["base_urls"] = tuple(urls)
        out = cls(**data)
        out._check(where)
        return out

    def _check(self, where: str) -> None:
        def bad(key: str, why: str) -> ValueError:
            return ValueError(f"{where}.{key}: {why}, got {getattr(self, key)!r}")

        if self.mode not in grading.MODES:
            raise bad("mode", f"expected one of {grading.MODES}")
        if self.structured_outputs not in ("auto", "on", "off"):
            raise bad("structured_outputs", "expected auto, on or off")
        for key in ("batch_size", "max_concurrency", "max_attempts"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(key, "expected an integer >= 1")
        for key in ("timeout_s", "backoff_base_s", "backoff_max_s", "retry_deadline_s", "ray_num_cpus", "ray_timeout_s",
                    "ray_start_timeout_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise bad(key, "expected a number >= 0")
        if self.max_failures is not None and (not isinstance(self.max_failures, int) or self.max_failures < 0):
            raise bad("max_failures", "expected an integer >= 0 or null")
        if self.api_key_env is not None and not isinstance(self.api_key_env, str):
            raise bad("api_key_env", "expected the NAME of an environment variable")

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.backoff_base_s, self.backoff_max_s, self.retry_deadline_s)

    def api_key(self) -> str | None:
        """The key from the environment (never stored on the config)."""
        if not self.api_key_env:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise JudgeError(f"judge.api_key_env names {self.api_key_env}, but that environment variable is not set")
        return value

    def load_of(self, request: JudgeRequest) -> float:
        """interfaces.CapacityJudge: the call slots judging ``request`` occupies (without cache hits). Per criterion:
        one call each, all about as long. Batched: a call's time grows with its reply, i.e. with its criteria, so
        ``criteria / batch_size`` (11 criteria in calls of 6 and 5: 1.83 slots of a full call's time)."""
        n = len(request.rubric.criteria)
        return float(n) if self.mode == "per_criterion" else n / self.batch_size

    def tokens_for(self, n_criteria: int) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return 512 if self.mode == "per_criterion" else 64 + 16 * n_criteria


def _plain(cfg: Any) -> Any:
    try:  # OmegaConf DictConfig -> plain containers, interpolations resolved
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(cfg, DictConfig | ListConfig):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        pass
    return dict(cfg) if isinstance(cfg, Mapping) else cfg


@dataclass
class _Unit:
    """One judge call: some criteria of one response (1 in per-criterion mode, <= batch_size batched)."""

    request: JudgeRequest
    criteria: list[Criterion]
    keys: list[str]


class HttpJudge:
    """The LLM judge. Thread-safe; ``judge`` may be called from any thread except its own loop's."""

    def __init__(self, config: HttpJudgeConfig) -> None:
        self.config = config
        self._api_key = config.api_key()
        self._template = grading.TEMPLATE_VERSION[config.mode]
        self._cache = VerdictCache(config.cache_path) if config.cache else None
        self._cache_hits = 0
        self._unknown_verdicts = 0
        self._unknown_responses = 0
        self._verdicts = 0
        self._loop = LoopThread()
        self._client: ChatClient | None = None
        self._finalizer = weakref.finalize(self, HttpJudge._shutdown, self._loop, self._cache, [None])

    def __repr__(self) -> str:
        c = self.config
        return f"HttpJudge(mode={c.mode!r}, model={c.model!r}, base_urls={list(c.base_urls)!r})"

    @property
    def max_concurrency(self) -> int:
        """interfaces.CapacityJudge: the client's limit on calls in flight (judge.max_concurrency)."""
        return self.config.max_concurrency

    def load_of(self, request: JudgeRequest) -> float:
        return self.config.load_of(request)

    # -- public API (interfaces.Judge) -------------------------------------------------------------
    def judge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
        return self._loop.run(self.ajudge(requests))

    def judge_async(self, requests: Sequence[JudgeRequest]) -> concurrent.futures.Future[list[list[Verdict]]]:
        """interfaces.AsyncJudge: ``judge`` without blocking; the verdicts (or the error ``judge`` would raise)
        arrive in the future. Calls in flight share the client's concurrency limit, retries and failure cap."""
        _check_requests(requests)
        return self._loop.submit(self.ajudge(requests))

    async def ajudge(self, requests: Sequence[JudgeRequest]) -> list[list[Verdict]]:
        """Coroutine form of ``judge``; must run on this judge's loop (``judge`` does that for you)."""
        _check_requests(requests)
        client = self._get_client()
        started, hits = time.monotonic(), 0
        verdicts: list[list[Verdict]] = [[None] * len(r.rubric.criteria) for r in requests]
        owners: dict[str, list[tuple[int, int]]] = {}  # verdict key -> every (request, criterion) slot
        first: list[list[tuple[Criterion, str]]] = [[] for _ in requests]  # uncached work per request
        for i, req in enumerate(requests):
            digest = request_digest(self.config.model, self._template, req.conversation, req.response)
            for k, crit in enumerate(req.rubric.criteria):
                key = criterion_key(digest, crit)
                hit = self._cache.get(key) if self._cache is not None else None
                if hit is not None:
                    verdicts[i][k] = hit
                    hits += 1
                    continue
                if key not in owners:  # identical triples in one batch are judged once
                    owners[key] = []
                    first[i].append((crit, key))
                owners[key].append((i, k))
        self._cache_hits += hits
        units = self._plan_units(requests, first)
        with counting_calls() as calls:  # this call's own, not those of concurrent judge_async calls
            results = await self._run_units(client, units)  # key -> verdict
        if self._cache is not None:
            self._cache.put_many({k: v for k, v in results.items() if v is not None})
        for key, slots in owners.items():
            for i, k in slots:
                verdicts[i][k] = results.get(key)
        unknown = self._count(verdicts)
        log.info(
            "judged %d verdicts of %d responses in %.1f s: %d calls, %d cache hits, %d unknown",
            sum(map(len, verdicts)), len(requests), time.monotonic() - started,
            calls[0], hits, unknown,
        )
        return verdicts

    @property
    def stats(self) -> JudgeStats:
        c = self._client.counters if self._client is not None else None
        extra = {
            "retries": float(c.retries if c else 0),
            "timeouts": float(c.timeouts if c else 0),
            "connection_errors": float(c.connection_errors if c else 0),
            "http_errors": float(c.http_errors if c else 0),
            "rate_limited": float(c.rate_limited if c else 0),
            "parse_errors": float(c.parse_errors if c else 0),
            "gave_up": float(c.gave_up if c else 0),
            "outages": float(c.outages if c else 0),
            "outage_s": float(c.outage_s if c else 0),
            "structured_fallbacks": float(c.structured_fallbacks if c else 0),
            "unknown_responses": float(self._unknown_responses),
            "verdicts": float(self._verdicts),
        }
        return JudgeStats(
            calls=c.calls if c else 0,
            cache_hits=self._cache_hits,
            unknown_verdicts=self._unknown_verdicts,
            failures=c.failures if c else 0,
            extra=extra,
        )

    def metrics(self, prefix: str = "judge/") -> dict[str, float]:
        return stats_to_metrics(self.stats, prefix)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> HttpJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------
    def _get_client(self) -> ChatClient:
        if self._client is None:
            c = self.config
            self._client = ChatClient(
                c.base_urls,
                c.model,
                api_key=self._api_key,
                max_concurrency=c.max_concurrency,
                timeout_s=c.timeout_s,
                retry=c.retry_policy(),
                max_failures=c.max_failures,
                structured_outputs=c.structured_outputs,  # type: ignore[arg-type]
                temperature=c.temperature,
                extra_body=dict(c.extra_body or {}),
                seed=c.seed,
            )
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, HttpJudge._shutdown, self._loop, self._cache, [self._client])
        return self._client

    def _plan_units(self, requests: Sequence[JudgeRequest], first: list[list[tuple[Criterion, str]]]) -> list[_Unit]:
        size = 1 if self.config.mode == "per_criterion" else self.config.batch_size
        units = []
        for req, work in zip(requests, first):
            for start in range(0, len(work), size):
                chunk = work[start : start + size]
                units.append(_Unit(req, [c for c, _ in chunk], [k for _, k in chunk]))
        return units

    async def _run_units(self, client: ChatClient, units: list[_Unit]) -> dict[str, Verdict]:
        results: dict[str, Verdict] = {}
        bar = _progress(len(units), self.config.progress)
        # At most 2x the concurrency limit of units hold a rendered prompt at a time, so 30,000 pending
        # verdicts do not mean 30,000 prompts (several KB each) in memory at once.
        gate = asyncio.Semaphore(2 * self.config.max_concurrency)

        async def run(unit: _Unit) -> None:
            async with gate:
                got = await self._judge_unit(client, unit)  # [len(unit.keys)] bools or Nones
            results.update(zip(unit.keys, got))
            if bar is not None:
                bar.update(1)

        try:
            # A TaskGroup cancels every other call as soon as one raises (e.g. the failure cap).
            async with asyncio.TaskGroup() as tg:
                for unit in units:
                    tg.create_task(run(unit))
        except* JudgeError as group:
            raise group.exceptions[0] from None
        finally:
            if bar is not None:
                bar.close()
        return results

    async def _judge_unit(self, client: ChatClient, unit: _Unit) -> list[Verdict]:
        req, n = unit.request, len(unit.criteria)
        if self.config.mode == "per_criterion":
            messages = grading.per_criterion_messages(req.conversation, req.response, unit.criteria[0])
            met = await client.complete(
                messages,
                grading.parse_per_criterion,
                schema_name="criterion_verdict",
                schema=grading.per_criterion_schema(self.config.max_explanation_chars),
                max_tokens=self.config.tokens_for(1),
            )
            return [met]
        messages = grading.batched_messages(req.conversation, req.response, unit.criteria)
        got = await client.complete(
            messages,
            lambda reply: grading.parse_batched(reply, n),
            schema_name="rubric_verdicts",
            schema=grading.batched_schema(n),
            max_tokens=self.config.tokens_for(n),
        )
        return list(got) if got is not None else [None] * n

    def _count(self, verdicts: list[list[Verdict]]) -> int:
        total = 0
        for row in verdicts:
            self._verdicts += len(row)
            unknown = sum(v is None for v in row)
            self._unknown_verdicts += unknown
            self._unknown_responses += unknown > 0
            total += unknown
        return total

    @staticmethod
    def _shutdown(loop: LoopThread, cache: VerdictCache | None, client_box: list) -> None:
        client = client_box[0]
        if client is not None and loop.loop.is_running():
            try:
                loop.run(client.close(), timeout=5)
            except Exception as exc:  # closing is best effort; never mask the caller's own error
                log.debug("judge client close failed: %s", type(exc).__name__)
        loop.stop()
        if cache is not None:
            cache.close()


def _check_requests(requests: Sequence[JudgeRequest]) -> None:
    """Fail before any call, naming the request, rather than deep inside a concurrent task."""
    for i, req in enumerate(requests):
        where = f"judge request {i} (prompt_id {req.prompt_id!r})"
        if not isinstance(req.response, str):
            raise ValueError(f"{where}: response must be a string, got {type(req.response).__name__}")
        for j, msg in enumerate(req.conversation):
            if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
                raise ValueError(f"{where}: conversation message {j} needs string 'role' and 'content', got {msg!r}")


def _progress(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="judge calls", unit="call", leave=False)


def build_http_judge(cfg: Mapping[str, Any]):
    """Factory used by ``rise_nemo.judges.build_judge`` for ``judge.type: http``.

    Returns an ``HttpJudge``, or a ``RayJudge`` wrapping one when ``ray_actor: true``.
    """
    config = HttpJudgeConfig.from_mapping(cfg)
    if config.ray_actor:
        from rise_nemo.judges.ray_actor import RayJudge

        inner = {**_plain(cfg), "ray_actor": False}
        return RayJudge(
            "rise_nemo.judges.http:build_http_judge",
            inner,
            num_cpus=config.ray_num_cpus,
            timeout_s=config.ray_timeout_s,
            start_timeout_s=config.ray_start_timeout_s,
            max_concurrency=config.max_concurrency,
            load_of=config.load_of,
        )
    return HttpJudge(config)
