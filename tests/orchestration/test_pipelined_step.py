"""The pipelined rubric step (rise.pipeline) trains on EXACTLY the batch of the sequential step.

The real loop on the local backend (streamed decoding, tiny random Qwen3) with the real HTTP judge against the rule
grader server on 127.0.0.1: every batch handed to ``policy.train`` is compared tensor for tensor between a run with
``rise.pipeline=false`` and one with ``rise.pipeline=true``, for RISE-RL (two-pass and one-pass guidance, request
seeds, the gate, the privileged budget, a prompt id twice in a step) and its baselines (Rubric-RL, coupled, RuscaRL),
and under judge faults mid-stream (retried, then unknown: the same responses left out). A scripted judge shows the
point of it: a prompt's privileged request goes to the generator before the other prompts' natural groups are
judged, and the first responses are judged before the last ones are generated.
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
import tiny_task
import torch

from rise_nemo.backends import build_backend
from rise_nemo.config import config_from_dict
from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric, RubricPrompt
from rise_nemo.judges import build_judge
from rise_nemo.judges.client import JudgeFailureCapExceeded
from rise_nemo.judges.rule import RuleJudge
from rise_nemo.judges.rule_server import RuleGraderServer
from rise_nemo.loop.trainer import Trainer, read_metrics, reproducible_metrics

RUBRIC = Rubric((  # quoted phrases: what the rule grader server checks (the machine checks: the rule judge's)
    Criterion('Mentions "alpha"', 3.0, ("persistent",), MachineCheck("contains", "alpha")),
    Criterion('Mentions "beta"', 2.0, (), MachineCheck("contains", "beta")),
    Criterion('Says "gamma"', -1.0, (), MachineCheck("contains", "gamma")),
    Criterion('Names the "moon"', 1.0, (), MachineCheck("contains", "moon")),
))


def prompts(n: int, offset: int = 0, repeat: int = 1) -> list[RubricPrompt]:
    out = [RubricPrompt(f"pipe-{i + offset}", ({"role": "user", "content": f"describe the {tiny_task.TOPICS[i % 9]}"},),
                        RUBRIC) for i in range(n)]
    return [p for p in out for _ in range(repeat)]  # repeat: each prompt id twice in a row (twice in one step)


class Recorder:
    """Wraps the real policy: keeps every batch handed to train (a copy)."""

    def __init__(self):
        self.batches: list[dict[str, torch.Tensor]] = []

    def wrap(self, policy):
        rec = self

        class Policy:
            def __getattr__(self, name):
                return getattr(policy, name)

            def train(self, data, loss_fn):
                rec.batches.append({k: v.clone() for k, v in data.items()})
                return policy.train(data, loss_fn)

        return Policy()


@pytest.fixture(scope="module")
def grader():
    with RuleGraderServer(latency_s=0.01) as srv:
        yield srv


def run(tmp_path, tiny_tokenizer, url, name, overrides, method="rise", train=None, judge=None):
    """(recorded batches, metrics, the step context) of a short run."""
    judge_cfg = {"type": "http", "mode": "batched", "model": "rule-grader", "base_urls": [url], "batch_size": 3,
                 "max_concurrency": 8, "timeout_s": 300.0, "backoff_base_s": 0.01, "backoff_max_s": 0.05,
                 "cache": False}
    cfg = config_from_dict(tiny_task.recipe(tiny_tokenizer, tmp_path / name, method, judge=judge_cfg),
                           ["train.steps=3", "eval.every=0", "eval.at_start=false", "++local.generation_batch_size=5",
                            *overrides])
    policy, generator = build_backend(cfg)
    rec = Recorder()
    trainer = Trainer(cfg, rec.wrap(policy), generator, judge or build_judge(cfg.judge), train or prompts(6),
                      prompts(2, 6))
    assert trainer.run() == 0
    return rec.batches, read_metrics(tmp_path / name), trainer


def assert_same_training(a, b):
    (batches_a, metrics_a, _), (batches_b, metrics_b, _) = a, b
    assert len(batches_a) == len(batches_b) > 0
    for x, y in zip(batches_a, batches_b):
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), key
    strip = {"rollout/pipelined"}
    assert ([{k: v for k, v in reproducible_metrics(m).items() if k not in strip} for m in metrics_a]
            == [{k: v for k, v in reproducible_metrics(m).items() if k not in strip} for m in metrics_b])


VARIANTS = {
    "rise": ("rise", ["rise.schedule.switch_step=9"]),
    "rise_request_seeds": ("rise", ["rise.schedule.switch_step=9", "sampling.request_seeds=true"]),
    "rise_one_pass": ("rise", ["rise.schedule.switch_step=9", "rise.guidance_pass=one", "train.steps=5",
                               "rise.privileged_group_size=2"]),
    "rise_gate": ("rise", ["rise.schedule.switch_step=9", "rise.gate.enabled=true", "rise.gate.threshold=0.5"]),
    "rise_budget": ("rise", ["rise.schedule.switch_step=9", "rise.gate.budget=0.5"]),
    "rubric_rl": ("rubric_rl", []),
    "coupled": ("coupled", ["rise.schedule.switch_step=9"]),
    "ruscarl": ("ruscarl", []),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_pipelined_step_trains_on_the_sequential_steps_batch(tmp_path, tiny_tokenizer, grader, variant):
    method, over = VARIANTS[variant]
    seq = run(tmp_path, tiny_tokenizer, grader.url, "seq", [*over, "rise.pipeline=false"], method)
    pipe = run(tmp_path, tiny_tokenizer, grader.url, "pipe", [*over, "rise.pipeline=true"], method)
    assert not seq[2].ctx.pipelined and pipe[2].ctx.pipelined
    assert all(m["rollout/pipelined"] for m in pipe[1]) and not any(m["rollout/pipelined"] for m in seq[1])
    assert_same_training(seq, pipe)
    if method in ("rise", "coupled"):
        assert any(m["guidance/privileged_rollouts"] for m in seq[1])  # the guided branch ran and is compared
    if variant == "rise_one_pass":
        assert any(m.get("guidance/one_pass_prompts") for m in seq[1])


def test_a_prompt_id_twice_in_a_step_is_decided_in_order(tmp_path, tiny_tokenizer, grader):
    """The gate's EMA and one-pass hints are per prompt id: both positions of a duplicated id are decided in
    position order, also with request seeds (prompts otherwise decided as judged)."""
    over = ["rise.schedule.switch_step=9", "sampling.request_seeds=true", "rise.gate.enabled=true",
            "rise.gate.threshold=0.4", "sampling.prompts_per_step=4"]
    train = prompts(3, repeat=2)
    seq = run(tmp_path, tiny_tokenizer, grader.url, "seq", [*over, "rise.pipeline=false"], train=train)
    pipe = run(tmp_path, tiny_tokenizer, grader.url, "pipe", [*over, "rise.pipeline=true"], train=train)
    assert_same_training(seq, pipe)
    assert seq[2].ctx.gate.state_dict() == pipe[2].ctx.gate.state_dict()


def test_auto_pipelines_where_a_judge_has_latency(tmp_path, tiny_tokenizer, grader):
    """rise.pipeline=auto: on with the HTTP judge (it does not block), off with the in-process rule judge."""
    _, metrics, trainer = run(tmp_path, tiny_tokenizer, grader.url, "http", ["train.steps=1"])
    assert trainer.ctx.pipelined and metrics[0]["rollout/pipelined"]
    m = metrics[0]  # what bounded the phase (rubric.rollout_metrics): the HTTP judge states its capacity
    assert m["time/judge_tail_s"] >= 0 and 0 <= m["time/judge_saturated_share"] <= 1
    assert m["time/judge_backlog_at_generation_end"] >= 1  # the last response itself, at least
    _, metrics, trainer = run(tmp_path, tiny_tokenizer, grader.url, "rule", ["train.steps=1"], judge=RuleJudge())
    assert not trainer.ctx.pipelined and not metrics[0]["rollout/pipelined"]
    m = metrics[0]  # sequential: the tail is the last judging stage; nothing else is measured
    assert m["time/judge_tail_s"] >= 0
    assert m["time/judge_saturated_share"] is None and m["time/judge_backlog_at_generation_end"] is None


def test_judge_faults_mid_stream_are_retried_then_unknown_in_both_modes(tmp_path, tiny_tokenizer, grader):
    """Every judge call about a response that says "delta" fails (HTTP 500): retried, then unknown, and that
    response is left out of rewards, advantages and the batch, the same ones in both modes (none dropped silently:
    judge/unknown_excluded counts them)."""
    grader.grader.fault_when = [(__import__("re").compile("delta"), "500")]
    try:
        over = ["rise.schedule.switch_step=9", "++judge.max_attempts=2"]
        seq = run(tmp_path, tiny_tokenizer, grader.url, "seq", [*over, "rise.pipeline=false"])
        pipe = run(tmp_path, tiny_tokenizer, grader.url, "pipe", [*over, "rise.pipeline=true"])
    finally:
        grader.grader.fault_when = []
    assert_same_training(seq, pipe)
    unknown = [m["judge/unknown_excluded"] for m in pipe[1]]
    assert sum(unknown) > 0 and unknown == [m["judge/unknown_excluded"] for m in seq[1]]
    assert all(m["judge/retries"] > 0 for m in pipe[1][-1:])


def test_the_judges_failure_cap_stops_the_pipelined_step(tmp_path, tiny_tokenizer, grader):
    grader.grader.rates = {"500": 1.0}
    try:
        with pytest.raises(JudgeFailureCapExceeded):
            run(tmp_path, tiny_tokenizer, grader.url, "cap", ["rise.pipeline=true", "++judge.max_failures=3"])
    finally:
        grader.grader.rates = {}
    # the stream's threads are gone (the local decoder, a worker judging or generating for the stream)
    assert not [t for t in threading.enumerate() if t.name.startswith(("rise-local-rollouts", "rise-judge_",
                                                                        "rise-generate_")) and t.is_alive()]


class HeldJudge:
    """An asynchronous judge (the rule judge inside) whose calls are answered only when the test releases them,
    so the order of events in the pipelined step is under the test's control."""

    def __init__(self):
        self.inner = RuleJudge()
        self.calls: list[tuple[list, concurrent.futures.Future]] = []
        self.arrived = threading.Condition()

    def judge(self, requests):
        return self.inner.judge(requests)

    def judge_async(self, requests):
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.arrived:
            self.calls.append((list(requests), future))
            self.arrived.notify_all()
        return future

    def release(self, index: int) -> None:
        requests, future = self.calls[index]
        future.set_result(self.inner.judge(requests))

    def responses(self) -> int:
        return sum(len(requests) for requests, _ in self.calls)

    def prompt_ids(self) -> list[str]:
        """The prompt id of every request received, in order."""
        with self.arrived:
            return [r.prompt_id for requests, _ in self.calls for r in requests]

    def wait_for_responses(self, count: int) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: self.responses() >= count, timeout=600), (
                f"the judge received {self.responses()} responses, not {count}")


