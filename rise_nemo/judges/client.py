"""Async client for OpenAI-compatible chat-completions endpoints (``vllm serve``, hosted APIs).

What it guarantees to the judge above it:
- one aiohttp session (one connection pool) per client, at most ``max_concurrency`` requests in flight;
- several base URLs, each request sent to the least-loaded one (fewest in flight, then fewest sent),
  an endpoint that just failed to connect is avoided for a short cool-down, and a retry prefers
  another endpoint;
- a per-attempt timeout; retries with exponential backoff and jitter;
- two retry budgets, because an outage and a bad reply call for different patience:
  * while the judge is *unavailable* (connection refused or reset, HTTP 502/503/504, 429 honouring
    ``Retry-After``) a request keeps retrying until the outage has lasted ``RetryPolicy.deadline_s``
    (default 15 min: a 32B vLLM judge takes minutes to restart), logging "waiting for judge <url>" while
    it waits; no verdict becomes unknown because of an outage shorter than that. The outage clock is the
    client's, started by the first such failure after the last success and reset by any success, so once
    the judge has been gone past the deadline every new request gives up at its first failure;
  * a judge that *answers badly* (a reply that fails strict parsing, HTTP 500 and other errors, no reply
    within the per-attempt timeout) gets ``RetryPolicy.max_attempts`` attempts per request;
- a per-run cap on failed attempts (outage waits excluded; each request given up counts): past it the
  client raises ``JudgeFailureCapExceeded`` instead of letting a broken judge turn a whole run into unknown
  verdicts;
- no retries once the run was asked to stop (rise_nemo.stopping): a failed attempt, or a stop arriving
  during a backoff, raises ``JudgeInterrupted`` at once. On a Slurm requeue or preemption the judge
  servers are killed together with the job, and retrying them would outlast the driver's KillWait;
- structured outputs: ``response_format`` json_schema is sent while an endpoint accepts it; an
  endpoint that rejects it (HTTP 400/422) is switched to free text + strict parsing for the rest of
  the run;
- the API key is read by the caller from an environment variable and never appears in an error
  message or log line of this module (every such text is passed through ``redact``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import aiohttp

from rise_nemo.judges.grading import VerdictParseError, response_format
from rise_nemo.stopping import STOP_REQUESTED, StopInterrupted

log = logging.getLogger("rise_nemo.judges")
T = TypeVar("T")
StructuredMode = Literal["auto", "on", "off"]


class JudgeError(RuntimeError):
    """The judge service cannot be used (misconfiguration, authentication, unavailable)."""


class JudgeFailureCapExceeded(JudgeError):
    """More failed judge calls in this run than ``judge.max_failures`` allows."""


class JudgeInterrupted(JudgeError, StopInterrupted):
    """The run was asked to stop and a judge call failed: not retried (the servers stop with the job)."""


# Failure kinds that mean "the judge is not there right now" (bounded by RetryPolicy.deadline_s), as
# opposed to "it answered, badly" (bounded by RetryPolicy.max_attempts).
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 6  # per request, for replies that came back unusable (first try included)
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    deadline_s: float = 900.0  # how long an outage (no judge reachable) is waited out before giving up

    def delay(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Sleep before attempt ``attempt + 1``: base * 2^(attempt-1), capped, times a jitter in [0.5, 1].

        Jitter keeps thousands of concurrent retries from hitting a recovering server in one wave.
        """
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        wait = ceiling * (0.5 + 0.5 * rng.random())
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.backoff_max_s))
        return wait


@dataclass
class Endpoint:
    base_url: str
    in_flight: int = 0
    sent: int = 0
    down_until: float = 0.0  # monotonic time before which a connection-failed endpoint is avoided
    structured: bool = True  # False once the endpoint rejected response_format


# HTTP attempts of the task that opened ``counting_calls`` and of the tasks it started: the client's counters are
# shared by every caller, so with several judge calls in flight their difference is not one caller's count.
_TASK_CALLS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("rise_judge_task_calls", default=None)


@contextlib.contextmanager
def counting_calls():
    """``with counting_calls() as n:`` ... ``n[0]``: the HTTP attempts (retries included) this task and its child
    tasks made meanwhile."""
    box = [0]
    token = _TASK_CALLS.set(box)
    try:
        yield box
    finally:
        _TASK_CALLS.reset(token)


