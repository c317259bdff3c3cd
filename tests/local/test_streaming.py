"""The local generator's streamed calls (interfaces.RolloutStream) and request seeding.

A streamed call must return exactly what ``generate`` returns for its put requests in slot order: the same
tokens, sampling log-probs and finished flags, bit for bit, whatever the order in which slots are put or
skipped. Request seeds give every row its own random numbers; the engine's own stream (no call seed) is taken
in the order the calls were opened, as by successive ``generate`` calls.
"""

from __future__ import annotations

import queue
import threading

import pytest

from rise_nemo.backends.local import build
from rise_nemo.backends.local.generator import RequestUniforms
from rise_nemo.interfaces import GenerationRequest, RolloutStream, SamplingParams, StreamingGenerator

CFG = {"tokenizer": "builtin:persistent_task", "seed": 0, "num_threads": 1, "generation_batch_size": 5}
PROMPTS = [[{"role": "user", "content": f"prompt number {i} " + "word " * (i % 4)}] for i in range(6)]
TIMEOUT_S = 600  # hang guard only


def _key(rollout):
    return rollout.response_token_ids, rollout.sampling_logprobs, rollout.finished, rollout.given_token_count


class Collector:
    def __init__(self):
        self.items: queue.Queue = queue.Queue()

    def __call__(self, tag, slot, sample, item):
        self.items.put((tag, slot, sample, item))

    def take(self, count: int) -> dict:
        out = {}
        for _ in range(count):
            tag, slot, sample, item = self.items.get(timeout=TIMEOUT_S)
            if isinstance(item, BaseException):
                raise item
            out[(tag, slot, sample)] = item
        return out


def _grouped(got: dict, tag, slots, n) -> list[list]:
    return [[_key(got[(tag, s, j)]) for j in range(n)] for s in slots]


@pytest.fixture(scope="module")
def generator():
    return build(CFG)[1]


def test_the_local_generator_streams(generator):
    assert isinstance(generator, StreamingGenerator)
    stream = generator.open_stream(Collector())
    assert isinstance(stream, RolloutStream)
    stream.close()


@pytest.mark.parametrize("seeded", [False, True])
def test_a_streamed_call_equals_generate_whatever_the_order_of_puts(generator, seeded):
    """Six slots, two skipped, put in reverse order: the rows are decoded in slot order in the chunks generate
    uses (5 rows per chunk; 4 x 3 = 12 rows -> 5 + 5 + 2), so the results are identical to generate's."""
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=11)
    kept = [0, 2, 3, 5]
    seeds = {s: tuple(1000 * s + j for j in range(3)) for s in kept} if seeded else {s: None for s in kept}
    reference = generator.generate([PROMPTS[s] for s in kept], 3, params,
                                   seeds=[list(seeds[s]) for s in kept] if seeded else None)
    sink = Collector()
    stream = generator.open_stream(sink)
    call = stream.call("natural", 6, params)
    for slot in reversed(range(6)):
        if slot in kept:
            call.put(slot, GenerationRequest(PROMPTS[slot], 3, seeds[slot]))
        else:
            call.skip(slot)
    got = sink.take(len(kept) * 3)
    stream.close()
    assert _grouped(got, "natural", kept, 3) == [[_key(r) for r in group] for group in reference]


def test_a_chunk_waits_until_its_rows_are_known(generator):
    """Nothing is decoded while the call's first slot is unknown (its rows would open the first chunk)."""
    params = SamplingParams(max_new_tokens=6, seed=2)
    sink = Collector()
    stream = generator.open_stream(sink)
    call = stream.call("late", 3, params)
    call.put(1, GenerationRequest(PROMPTS[1], 5))  # a full chunk, but behind slot 0
    call.put(2, GenerationRequest(PROMPTS[2], 5))
    with pytest.raises(queue.Empty):
        sink.items.get(timeout=2)
    call.skip(0)
    got = sink.take(10)
    stream.close()
    reference = generator.generate([PROMPTS[1], PROMPTS[2]], 5, params)
    assert _grouped(got, "late", [1, 2], 5) == [[_key(r) for r in g] for g in reference]


