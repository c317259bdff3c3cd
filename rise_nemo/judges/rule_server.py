"""A small OpenAI-compatible chat-completions server whose "model" grades by deterministic rules.

It reads the judge prompts of ``rise_nemo.judges.grading`` the way a (naive) LLM would — it finds the
fenced fields by their marker names, ignoring the tags — grades each criterion with ``rule_verdict``, and
answers in the protocol of the prompt's mode. It exists so the real HTTP judge client can be tested and
benchmarked over real sockets on 127.0.0.1 (tests/judges, bench/judge_throughput.py) with:

- a latency model of an LLM judge: each call takes ``latency_s + latency_per_token_s * reply tokens`` (a
  prefill-and-queue constant plus the decode time of the reply it sends, ``reply_tokens``), and at most
  ``max_concurrency`` calls are served at once (the rest wait, as requests beyond a vLLM server's batch do);
  a concurrency high-water mark;
- injected faults, scripted (``script``: one fault name per incoming request, in order), by content
  (``fault_when``: regex -> fault name, for every request whose graded response matches; the same requests fail
  whatever order they arrive in) or random (``rates``: fault name -> probability, seeded): ``500``, ``429``,
  ``timeout`` (sleeps ``hang_s``),
  ``malformed`` (invalid JSON), ``wrong_count`` (a batched reply missing a key / a per-criterion reply
  with an extra key), ``drop`` (closes the connection without a reply), ``echo`` (quotes the graded
  response before the verdict JSON), ``bad_value`` (a verdict value outside the protocol);
- optional rejection of ``response_format`` (a server without structured outputs) and of requests
  without the expected bearer key (``api_key``; the error body then echoes the Authorization header, so
  tests can check that the client redacts it);
- a hold trigger (``hold_trigger``, a file path): once that file exists, the server answers the number of
  further requests written in it (empty: none), then deletes it, creates ``<trigger>.held`` and answers
  nothing more: a judge that stopped answering in the middle of a call. Tests use it to put a client
  deterministically inside a judge call before they kill the server or signal the job (no sleeps); a
  restarted server finds no trigger and answers normally;
- prompts of the layers above (``extra_replies``: e.g. ``rise_nemo.evals.judge.rule_reply`` for the
  evaluation suites' judge prompts: HealthBench's grader, WritingBench, Arena-Hard, HH pairs) get the reply
  that function gives (of the content faults only ``malformed`` applies to them);
- "gullibility": when the phrase "ignore previous instructions" appears OUTSIDE the fenced fields as this
  naive reader finds them, it obeys and marks every criterion met. A response that smuggles a fake closing
  marker past neutralisation would therefore flip its verdicts — the injection tests rely on that.

Run standalone (tests kill and restart it this way): ``python -m rise_nemo.judges.rule_server --port P
[--host H]``; it prints ``READY <port>`` once listening and answers ``GET /health`` like vLLM, so the Slurm
launcher can serve it in place of ``vllm serve`` (``RISE_JUDGE_SERVER=rule``, bound to a node's address).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from aiohttp import web

FAULTS = ("ok", "500", "429", "timeout", "malformed", "wrong_count", "drop", "echo", "bad_value")

# How a naive reader finds the fields: by name only, first closing marker wins (no tag check).
_FIELD = r"<<<BEGIN {name}[^>\n]*>>>\n(.*?)\n<<<END {name}[^>\n]*>>>"
_CRIT_LINE = re.compile(r"^\s*(?:(\d+)\.\s*)?\[points: [^\]]*\]\s*(.*)$")
_INJECTION = re.compile(r"ignore (all )?previous instructions", re.IGNORECASE)


def rule_verdict(criterion: str, response: str) -> bool:
    """The server's deterministic grader.

    If the criterion quotes phrases ("..."), it is met when every quoted phrase occurs in the response
    (case-insensitive). Otherwise it is met when the criterion's longest word (first one on ties,
    letters only, >= 4 chars) occurs in the response.
    """
    text = " ".join(response.lower().split())
    quoted = re.findall(r'"([^"]+)"', " ".join(criterion.split()))
    if quoted:
        return all(q.lower() in text for q in quoted)
    words = [w for w in re.findall(r"[A-Za-z]+", criterion) if len(w) >= 4]
    if not words:
        return False
    longest = max(words, key=len)
    return longest.lower() in text


def _field(prompt: str, name: str) -> re.Match | None:
    return re.search(_FIELD.format(name=name), prompt, re.DOTALL)


def grade_prompt(prompt: str) -> tuple[str, list[bool]]:
    """(mode, verdicts) for one of our judge prompts, read naively; ValueError if it is not one."""
    response = _field(prompt, "RESPONSE")
    batched = _field(prompt, "CRITERIA")
    criteria = batched or _field(prompt, "CRITERION")
    if response is None or criteria is None:
        raise ValueError("prompt has no RESPONSE/CRITERIA fields")
    mode = "batched" if batched is not None else "per_criterion"
    texts = []
    for line in criteria.group(1).splitlines():
        m = _CRIT_LINE.match(line)
        if m:
            texts.append(m.group(2))
    verdicts = [rule_verdict(t, response.group(1)) for t in texts]
    outside = prompt
    for m in (_field(prompt, "CONVERSATION"), response, criteria):
        if m is not None:
            outside = outside.replace(m.group(1), "")
    if _INJECTION.search(outside):
        verdicts = [True] * len(verdicts)  # the gullible model obeys instructions it sees outside the data
    return mode, verdicts


_TAG = re.compile(r"<<<BEGIN PROBLEM ([0-9a-f]+)>>>")
_SEGMENT_HEAD = re.compile(r"^--- segment \d+ ---$", re.MULTILINE)


def reference_reply(prompt: str, fault: str = "ok") -> str:
    """A reply to one of ExpRL's reference-judge prompts, graded by the embedded task's rule
    (rise_nemo.data.chain_task.reference_score) and read naively like ``grade_prompt``. Faults: ``echo``
    quotes the attempt (which may claim its own score) before the score lines, ``malformed`` answers an
    untagged "Score: 5", ``wrong_count`` drops the last segment line, ``bad_value`` scores 7."""
    from rise_nemo.data.chain_task import reference_score, reference_segment_scores
    from rise_nemo.judges.reference import render_scores

    tag, reference = _TAG.search(prompt), _field(prompt, "REFERENCE")
    attempt, segments = _field(prompt, "ATTEMPT"), _field(prompt, "SEGMENTS")
    if tag is None or reference is None or (attempt is None and segments is None):
        raise ValueError("reference prompt without PROBLEM/REFERENCE/ATTEMPT fields")
    if segments is not None:
        texts = [t.strip() for t in _SEGMENT_HEAD.split(segments.group(1))[1:]]
        view = "prefix" if "segments 1 to k together" in prompt else "segment"
        scores = reference_segment_scores(reference.group(1), texts, view)
        quoted = " ".join(texts)
    else:
        scores = [reference_score(reference.group(1), attempt.group(1))]
        quoted = attempt.group(1)
    if fault == "malformed":
        return "Score: 5"
    if fault == "bad_value":
        scores = [7] * len(scores)
    if fault == "wrong_count" and len(scores) > 1:
        scores = scores[:-1]
    text = render_scores(tag.group(1), scores, segments is not None)
    return f"The attempt says:\n{quoted}\n{text}" if fault == "echo" else f"Checked against the reference.\n{text}"


CHARS_PER_TOKEN = 4.0  # the usual English BPE average: what ``reply_tokens`` charges a reply in the latency model


def reply_tokens(text: str) -> int:
    """Output tokens an LLM judge would decode for ``text``, for the latency model (len / CHARS_PER_TOKEN)."""
    return max(1, round(len(text) / CHARS_PER_TOKEN))


class RuleGraderApp:
    """The aiohttp application plus its fault plan and counters (shared by thread and CLI runners)."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        latency_per_token_s: float = 0.0,
        max_concurrency: int | None = None,
        script: Iterable[str] = (),
        fault_when: Mapping[str, str] | None = None,
        rates: Mapping[str, float] | None = None,
        seed: int = 0,
        hang_s: float = 30.0,
        supports_response_format: bool = True,
        api_key: str | None = None,
        hold_trigger: str | os.PathLike | None = None,
        extra_replies: Callable[[str], str | None] | None = None,
    ) -> None:
        # Prompts of layers above the judges (rise_nemo.evals' suite prompts): a function from the prompt to
        # the rule judge's reply, None for a prompt it does not know; passed in, so judges import nothing above.
        self.extra_replies = extra_replies
        self.latency_s = latency_s
        self.latency_per_token_s = latency_per_token_s
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self._slots: asyncio.Semaphore | None = None  # made on the server's loop (first request)
        self.serving = 0  # calls in service (holding a slot), and their high-water mark
        self.max_serving = 0
        self.reply_tokens = 0  # output tokens charged by the latency model, over all replies
        self.hold_trigger = Path(hold_trigger) if hold_trigger is not None else None
        self._hold_countdown: int | None = None  # requests still answered after the trigger appeared
        self.holding = False
        self.script: deque[str] = deque(script)
        self.rates = dict(rates or {})
        self.fault_when = [(re.compile(pattern), fault) for pattern, fault in dict(fault_when or {}).items()]
        for name in list(self.script) + list(self.rates) + [fault for _, fault in self.fault_when]:
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r}; expected one of {FAULTS}")
        self._rng = random.Random(seed)
        self.hang_s = hang_s
        self.supports_response_format = supports_response_format
        self.api_key = api_key
        self.requests = 0
        self.bodies: deque[dict] = deque(maxlen=4096)  # the latest request bodies (what the judge was shown)
        self.faults: Counter[str] = Counter()
        self.with_response_format = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/health", self.health)  # vLLM's health path (the Slurm launcher polls it)

    def _next_fault(self, body: dict) -> str:
        if self.fault_when:
            prompt = "\n".join(m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user")
            response = _field(prompt, "RESPONSE")
            for pattern, fault in self.fault_when:
                if response is not None and pattern.search(response.group(1)):
                    return fault
        if self.script:
            return self.script.popleft()
        roll = self._rng.random()
        for name, p in self.rates.items():
            if roll < p:
                return name
            roll -= p
        return "ok"

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "rule-grader", "object": "model"}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _hold_now(self) -> bool:
        """True from the request at which the hold trigger's countdown runs out (module docstring)."""
        if self.holding or self.hold_trigger is None:
            return self.holding
        if self._hold_countdown is None:
            try:
                text = self.hold_trigger.read_text().strip()
            except FileNotFoundError:
                return False
            self._hold_countdown = int(text or 0)
        if self._hold_countdown > 0:
            self._hold_countdown -= 1
            return False
        self.holding = True
        self.hold_trigger.unlink(missing_ok=True)
        self.hold_trigger.with_name(self.hold_trigger.name + ".held").touch()
        print(f"HOLDING from request {self.requests}: no more answers", flush=True)
        return True

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self._hold_now():
            await asyncio.Event().wait()  # never answered: the connection stays open until the server dies
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.max_concurrency is None:
                return await self._served(request)
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.max_concurrency)
            async with self._slots:  # calls beyond max_concurrency wait for a slot, as in a serving engine's queue
                return await self._served(request)
        finally:
            self.in_flight -= 1

    async def _served(self, request: web.Request) -> web.StreamResponse:
        self.serving += 1
        self.max_serving = max(self.max_serving, self.serving)
        try:
            return await self._chat(request)
        finally:
            self.serving -= 1

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self.api_key is not None:
            auth = request.headers.get("Authorization", "")
            if auth != f"Bearer {self.api_key}":
                # Deliberately careless: echoes what it received, as some proxies do.
                return web.json_response({"error": {"message": f"bad key in header {auth!r}"}}, status=401)
        body = await request.json()
        self.bodies.append(body)
        if "response_format" in body:
            self.with_response_format += 1
            if not self.supports_response_format:
                return web.json_response({"error": {"message": "response_format is not supported"}}, status=400)
        fault = self._next_fault(body)
        self.faults[fault] += 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)  # the per-call constant: faults pay it too
        if fault == "timeout":
            await asyncio.sleep(self.hang_s)
        if fault == "drop":
            request.transport.close()  # type: ignore[union-attr]
            raise ConnectionResetError("dropped on purpose")
        if fault == "500":
            auth = request.headers.get("Authorization", "")
            return web.json_response({"error": {"message": f"internal error (request had {auth!r})"}}, status=500)
        if fault == "429":
            return web.json_response({"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "0"})
        prompt = "\n".join(m.get("content", "") for m in body.get("messages", []) if m.get("role") == "user")
        if _field(prompt, "REFERENCE") is not None:  # ExpRL's reference judge (rise_nemo.judges.reference)
            try:
                content = reference_reply(prompt, fault)
            except ValueError as exc:
                return web.json_response({"error": {"message": str(exc)}}, status=400)
            return await self._reply(body, content)
        try:  # e.g. an evaluation suite's judge prompt (rise_nemo.evals): the rule judge's own reply
            content = self.extra_replies(prompt) if self.extra_replies is not None else None
        except ValueError as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        if content is not None:
            return await self._reply(body, '{"explanation": "cut off mid-sent' if fault == "malformed" else content)
        try:
            mode, verdicts = grade_prompt(prompt)
        except ValueError as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        return await self._reply(body, self._render(mode, verdicts, fault, prompt))

    async def _reply(self, body: dict, content: str) -> web.Response:
        if self.latency_per_token_s:
            tokens = reply_tokens(content)
            self.reply_tokens += tokens
            await asyncio.sleep(self.latency_per_token_s * tokens)  # decoding the reply
        return web.json_response({
            "id": f"chatcmpl-{self.requests}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "rule-grader"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        })

    @staticmethod
    def _render(mode: str, verdicts: list[bool], fault: str, prompt: str) -> str:
        if fault == "malformed":
            return '{"explanation": "cut off mid-sent'
        if mode == "per_criterion":
            obj: dict = {"explanation": "rule grader", "criteria_met": verdicts[0] if verdicts else False}
            if fault == "wrong_count":
                obj["criteria_met_2"] = True
            if fault == "bad_value":
                obj["criteria_met"] = "yes"
        else:
            obj = {str(k): "PRESENT" if v else "NOT_PRESENT" for k, v in enumerate(verdicts, start=1)}
            if fault == "wrong_count":
                obj.pop(str(len(verdicts)), None)
            if fault == "bad_value":
                obj["1"] = "MAYBE"
        text = json.dumps(obj)
        if fault == "echo":
            resp = _field(prompt, "RESPONSE")
            text = f"The response says: {resp.group(1) if resp else ''}\n{text}"
        return text


class RuleGraderServer:
    """Runs a ``RuleGraderApp`` on 127.0.0.1 in a background thread (its own event loop)."""

    def __init__(self, port: int = 0, **app_kwargs) -> None:
        self.grader = RuleGraderApp(**app_kwargs)
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> RuleGraderServer:
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:  # report bind errors to the starting thread
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())  # type: ignore[union-attr]
            loop.close()

        self._thread = threading.Thread(target=run, name="rule-grader-server", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("rule grader server did not start within 30 s")
        if errors:
            raise errors[0]
        return self

    async def _start_site(self) -> None:
        # A short shutdown timeout: stop() drops in-flight requests like a crashed server would.
        self._runner = web.AppRunner(self.grader.app, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop = self._thread = None

    def __enter__(self) -> RuleGraderServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (a cluster node's own address on Slurm)")
    p.add_argument("--latency", type=float, default=0.0, help="seconds added to every call")
    p.add_argument("--latency-per-token", type=float, default=0.0, help="seconds per output token of a reply")
    p.add_argument("--max-concurrency", type=int, default=None, help="calls served at once (the rest wait)")
    p.add_argument("--fault", action="append", default=[], metavar="NAME=P", help="random fault rate, repeatable")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hold-trigger", metavar="PATH", help="stop answering once PATH exists (module docstring)")
    args = p.parse_args(argv)
    rates = {}
    for item in args.fault:
        name, _, prob = item.partition("=")
        rates[name] = float(prob)
    grader = RuleGraderApp(latency_s=args.latency, latency_per_token_s=args.latency_per_token,
                           max_concurrency=args.max_concurrency, rates=rates, seed=args.seed,
                           hold_trigger=args.hold_trigger)

    async def serve() -> None:
        runner = web.AppRunner(grader.app, shutdown_timeout=0.1, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port, reuse_address=True)
        await site.start()
        print(f"READY {site._server.sockets[0].getsockname()[1]}", flush=True)  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
