"""Generation and judging as one stream: every response goes to the judge as soon as it is generated, and the
caller is told each time a group of responses is fully judged, so it can make new requests while the generator
and the judge are still busy (the pipelined rubric step, docs/nemo_rl.md "The step's timeline").

``JudgedStream`` knows nothing of a method. The caller opens generate calls (``call``), puts requests into their
slots, each request's samples belonging to a group (``put(slot, request, group)``), and runs the stream with a
callback for every group whose responses are all judged, until it says it is done. What comes back, per group, is
the rollouts and verdicts the sequential stages would have produced:
- generation: each call returns what ``Generator.generate`` returns for its put requests in slot order
  (interfaces.RolloutStream); a generator that does not stream is called once per call, when all its slots are
  known (``CallAtOnceStream``);
- judging: to ``judge_async`` where the judge has it (interfaces.AsyncJudge), else to ``judge`` in a worker thread;
  verdicts do not depend on which requests share a call or in what order they are judged. Responses wait in the
  stream in order of urgency: by their group's ``priority`` (``add_group``: lower first), then those whose group is
  all generated first (the caller waits on that group's verdicts; another group is not done anyway), a group at a
  time in the order the groups were all generated (interleaving them would hold every group's verdicts until the
  last of them is judged), then in arrival order. A judge that says how many calls it serves at once and what a
  request occupies of them (interfaces.CapacityJudge) gets about that much in flight, one response per call, the
  next one taken from the head of that order as each returns: so it is the stream, not the judge's first-come
  queue, that decides what is judged next. Any other judge gets everything waiting in one call, in that order. A
  judge error (its failure cap, a stop request) or a generation error is raised from ``run``, the stream closed:
  the caller fails as the sequential stages would;
- a judge call outliving the judge's own ``timeout_s`` (RayJudge's bound on ``judge``) raises TimeoutError.

It also says what bounded it, for the step's metrics (steps.rubric ``rollout_metrics``): when the last response was
generated and the last verdict came (the judging generation could not hide), how many responses were still
unjudged at that moment, and for how many seconds a judge with a known capacity was kept full (the judge, not the
generator, set the pace then).
"""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from rise_nemo.interfaces import (
    AsyncJudge,
    CapacityJudge,
    GenerationRequest,
    Generator,
    JudgeRequest,
    OnRollout,
    Rollout,
    SamplingParams,
    StreamingGenerator,
    Verdict,
)
from rise_nemo.steps.rollouts import generate_requests

POLL_S = 5.0  # how often a waiting stream looks at judge calls that may have outlived the judge's timeout


def streams_natively(generator: Any) -> bool:
    """True for a generator with its own stream (interfaces.StreamingGenerator, not switched off by ``streams``)."""
    return isinstance(generator, StreamingGenerator) and bool(getattr(generator, "streams", True))


class CallAtOnceStream:
    """interfaces.RolloutStream over ``Generator.generate``: each call is ONE generate call, made (in a worker
    thread, calls in order) once all its slots are known; the stream's caller keeps judging meanwhile."""

    def __init__(self, generator: Generator, on_rollout: OnRollout):
        self.generator, self.on_rollout = generator, on_rollout
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rise-generate")
        self._closed = False

    def call(self, tag: Hashable, slots: int, params: SamplingParams) -> _WholeCall:
        return _WholeCall(self, tag, slots, params)

    def _run(self, tag: Hashable, requests: list[tuple[int, GenerationRequest]], params: SamplingParams) -> None:
        try:
            groups = generate_requests(self.generator, [r for _, r in requests], params)
        except BaseException as exc:  # reported per sample, as the streams do
            for slot, request in requests:
                for j in range(request.n):
                    self._report(tag, slot, j, exc)
            return
        for (slot, _), group in zip(requests, groups):
            for j, rollout in enumerate(group):
                self._report(tag, slot, j, rollout)

    def _report(self, tag, slot, j, item) -> None:
        if not self._closed:
            self.on_rollout(tag, slot, j, item)

    def close(self) -> None:
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)


class _WholeCall:
    def __init__(self, stream: CallAtOnceStream, tag: Hashable, slots: int, params: SamplingParams):
        self.stream, self.tag, self.params = stream, tag, params
        self._slots: list[Any] = [_UNKNOWN] * slots
        self._lock = threading.Lock()

    def put(self, slot: int, request: GenerationRequest) -> None:
        self._fill(slot, request)

    def skip(self, slot: int) -> None:
        self._fill(slot, None)

    def _fill(self, slot: int, value: GenerationRequest | None) -> None:
        with self._lock:
            if self._slots[slot] is not _UNKNOWN:
                raise ValueError(f"call {self.tag!r}: slot {slot} was already filled")
            self._slots[slot] = value
            if any(v is _UNKNOWN for v in self._slots):
                return
            requests = [(i, r) for i, r in enumerate(self._slots) if r is not None]
        if requests:
            self.stream._executor.submit(self.stream._run, self.tag, requests, self.params)