def test_calls_on_the_engines_stream_are_decoded_in_the_order_they_were_opened(generator):
    """Without a seed both calls draw from the engine's RNG: the second call's rows, known first, still wait
    for the first call, so the draws equal two successive generate calls from the same RNG state."""
    params = SamplingParams(max_new_tokens=10, temperature=1.0)
    state = generator.engine.rng.get_state()
    first = generator.generate(PROMPTS[:2], 3, params)
    second = generator.generate(PROMPTS[2:4], 2, params)
    generator.engine.rng.set_state(state)
    sink = Collector()
    stream = generator.open_stream(sink)
    a = stream.call("a", 2, params)
    b = stream.call("b", 2, params)
    b.put(0, GenerationRequest(PROMPTS[2], 2))
    b.put(1, GenerationRequest(PROMPTS[3], 2))
    a.put(1, GenerationRequest(PROMPTS[1], 3))
    a.put(0, GenerationRequest(PROMPTS[0], 3))
    got = sink.take(10)
    stream.close()
    assert _grouped(got, "a", [0, 1], 3) == [[_key(r) for r in g] for g in first]
    assert _grouped(got, "b", [0, 1], 2) == [[_key(r) for r in g] for g in second]


def test_request_uniforms_do_not_depend_on_the_other_rows():
    alone = RequestUniforms([7])
    batch = RequestUniforms([3, 7, 9])
    for _ in range(5):
        assert float(alone.uniforms(1)[0, 0]) == float(batch.uniforms(3)[1, 0])
    u = RequestUniforms(range(2000)).uniforms(2000)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.02
    with pytest.raises(ValueError, match="2 rows asked, 3 seeds"):
        RequestUniforms([1, 2, 3]).uniforms(2)


def test_seeded_samples_follow_their_seeds(generator):
    """The same seed gives the same sample in another call; a call's own seed no longer matters."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1)
    one = generator.generate(PROMPTS[:2], 2, params, seeds=[[5, 6], [7, 8]])
    other_seed = generator.generate(PROMPTS[:2], 2, SamplingParams(max_new_tokens=12, seed=99), seeds=[[5, 6], [7, 8]])
    assert [[_key(r) for r in g] for g in one] == [[_key(r) for r in g] for g in other_seed]
    swapped = generator.generate(PROMPTS[:2], 2, params, seeds=[[6, 5], [8, 7]])
    assert [_key(r) for r in swapped[0]] == [_key(r) for r in one[0]][::-1]
    with pytest.raises(ValueError, match="seeds must be 2 lists of 2"):
        generator.generate(PROMPTS[:2], 2, params, seeds=[[1, 2]])


def test_a_decode_failure_is_reported_for_every_row_of_its_chunk(generator, monkeypatch):
    sink = Collector()
    stream = generator.open_stream(sink)

    def broken(*args, **kwargs):
        raise RuntimeError("decoder broke")

    monkeypatch.setattr(generator, "_decode_batch", broken)
    call = stream.call("x", 1, SamplingParams(max_new_tokens=4, seed=0))
    call.put(0, GenerationRequest(PROMPTS[0], 2))
    reported = [sink.items.get(timeout=TIMEOUT_S) for _ in range(2)]
    stream.close()
    assert {(r[1], r[2]) for r in reported} == {(0, 0), (0, 1)}
    assert all(isinstance(r[3], RuntimeError) for r in reported)


def test_close_stops_the_stream_and_refuses_new_calls(generator):
    stream = generator.open_stream(Collector())
    call = stream.call("open", 2, SamplingParams(max_new_tokens=4, seed=0))
    call.put(1, GenerationRequest(PROMPTS[0], 1))  # slot 0 never comes: nothing decodes
    stream.close()
    assert not any(t.name == "rise-local-rollouts" and t.is_alive() for t in threading.enumerate()
                   if t is stream._thread)
    with pytest.raises(RuntimeError, match="closed"):
        stream.call("late", 1, SamplingParams())
    with pytest.raises(ValueError, match="already filled"):
        call.put(1, GenerationRequest(PROMPTS[0], 1))


def test_the_streamed_rows_use_the_same_chunks_as_generate(generator, monkeypatch):
    """The batches handed to the decoder are generate's chunks (5, 5, 2 rows), not whatever arrived first."""
    seen = []
    decode = type(generator)._decode_batch

    def spy(self, prompt_ids, params, rng):
        seen.append(len(prompt_ids))
        return decode(self, prompt_ids, params, rng)

    monkeypatch.setattr(type(generator), "_decode_batch", spy)
    sink = Collector()
    stream = generator.open_stream(sink)
    call = stream.call("c", 4, SamplingParams(max_new_tokens=4, seed=0))
    for slot in (3, 1, 2, 0):
        call.put(slot, GenerationRequest(PROMPTS[slot], 3))
    sink.take(12)
    stream.close()
    assert seen == [5, 5, 2]
