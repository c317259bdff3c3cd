"""The order in which the pipelined step's stream hands responses to a judge that says how many calls it serves
at once (interfaces.CapacityJudge): about that many in flight, and the next one is the most urgent waiting, i.e. a
natural group's response before a privileged one's (``priority``), then a response whose group is all generated (the
caller waits on that group's verdicts) before one whose group is still being generated, all generated groups a
group at a time in the order they were all generated, then arrival order.
Arrivals and judge answers are driven by the test, so the order is exact, not timed."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from rise_nemo.core.rubric import Criterion, Rubric
from rise_nemo.interfaces import CapacityJudge, JudgeRequest, Rollout, SamplingParams
from rise_nemo.judges.http import HttpJudge, HttpJudgeConfig
from rise_nemo.steps.judged_stream import JudgedStream, judge_capacity

RUBRIC = Rubric((Criterion("Mentions alpha", 1.0),))


class ManualGenerator:
    """interfaces.StreamingGenerator whose responses arrive when the test says (``arrive``)."""

    def __init__(self):
        self.on_rollout = None

    def open_stream(self, on_rollout):
        self.on_rollout = on_rollout

        class Stream:
            def call(self, tag, slots, params):
                class Call:
                    def put(self, slot, request):
                        pass

                    def skip(self, slot):
                        pass

                return Call()

            def close(self):
                pass

        return Stream()

    def arrive(self, tag, slot, j, text):
        self.on_rollout(tag, slot, j, Rollout([], [1], [2], text, [0.0], True))


class OneAtATimeJudge:
    """Serves ``max_concurrency`` calls of one criterion at once; a call is answered when the test releases it."""

    max_concurrency = 1

    def __init__(self):
        self.sent: list[tuple[str, concurrent.futures.Future]] = []
        self.changed = threading.Condition()

    def load_of(self, request):
        return float(len(request.rubric.criteria))

    def judge(self, requests):
        raise AssertionError("the stream must use judge_async")

    def judge_async(self, requests):
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.changed:
            self.sent += [(r.response, future) for r in requests]
            self.changed.notify_all()
        return future

    def wait_sent(self, n):
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.sent) >= n, timeout=600), [t for t, _ in self.sent]

    def release_all(self):
        with self.changed:
            pending = [f for _, f in self.sent if not f.done()]
        for future in pending:
            future.set_result([[True]])


class HeldStream:
    """A stream of one generate call over ``groups`` ((key, size, priority), a slot each) between the manual
    generator and the one-at-a-time judge, run in a thread until every group is judged."""

    def __init__(self, groups, clock=None, judge=None):
        self.gen, self.judge = ManualGenerator(), judge or OneAtATimeJudge()
        self.stream = stream = JudgedStream(self.gen, self.judge,
                                            lambda key, rollout: JudgeRequest([], rollout.response_text, RUBRIC, "p"))
        if clock is not None:
            stream.clock = clock
        for key, size, priority in groups:
            stream.add_group(key, size, priority)
        call = stream.call("natural", len(groups), SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=4))
        for slot, (key, _, _) in enumerate(groups):
            call.put(slot, None, key)
        self.slot_of = {key: slot for slot, (key, _, _) in enumerate(groups)}
        self.judged: list = []
        self.worker = threading.Thread(target=stream.run, daemon=True,
                                       args=(self.judged.append, lambda: len(self.judged) == len(groups)))
        self.worker.start()

    def arrive(self, text):
        """The response named ``text`` = group key + sample index, e.g. "B1"."""
        self.gen.arrive("natural", self.slot_of[text[0]], int(text[1:]), text)

    def finish(self) -> list[str]:
        """Answers every call until all groups are judged: the responses in the order they were sent."""
        while self.worker.is_alive():
            self.judge.release_all()
            self.worker.join(timeout=0.05)
        return [text for text, _ in self.judge.sent]


def test_the_next_call_is_the_most_urgent_waiting_response():
    held = HeldStream([("A", 2, 0), ("B", 2, 0), ("C", 2, 0), ("P", 1, 1)])
    held.arrive("A0")
    held.judge.wait_sent(1)  # the judge is free: A0 goes at once
    for text in ("C0", "P0", "B0", "B1"):
        held.arrive(text)
    # All four wait behind A0 (one call at a time). As each call returns, the most urgent one goes next: B (all
    # generated) before C (still generated, though it arrived first); the natural C before the privileged P.
    for n in (2, 3, 4, 5):
        held.judge.release_all()
        held.judge.wait_sent(n)
    held.arrive("A1")
    held.arrive("C1")
    assert held.finish() == ["A0", "B0", "B1", "C0", "P0", "A1", "C1"]
    judged = held.judged
    assert sorted(judged) == ["A", "B", "C", "P"] and judged.index("B") < judged.index("A")


def test_groups_all_generated_are_judged_one_after_another_in_the_order_they_completed():
    held = HeldStream([("X", 1, 0), ("D", 2, 0), ("E", 2, 0)])
    held.arrive("X0")
    held.judge.wait_sent(1)  # X0 goes at once; the rest arrive while the judge is held
    for text in ("D0", "E0", "E1", "D1"):
        held.arrive(text)
    for n in (2, 3, 4, 5):
        held.judge.release_all()
        held.judge.wait_sent(n)
    # D starts first but E completes first: E's two responses go before D's, so E's verdicts (and its privileged
    # request) do not wait for D's; responses of both groups interleaved would delay both groups' verdicts.
    assert held.finish() == ["X0", "E0", "E1", "D0", "D1"]
    assert held.judged == ["X", "E", "D"]


@pytest.mark.parametrize("mode, batch_size, criteria, load", [("batched", 6, 11, 11 / 6), ("batched", 6, 6, 1.0),
                                                               ("per_criterion", 6, 11, 11.0)])
def test_the_http_judge_says_its_capacity_and_what_a_request_occupies(mode, batch_size, criteria, load):
    judge = HttpJudge(HttpJudgeConfig(base_urls=("http://127.0.0.1:9/v1",), model="m", mode=mode,
                                      batch_size=batch_size, max_concurrency=23, cache=False))
    try:
        request = JudgeRequest([], "text", Rubric(tuple(Criterion(f"c{k}", 1.0) for k in range(criteria))), "p")
        assert isinstance(judge, CapacityJudge)
        limit, load_of = judge_capacity(judge)
        assert limit == 23 and load_of(request) == pytest.approx(load)
    finally:
        judge.close()


def test_the_stream_reports_its_judging_tail_end_backlog_and_saturated_seconds():
    """On the test's own clock: the judge (one call at a time) is full from the first call to the last verdict
    but for no instant (the next call goes as the last returns): 6 s; the last response arrives at t=3 with the
    previous one in flight and itself unjudged (backlog 2), the last verdict comes at t=6 (a 3 s tail)."""
    now = [0.0]
    held = HeldStream([("A", 2, 0), ("B", 1, 0)], clock=lambda: now[0])
    held.arrive("A0")
    held.judge.wait_sent(1)  # t=0: A0 sent, the judge is full
    held.arrive("A1")  # waits
    now[0] = 2.0
    held.judge.release_all()  # t=2: A0 back, A1 sent
    held.judge.wait_sent(2)
    now[0] = 3.0
    held.arrive("B0")  # the last response: A1 in flight, B0 waiting
    now[0] = 5.0
    held.judge.release_all()  # t=5: A1 back (A judged), B0 sent
    held.judge.wait_sent(3)
    now[0] = 6.0
    assert held.finish() == ["A0", "A1", "B0"]  # t=6: B0 back, B judged, the stream ends
    stream = held.stream
    assert stream.t_last_response == 3.0 and stream.t_last_verdict == 6.0
    assert stream.backlog_at_last_response == 2
    assert stream.saturated_s == pytest.approx(6.0)


def test_a_judge_without_a_stated_capacity_is_never_counted_full():
    class PlainJudge(OneAtATimeJudge):
        max_concurrency = None  # e.g. a Ray judge that does not know its servers

    now = [0.0]
    held = HeldStream([("A", 1, 0)], clock=lambda: now[0], judge=PlainJudge())
    assert judge_capacity(held.judge) is None
    held.arrive("A0")
    held.judge.wait_sent(1)
    now[0] = 4.0
    assert held.finish() == ["A0"]
    assert held.stream.saturated_s == 0.0 and held.stream.t_last_verdict - held.stream.t_last_response == 4.0
