"""The judge of the judged suites (healthbench, writingbench, arena_hard, hh_win_rate).

A suite describes each judge call as a ``JudgeCall``: the chat messages an LLM judge reads (the suite's
public grader prompt), ``parse`` (reply -> value; raises ``VerdictParseError`` on an unusable reply, which
is retried) and ``max_tokens``. Two judges run them:

- ``RuleEvalJudge`` (default; no model): a deterministic "model" that reads the same prompt and replies in
  the suite's protocol (``rule_reply``: each judged suite registers a marker of its prompt and a reply
  function in ``RULE_REPLIES``); the reply goes through the same ``parse``. The loopback rule server
  (rise_nemo.judges.rule_server) answers these prompts with the same function, so the HTTP path can be run
  end to end on CPU and must agree with the rule judge. The rules are simple, documented text checks
  (docs/evals.md): NOT a measure of quality; the result records ``judge.type = rule``.
- ``HttpEvalJudge``: an OpenAI-compatible endpoint through the project's ``ChatClient`` (retries with
  backoff, several endpoints, failure cap; greedy decoding, free text parsed strictly). A call whose reply
  stays unusable after the retries is ``None`` (unknown): the suites leave it out and count it. With a
  cache file (``use_cache``; `rise-nemo score` keeps ``<out>/<suite>.judge_cache.jsonl``) every parsed
  answer is appended as it arrives, keyed by a hash of (judge model, messages): an interrupted scoring run
  resumes without asking again, and unknowns are asked again.

Every result records ``{"type", "model", "prompt_version"}`` (``SuiteResult.judge``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rise_nemo.errors import UserError


@dataclass(frozen=True)
class JudgeCall:
    messages: list[dict[str, str]]
    parse: Callable[[str], Any]
    max_tokens: int = 2048


# marker that identifies a suite's judge prompt -> "module:function(prompt) -> reply text"
RULE_REPLIES: dict[str, str] = {
    "# Rubric item\n": "rise_nemo.evals.healthbench:rule_reply",
    "Evaluate the Response based on the Query and Criteria": "rise_nemo.evals.writingbench:rule_reply",
    "<|The Start of Assistant A's Answer|>": "rise_nemo.evals.arena_hard:rule_reply",
    "<|Reply A|>": "rise_nemo.evals.hh_win_rate:rule_reply",
}


def rule_reply(prompt: str) -> str | None:
    """The rule judge's reply to one of the suites' judge prompts; None when it is none of them."""
    import importlib

    for marker, target in RULE_REPLIES.items():
        if marker in prompt:
            module, fn = target.split(":")
            return getattr(importlib.import_module(module), fn)(prompt)
    return None


def prompt_text(messages: Sequence[Mapping[str, str]]) -> str:
    return "\n".join(m.get("content", "") for m in messages if m.get("role") == "user")


class RuleEvalJudge:
    kind = "rule"
    model = "rule"

    def __init__(self) -> None:
        self.calls = 0

    def run(self, calls: Sequence[JudgeCall]) -> list[Any]:
        self.calls += len(calls)
        out = []
        for c in calls:
            reply = rule_reply(prompt_text(c.messages))
            if reply is None:
                raise ValueError("the rule judge got a prompt of no suite (no RULE_REPLIES marker)")
            out.append(c.parse(reply))
        return out

    def describe(self, prompt_version: str) -> dict[str, Any]:
        return {"type": self.kind, "model": self.model, "prompt_version": prompt_version, "calls": self.calls}

    def use_cache(self, path: str | Path) -> None:
        """The rule judge is free: nothing to keep."""

    def close(self) -> None:
        pass


class HttpEvalJudge:
    kind = "http"

    def __init__(self, base_urls: Sequence[str], model: str, api_key_env: str | None = None, **options: Any):
        from rise_nemo.errors import require_extra

        require_extra("judge", "aiohttp", what="an HTTP judge (--judge-url)")
        from rise_nemo.judges.client import LoopThread
        from rise_nemo.judges.http import HttpJudgeConfig

        try:
            self.config = HttpJudgeConfig.from_mapping({"base_urls": list(base_urls), "model": model,
                                                        "api_key_env": api_key_env, **options}, where="--judge")
            key = self.config.api_key()
        except ValueError as exc:
            raise UserError(str(exc)) from None
        self.model = model
        self._loop = LoopThread("rise-eval-judge-loop")
        self._client = self._make_client(key)
        self.unknown = 0
        self.cache_hits = 0
        self._cache: dict[str, Any] = {}
        self._cache_path: Path | None = None
        self._finalizer = weakref.finalize(self, HttpEvalJudge._shutdown, self._loop, self._client)

    def _make_client(self, key: str | None) -> Any:
        from rise_nemo.judges.client import ChatClient

        c = self.config
        return ChatClient(c.base_urls, c.model, api_key=key, max_concurrency=c.max_concurrency,
                          timeout_s=c.timeout_s, retry=c.retry_policy(), max_failures=c.max_failures,
                          structured_outputs="off", temperature=0.0, extra_body=dict(c.extra_body or {}),
                          seed=c.seed)

    def use_cache(self, path: str | Path) -> None:
        """Keep answers in the JSONL file ``path`` (read now, appended to as answers arrive)."""
        from rise_nemo.evals.base import read_jsonl_rows

        self._cache_path = Path(path)
        if self._cache_path.is_file():
            for where, row in read_jsonl_rows(self._cache_path):
                if not isinstance(row, Mapping) or "key" not in row or "value" not in row:
                    raise UserError(f"{where}: not a judge cache row (keys 'key', 'value'); delete the file to start over")
                self._cache[row["key"]] = row["value"]

    def _key(self, call: JudgeCall) -> str:
        import hashlib
        import json

        blob = json.dumps([self.model, call.messages], ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()

    def run(self, calls: Sequence[JudgeCall]) -> list[Any]:
        keys = [self._key(c) for c in calls]
        out: list[Any] = [self._cache.get(k) for k in keys]
        todo = [i for i, k in enumerate(keys) if k not in self._cache]
        self.cache_hits += len(calls) - len(todo)
        got = self._loop.run(self._run([calls[i] for i in todo])) if todo else []
        fresh = {}
        for i, value in zip(todo, got):
            out[i] = value
            if value is not None:
                fresh[keys[i]] = value
        self._cache.update(fresh)
        if fresh and self._cache_path is not None:
            import json
            import os

            with self._cache_path.open("a", encoding="utf-8") as fh:
                fh.writelines(json.dumps({"key": k, "value": v}) + "\n" for k, v in fresh.items())
                fh.flush()
                os.fsync(fh.fileno())
        return out

    async def _run(self, calls: list[JudgeCall]) -> list[Any]:
        import asyncio

        async def one(call: JudgeCall) -> Any:
            return await self._client.complete(call.messages, call.parse, schema_name="eval_judge", schema={},
                                               max_tokens=call.max_tokens)

        out = await asyncio.gather(*(one(c) for c in calls))
        self.unknown += sum(v is None for v in out)
        return list(out)

    def describe(self, prompt_version: str) -> dict[str, Any]:
        c = self._client.counters
        return {"type": self.kind, "model": self.model, "prompt_version": prompt_version,
                "base_urls": list(self.config.base_urls), "calls": c.calls, "retries": c.retries,
                "unknown": self.unknown, "cache_hits": self.cache_hits}

    def close(self) -> None:
        self._finalizer()

    @staticmethod
    def _shutdown(loop: Any, client: Any) -> None:
        if loop.loop.is_running():
            try:
                loop.run(client.close(), timeout=5)
            except Exception:  # best effort; never mask the caller's error
                pass
        loop.stop()


def build_eval_judge(base_urls: Sequence[str] | None, model: str | None, api_key_env: str | None = None,
                     options: Sequence[str] = ()):
    """No URL: the rule judge. URLs: the HTTP judge (``--judge-model`` required; ``options``: KEY=VALUE
    settings of rise_nemo.judges.http.HttpJudgeConfig, values read as YAML)."""
    if not base_urls:
        if model or api_key_env or options:
            raise UserError("--judge-model / --judge-api-key-env / --judge-option need --judge-url")
        return RuleEvalJudge()
    if not model:
        raise UserError("--judge-url needs --judge-model (the model name the endpoint serves)")
    import yaml

    extra = {}
    for item in options:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--judge-option {item!r}: expected KEY=VALUE")
        extra[key] = yaml.safe_load(value)
    return HttpEvalJudge(base_urls, model, api_key_env, **extra)


def run_batched(judge: Any, calls: Sequence[JudgeCall], progress: Callable[[str], None] | None, what: str,
                chunk: int = 256) -> list[Any]:
    """``judge.run`` over chunks of ``calls`` with a progress line per chunk (long judged runs)."""
    out: list[Any] = []
    for start in range(0, len(calls), chunk):
        out += judge.run(calls[start:start + chunk])
        if progress is not None and len(calls) > chunk:
            progress(f"{what}: {len(out)}/{len(calls)} judge calls")
    return out


def judge_pairs(judge: Any, items: Sequence[Any], samples: Mapping[int, list[str]],
                baseline: Mapping[int, list[str]], messages: Callable[[Any, str, str], list[dict[str, str]]],
                parse: Callable[[str], Any], progress: Callable[[str], None] | None,
                what: str) -> list[tuple[int, int, Any, Any]]:
    """Every sample against the baseline, judged twice with the positions swapped.

    Sample s of item i meets baseline sample ``s mod len(baseline[i])``. Game 1 shows the baseline as
    assistant A and ours as B; game 2 shows ours as A and the baseline as B (Arena-Hard-Auto's
    ``gen_judgment.py`` order). ``messages(item, answer_a, answer_b)`` builds a call. Returns
    ``(index, sample, verdict of game 1, verdict of game 2)`` as parsed (None = unknown)."""
    calls, where = [], []
    for item in items:
        theirs = baseline.get(item.index)
        if not theirs:
            raise UserError(f"{what}: the baseline has no response for index {item.index}")
        for s, ours in enumerate(samples.get(item.index, [])):
            other = theirs[s % len(theirs)]
            calls += [JudgeCall(messages(item, other, ours), parse), JudgeCall(messages(item, ours, other), parse)]
            where.append((item.index, s))
    verdicts = run_batched(judge, calls, progress, what)
    return [(i, s, verdicts[2 * k], verdicts[2 * k + 1]) for k, (i, s) in enumerate(where)]


def field_between(prompt: str, start: str, end: str) -> str:
    """The text between the first ``start`` and the next ``end`` (rule replies read prompts naively)."""
    a = prompt.find(start)
    b = prompt.find(end, a + len(start)) if a >= 0 else -1
    if a < 0 or b < 0:
        raise ValueError(f"prompt has no {start!r} ... {end!r} field")
    return prompt[a + len(start):b]


def length_preference(a: str, b: str) -> int:
    """The pairwise rule judge: +1 when answer A is over 1.2 times as long as B (in words), -1 the other way,
    0 otherwise; +2 / -2 when over 3 times (a "significantly better")."""
    la, lb = len(a.split()) + 1, len(b.split()) + 1
    if la > 3 * lb or lb > 3 * la:
        return 2 if la > lb else -2
    if la > 1.2 * lb or lb > 1.2 * la:
        return 1 if la > lb else -1
    return 0