@dataclass
class ClientCounters:
    calls: int = 0  # HTTP attempts sent
    retries: int = 0
    failures: int = 0  # failed attempts of any kind (the per-run cap counts these)
    timeouts: int = 0
    connection_errors: int = 0
    http_errors: int = 0  # 5xx, 429 and other non-200 statuses
    rate_limited: int = 0  # 429s (also in http_errors)
    parse_errors: int = 0  # replies that were not exactly the asked verdict JSON
    gave_up: int = 0  # requests still failing after max_attempts or the outage deadline (verdicts unknown)
    outages: int = 0  # times the judge became unreachable (each waited out up to RetryPolicy.deadline_s)
    outage_s: float = 0.0  # seconds spent in ended outages
    structured_fallbacks: int = 0
    by_endpoint: dict[str, int] = field(default_factory=dict)


class _Attempt:
    """Outcome of one HTTP attempt: a reply text, or a failure kind with a (redacted) reason."""

    __slots__ = ("text", "kind", "reason", "retry_after")

    def __init__(self, text: str | None = None, kind: str = "", reason: str = "", retry_after: float | None = None):
        self.text, self.kind, self.reason, self.retry_after = text, kind, reason, retry_after


class ChatClient:
    """Must be used (created, called, closed) on one asyncio event loop."""

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str,
        *,
        api_key: str | None = None,
        max_concurrency: int = 64,
        timeout_s: float = 120.0,
        retry: RetryPolicy = RetryPolicy(),
        max_failures: int | None = None,
        structured_outputs: StructuredMode = "auto",
        temperature: float = 0.0,
        extra_body: dict[str, Any] | None = None,
        seed: int = 0,
    ) -> None:
        if not base_urls:
            raise JudgeError("judge.base_urls is empty")
        self.endpoints = [Endpoint(u.rstrip("/")) for u in base_urls]
        self.model = model
        self._api_key = api_key or None
        self.max_concurrency = max_concurrency
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.timeout_s = timeout_s
        self.retry = retry
        self.max_failures = max_failures
        self.structured_outputs = structured_outputs
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        self.counters = ClientCounters()
        self._rng = random.Random(seed)
        self._sem = asyncio.Semaphore(max_concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._last_failure = ""
        self._outage_since: float | None = None  # monotonic start of the current outage; None while reachable
        self._outage_logged = 0.0  # when "waiting for judge" was last logged
        self._capped = 0  # failures counted against max_failures: bad answers and requests given up

    # -- secrets ---------------------------------------------------------------------------------
    def redact(self, text: str) -> str:
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return text

    def __repr__(self) -> str:  # never the key
        return f"ChatClient(model={self.model!r}, endpoints={[e.base_url for e in self.endpoints]})"

    # -- lifecycle -------------------------------------------------------------------------------
    async def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # One pool for all endpoints; its size matches the concurrency limit so no request waits
            # for a socket while holding a concurrency slot.
            connector = aiohttp.TCPConnector(limit=self.max_concurrency, limit_per_host=0, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    # -- endpoint choice -------------------------------------------------------------------------
    def _pick(self, avoid: Endpoint | None) -> Endpoint:
        now = time.monotonic()
        candidates = [e for e in self.endpoints if e is not avoid and e.down_until <= now]
        if not candidates:
            candidates = [e for e in self.endpoints if e.down_until <= now] or self.endpoints
        return min(candidates, key=lambda e: (e.in_flight, e.sent))

    # -- one request with retries ----------------------------------------------------------------
    async def complete(
        self,
        messages: list[dict],
        parse: Callable[[str], T],
        *,
        schema_name: str,
        schema: dict,
        max_tokens: int,
    ) -> T | None:
        """Send a chat request until ``parse(reply)`` succeeds; None (unknown) after ``max_attempts`` unusable
        replies, or once the judge has been unreachable for ``deadline_s`` (module docstring)."""
        avoid: Endpoint | None = None
        attempt = 0  # attempts that count against max_attempts (outage waits do not)
        tries = 0  # every attempt, for the backoff
        while attempt < self.retry.max_attempts:
            attempt += 1
            tries += 1
            async with self._sem:
                # Choose the endpoint only once a slot is free, so the choice sees current loads.
                ep = self._pick(avoid)
                structured = self.structured_outputs == "on" or (self.structured_outputs == "auto" and ep.structured)
                body = self._body(messages, max_tokens, schema_name if structured else None, schema)
                result = await self._send(ep, body)
            if result.kind == "schema_rejected" and self.structured_outputs == "on":
                raise JudgeError(self.redact(
                    f"judge endpoint {ep.base_url} rejected response_format ({result.reason}); it does not "
                    "support structured outputs: set judge.structured_outputs to auto or off"
                ))
            if result.kind == "schema_rejected":
                # The server does not do structured outputs: free text + strict parsing from now on.
                if ep.structured:  # calls already in flight may also bounce; count and log once
                    ep.structured = False
                    self.counters.structured_fallbacks += 1
                    log.warning("judge endpoint %s rejected response_format (%s); using free text + strict parsing",
                                ep.base_url, result.reason)
                attempt -= 1  # not the request's fault; resend at once
                continue
            if result.text is not None:
                try:
                    value = parse(result.text)
                except VerdictParseError as exc:
                    result = _Attempt(kind="parse", reason=str(exc))
                    self.counters.parse_errors += 1
                else:
                    ep.down_until = 0.0
                    self._reachable(ep)
                    return value
            if STOP_REQUESTED.is_set() and result.kind not in ("fatal", "bad_request"):  # would be retried
                raise JudgeInterrupted(self.redact(
                    f"stop requested and a judge call failed ({ep.base_url}: {result.kind}: {result.reason}): "
                    "not retrying"))
            if result.kind == UNAVAILABLE:
                if self._outage_outlasted_deadline(ep, result):
                    break
                attempt -= 1  # waiting out an outage is not the request's fault
            else:
                if result.kind != "timeout":
                    self._reachable(ep)  # it answered (an error, or a reply we could not parse)
                self._record_failure(ep, result)
            if result.kind == "fatal":
                raise JudgeError(self.redact(f"judge endpoint {ep.base_url}: {result.reason}"))
            if result.kind == "bad_request":
                break  # this request cannot succeed (e.g. prompt too long): unknown, no retries
            avoid = ep if len(self.endpoints) > 1 else None
            if attempt < self.retry.max_attempts:
                self.counters.retries += 1
                await self._backoff(self.retry.delay(tries, self._rng, result.retry_after))
        self.counters.gave_up += 1
        log.debug("judge request gave up after %d attempts; last failure: %s", tries, self._last_failure)
        self._count_failure()  # each request given up counts against the run's cap, outages included
        return None

    # -- outages ---------------------------------------------------------------------------------
    def _outage_outlasted_deadline(self, ep: Endpoint, result: _Attempt) -> bool:
        """Record an unavailable attempt; True once the outage has lasted ``deadline_s`` (give up)."""
        now = time.monotonic()
        self.counters.failures += 1
        self._last_failure = self.redact(f"{ep.base_url}: {result.kind}: {result.reason}")
        ep.down_until = now + min(self.retry.backoff_max_s, 1.0)  # let other replicas absorb its load
        if self._outage_since is None:
            self._outage_since = self._outage_logged = now
            self.counters.outages += 1
            log.warning("waiting for judge %s (%s); retrying for up to %.0f s", ep.base_url, self._last_failure,
                        self.retry.deadline_s)
        waited = now - self._outage_since
        if waited >= self.retry.deadline_s:
            return True
        if now - self._outage_logged >= 30.0:
            self._outage_logged = now
            log.warning("still waiting for judge %s: unreachable for %.0f s of %.0f s", ep.base_url, waited,
                        self.retry.deadline_s)
        return False

    def _reachable(self, ep: Endpoint) -> None:
        """A reply arrived: an outage in progress is over."""
        if self._outage_since is not None:
            waited = time.monotonic() - self._outage_since
            self._outage_since = None
            self.counters.outage_s += waited
            log.warning("judge %s answers again after %.1f s", ep.base_url, waited)

    async def _backoff(self, delay: float) -> None:
        """Sleeps ``delay`` s before a retry; raises ``JudgeInterrupted`` as soon as a stop is requested."""
        end = time.monotonic() + delay
        while not STOP_REQUESTED.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.2))
        raise JudgeInterrupted(f"stop requested while waiting to retry a failed judge call ({self._last_failure}): "
                               "not retrying")

    def _body(self, messages: list[dict], max_tokens: int, schema_name: str | None, schema: dict) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": max_tokens,
        }
        body.update(self.extra_body)
        if schema_name is not None:
            body["response_format"] = response_format(schema_name, schema)
        return body

    def _record_failure(self, ep: Endpoint, result: _Attempt) -> None:
        """An attempt the judge answered badly (or not in time): counted, and against the run's cap."""
        self.counters.failures += 1
        self._last_failure = self.redact(f"{ep.base_url}: {result.kind}: {result.reason}")
        log.debug("judge attempt failed: %s", self._last_failure)
        self._count_failure()

    def _count_failure(self) -> None:
        self._capped += 1
        if self.max_failures is not None and self._capped > self.max_failures:
            raise JudgeFailureCapExceeded(
                f"judge: {self._capped} failed calls exceed judge.max_failures={self.max_failures}; "
                f"last failure: {self._last_failure}"
            )

    async def _send(self, ep: Endpoint, body: dict) -> _Attempt:
        """One HTTP attempt; the caller holds a concurrency slot."""
        session = await self._ensure_session()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        url = f"{ep.base_url}/chat/completions"
        ep.in_flight += 1
        ep.sent += 1
        self.counters.calls += 1
        task_calls = _TASK_CALLS.get()
        if task_calls is not None:
            task_calls[0] += 1
        self.counters.by_endpoint[ep.base_url] = self.counters.by_endpoint.get(ep.base_url, 0) + 1
        try:
            async with session.post(url, json=body, headers=headers) as resp:
                status = resp.status
                raw = await resp.read()
                retry_after = _retry_after(resp.headers.get("Retry-After"))
        except TimeoutError:
            self.counters.timeouts += 1
            return _Attempt(kind="timeout", reason=f"no reply within {self.timeout_s:g} s")
        except (aiohttp.ClientError, OSError) as exc:
            self.counters.connection_errors += 1
            return _Attempt(kind=UNAVAILABLE, reason=self.redact(f"connection: {type(exc).__name__}: {exc}"))
        finally:
            ep.in_flight -= 1
        return self._interpret(status, raw, retry_after, "response_format" in body)

    def _interpret(self, status: int, raw: bytes, retry_after: float | None, sent_schema: bool) -> _Attempt:
        snippet = self.redact(raw[:300].decode("utf-8", "replace"))
        if status == 200:
            try:
                data = json.loads(raw)
                text = data["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                self.counters.parse_errors += 1
                return _Attempt(kind="parse", reason=f"malformed chat-completions body: {snippet!r}")
            if not isinstance(text, str):
                self.counters.parse_errors += 1
                return _Attempt(kind="parse", reason="reply has no text content")
            return _Attempt(text=text)
        self.counters.http_errors += 1
        reason = f"HTTP {status}: {snippet!r}"
        if status == 429:
            self.counters.rate_limited += 1
            return _Attempt(kind=UNAVAILABLE, reason=reason, retry_after=retry_after)
        if status in (502, 503, 504):  # a proxy or load balancer in front of a judge that is (re)starting
            return _Attempt(kind=UNAVAILABLE, reason=reason, retry_after=retry_after)
        if status >= 500:
            return _Attempt(kind="http", reason=reason, retry_after=retry_after)
        if status in (401, 403):
            return _Attempt(kind="fatal", reason=f"HTTP {status}: authentication refused (check judge.api_key_env)")
        if status == 404:
            return _Attempt(kind="fatal", reason=f"{reason} (check judge.base_urls and judge.model)")
        if status in (400, 422) and sent_schema:
            return _Attempt(kind="schema_rejected", reason=reason)
        if status in (408, 409, 425):
            return _Attempt(kind="http", reason=reason)
        return _Attempt(kind="bad_request", reason=reason)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff


class LoopThread:
    """An asyncio event loop in a daemon thread, so synchronous callers (the Judge protocol, Ray actor
    threads) can run the async client without owning a loop, and the client's session lives on one loop."""

    def __init__(self, name: str = "rise-judge-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.run called from its own loop thread (would deadlock)")
        return self.submit(coro).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; its result (or exception) arrives in the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()