def test_hints_are_picked_while_other_prompts_are_still_judged(tiny_tokenizer, tmp_path):
    """Two prompts, 4 samples each, decoded 5 rows at a time: the first chunk (prompt 0 and one sample of prompt 1)
    goes to the judge before the second chunk is generated; once the first chunk's verdicts are released, prompt 0's
    hint is picked and its privileged request made while prompt 1's natural group is still unjudged. (The local
    generator then waits for prompt 1's decision to fill its first privileged chunk, as generate would batch them;
    NeMo-RL's vLLM engine starts the request at once.)

    The test holds the second chunk's decoding until the judge has the first chunk's five responses: a stream that
    waited for the whole call would never get there (the wait fails). Without the hold, a loaded machine may decode
    both chunks before the stream's thread runs, and one judge call then carries all eight. The stream sends what has
    arrived when it wakes, so a chunk may also reach the judge in more than one call: the test counts responses, not
    calls."""
    from rise_nemo.methods.registry import get_method
    from rise_nemo.steps import rubric

    cfg = config_from_dict(tiny_task.recipe(tiny_tokenizer, tmp_path / "held", "rise"),
                           ["++local.generation_batch_size=5", "rise.pipeline=true", "rise.schedule.switch_step=9",
                            "sampling.request_seeds=true"])
    policy, generator = build_backend(cfg)
    judge = HeldJudge()
    puts: list[tuple] = []
    made = threading.Condition()
    stream_open = generator.open_stream

    def spying_open(on_rollout):
        stream = stream_open(on_rollout)
        open_call = stream.call

        def call(tag, slots, params):
            handle = open_call(tag, slots, params)
            put = handle.put

            def spy(slot, request):
                with made:
                    puts.append((tag, slot, [f.done() for _, f in judge.calls]))
                    made.notify_all()
                put(slot, request)

            handle.put = spy
            return handle

        stream.call = call
        return stream

    generator.open_stream = spying_open
    decode_rows, decoded = generator._decode_rows, []
    second_chunk = threading.Event()

    def held_decode(rows, params, rng):  # the generator's thread: the second chunk waits for the test
        decoded.append([(row.slot, row.sample) for row in rows])
        if len(decoded) == 2:
            assert second_chunk.wait(timeout=600), "the second chunk was never let through"
        return decode_rows(rows, params, rng)

    generator._decode_rows = held_decode
    ctx = rubric.StepContext(cfg=cfg, policy=policy, generator=generator, judge=judge, schedule=rubric.make_schedule(cfg),
                             rng=__import__("random").Random(0), method=get_method("rise"), total_steps=3,
                             pipelined=True, request_seeds=True)
    train = [RubricPrompt("always-missed", ({"role": "user", "content": "describe the river"},), Rubric((
        Criterion('Says "zebra"', 1.0, (), MachineCheck("contains", "zebra")),))),  # never met: always hinted
        prompts(1, 1)[0]]
    result: dict = {}
    worker = threading.Thread(
        target=lambda: result.update(phase=rubric.pipelined_rollouts(ctx, train, 1, rubric.phase_plan(ctx, train, True))),
        daemon=True)
    worker.start()
    try:
        judge.wait_for_responses(5)  # the first chunk judged while the second is not yet generated
        first = len(judge.calls)
        assert decoded[0] == [(0, j) for j in range(4)] + [(1, 0)]
        assert judge.prompt_ids() == ["always-missed"] * 4 + ["pipe-1"]  # the first chunk's responses, no others
        second_chunk.set()
        judge.wait_for_responses(8)  # the second chunk's three, held
        assert decoded[1] == [(1, j) for j in range(1, 4)] and judge.prompt_ids()[5:] == ["pipe-1"] * 3
        for i in range(first):
            judge.release(i)  # prompt 0's four samples and prompt 1's first
        with made:
            assert made.wait_for(lambda: any(tag == "privileged" for tag, *_ in puts), timeout=600)
        tag, slot, done = next(p for p in puts if p[0] == "privileged")
        assert slot == 0  # prompt 0's request, made while prompt 1's last three verdicts were held:
        assert len(done) > first and done == [True] * first + [False] * (len(done) - first)
        for i in range(first, len(judge.calls)):
            judge.release(i)
        while worker.is_alive():
            with judge.arrived:
                judge.arrived.wait_for(lambda: any(not f.done() for _, f in judge.calls) or not worker.is_alive(),
                                       timeout=5)
            for i, (_, future) in enumerate(list(judge.calls)):
                if not future.done():
                    judge.release(i)
            worker.join(timeout=1)
    finally:
        second_chunk.set()  # a failed wait leaves no generator thread held
    phase = result["phase"]
    assert phase.targets[0] == 0 and len(phase.priv.rollouts[0]) == 4