_UNKNOWN = object()


class Group:
    """The samples of one group and their verdicts, as they arrive."""

    def __init__(self, size: int, priority: int = 0):
        self.rollouts: list[Rollout | None] = [None] * size
        self.verdicts: list[list[Verdict] | None] = [None] * size
        self.priority = priority
        self.generated_seq: int | None = None  # the stream's arrival count when the last sample arrived

    @property
    def judged(self) -> bool:
        return all(v is not None for v in self.verdicts)

    @property
    def all_generated(self) -> bool:
        return all(r is not None for r in self.rollouts)


class _Waiting:
    """A response waiting for the judge; ``live`` turns False when it is re-queued with a new rank."""

    __slots__ = ("key", "j", "request", "seq", "live")

    def __init__(self, key: Hashable, j: int, request: JudgeRequest, seq: int):
        self.key, self.j, self.request, self.seq, self.live = key, j, request, seq, True


def judge_capacity(judge: Any) -> tuple[int, Callable[[JudgeRequest], float]] | None:
    """(calls the judge serves at once, a request's load) of an asynchronous interfaces.CapacityJudge that knows."""
    if isinstance(judge, AsyncJudge) and isinstance(judge, CapacityJudge) and judge.max_concurrency is not None:
        return max(1, int(judge.max_concurrency)), judge.load_of
    return None


class StreamCall:
    """A generate call of a ``JudgedStream``: ``put(slot, request, group, first=0)`` makes the request's samples
    the group's samples first .. first + n - 1; ``skip(slot)`` leaves a slot out."""

    def __init__(self, stream: JudgedStream, tag: Hashable, handle: Any):
        self._stream, self._tag, self._handle = stream, tag, handle

    def put(self, slot: int, request: GenerationRequest, group: Hashable, first: int = 0) -> None:
        self._stream._owners[(self._tag, slot)] = (group, first)
        self._handle.put(slot, request)

    def skip(self, slot: int) -> None:
        self._handle.skip(slot)


class JudgedStream:
    """Module docstring. ``groups`` are declared with their sizes (``add_group``) before their samples arrive."""

    def __init__(self, generator: Generator, judge: Any, judge_request: Callable[[Hashable, Rollout], JudgeRequest]):
        self.judge, self.judge_request = judge, judge_request
        self.groups: dict[Hashable, Group] = {}
        self._events: queue.Queue = queue.Queue()
        self._owners: dict[tuple[Hashable, int], tuple[Hashable, int]] = {}  # (call, slot) -> (group, first sample)
        # Responses waiting for the judge: a heap by rank (module docstring), stale entries skipped when popped;
        # those of a group not yet all generated are also listed by group, to move ahead once it is.
        self._waiting: list[tuple[tuple[int, int, int, int], int, _Waiting]] = []
        self._waiting_of: dict[Hashable, list[_Waiting]] = {}
        self._seq, self._pushes = itertools.count(), itertools.count()  # arrival order; heap tie-break
        self._capacity = judge_capacity(judge)
        self._in_flight: dict[concurrent.futures.Future, tuple[float, float]] = {}  # -> (sent at, slots held)
        self._slots_held = 0.0
        self._executor = None if isinstance(judge, AsyncJudge) else concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="rise-judge")
        self.judge_calls = 0
        # What bounded the stream (module docstring), on ``clock`` (perf_counter; a test's own clock):
        self.clock: Callable[[], float] = time.perf_counter
        self.t_last_response: float | None = None  # when the last response arrived (stamped on arrival)
        self.t_last_verdict: float | None = None
        self.backlog_at_last_response = 0  # responses generated but not yet judged then, the last one included
        self.saturated_s = 0.0  # seconds a judge of known capacity had all of it in use
        self._saturated_since: float | None = None
        self._unjudged = 0
        self._stream = (generator.open_stream(self._on_rollout) if streams_natively(generator)
                        else CallAtOnceStream(generator, self._on_rollout))

    @property
    def knows_capacity(self) -> bool:
        """Whether the judge states its capacity (``judge_capacity``): only then is ``saturated_s`` meaningful."""
        return self._capacity is not None

    def add_group(self, key: Hashable, size: int, priority: int = 0) -> None:
        """A group of ``size`` samples; ``priority``: its responses' place in the judge's order (lower first)."""
        self.groups[key] = Group(size, priority)

    def call(self, tag: Hashable, slots: int, params: SamplingParams) -> StreamCall:
        """A generate call (``tag``: unique in this stream) of ``slots`` requests."""
        return StreamCall(self, tag, self._stream.call(tag, slots, params))

    def _on_rollout(self, tag, slot, j, item) -> None:  # any thread
        self._events.put(("rollout", tag, slot, j, item, self.clock()))

    def run(self, on_judged: Callable[[Hashable], None], done: Callable[[], bool]) -> None:
        """Judge what is generated, calling ``on_judged(group)`` once per fully judged group, until ``done()``."""
        try:
            while not done():
                try:
                    event = self._events.get(timeout=POLL_S)
                except queue.Empty:
                    self._check_timeouts()
                    continue
                judged = self._handle(event)
                while True:  # everything that arrived meanwhile, then one judge call for the new responses
                    try:
                        judged += self._handle(self._events.get_nowait())
                    except queue.Empty:
                        break
                self._flush()
                for key in judged:
                    on_judged(key)
                self._flush()
        finally:
            self.close()

    def _handle(self, event) -> list[Hashable]:
        if event[0] == "rollout":
            _, tag, slot, j, item, arrived = event
            if isinstance(item, BaseException):
                raise item
            self._unjudged += 1
            self.t_last_response, self.backlog_at_last_response = arrived, self._unjudged
            key, first = self._owners[(tag, slot)]
            group = self.groups[key]
            group.rollouts[first + j] = item
            completed = group.all_generated
            if completed:
                group.generated_seq = next(self._seq)
            self._wait(_Waiting(key, first + j, self.judge_request(key, item), next(self._seq)))
            if completed:  # its waiting responses move ahead of those of groups still generated
                for waiting in self._waiting_of.pop(key, []):
                    if waiting.live:
                        waiting.live = False
                        self._wait(_Waiting(waiting.key, waiting.j, waiting.request, waiting.seq))
            return []
        _, keys, future = event
        self._slots_held -= self._in_flight.pop(future, (0.0, 0.0))[1]
        self._track_saturation()
        verdicts = future.result()  # raises the judge's error (failure cap, stop), as ``judge`` would
        if len(verdicts) != len(keys):
            raise RuntimeError(f"judge returned {len(verdicts)} verdict lists for {len(keys)} requests")
        self._unjudged -= len(keys)
        self.t_last_verdict = self.clock()
        judged = []
        for (key, j), row in zip(keys, verdicts):
            group = self.groups[key]
            group.verdicts[j] = list(row)
            if group.judged:
                judged.append(key)
        return judged

    def _wait(self, waiting: _Waiting) -> None:
        group = self.groups[waiting.key]
        if group.all_generated:
            rank = (group.priority, 0, group.generated_seq, waiting.seq)
        else:
            self._waiting_of.setdefault(waiting.key, []).append(waiting)
            rank = (group.priority, 1, waiting.seq, 0)
        heapq.heappush(self._waiting, (rank, next(self._pushes), waiting))

    def _next_waiting(self) -> _Waiting | None:
        while self._waiting:
            *_, waiting = heapq.heappop(self._waiting)
            if waiting.live:
                waiting.live = False
                return waiting
        return None

    def _flush(self) -> None:
        """Send waiting responses to the judge: one call per response up to its capacity, else all in one."""
        if self._capacity is None:
            batch = list(iter(self._next_waiting, None))
            if batch:
                self._send(batch, 0.0)
            return
        limit, load_of = self._capacity
        while self._slots_held < limit or not self._in_flight:
            waiting = self._next_waiting()
            if waiting is None:
                return
            self._send([waiting], float(load_of(waiting.request)))

    def _send(self, batch: list[_Waiting], slots: float) -> None:
        keys = [(w.key, w.j) for w in batch]
        requests = [w.request for w in batch]
        if self._executor is None:
            future = self.judge.judge_async(requests)
        else:
            future = self._executor.submit(self.judge.judge, requests)
        self.judge_calls += 1
        self._in_flight[future] = (time.monotonic(), slots)
        self._slots_held += slots
        self._track_saturation()
        future.add_done_callback(lambda f, keys=keys: self._events.put(("verdicts", keys, f)))

    def _track_saturation(self) -> None:
        """Counts ``saturated_s``: called whenever the slots held change (a judge without a known capacity: never full)."""
        full = self._capacity is not None and self._slots_held >= self._capacity[0]
        if full and self._saturated_since is None:
            self._saturated_since = self.clock()
        elif not full and self._saturated_since is not None:
            self.saturated_s += self.clock() - self._saturated_since
            self._saturated_since = None

    def _check_timeouts(self) -> None:
        timeout = getattr(self.judge, "timeout_s", None)
        if timeout is None:
            return
        for started, _ in self._in_flight.values():
            if time.monotonic() - started > float(timeout):
                raise TimeoutError(f"judge: a call has not returned in {float(timeout):g} s (the judge's timeout_s)")

    def close(self) -> None:
        if self._saturated_since is not None:  # stopped early (an error) with calls in flight
            self.saturated_s += self.clock() - self._saturated_since
            self._saturated_since = None
        self._stream.close()
        for future in list(self._in_flight):
            future.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
