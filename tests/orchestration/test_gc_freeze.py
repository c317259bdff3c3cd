"""The trainer's steps run with the setup's objects frozen out of full garbage collections (loop/gc_freeze.py)."""

from __future__ import annotations

import gc
import weakref

import pytest

from rise_nemo.loop.gc_freeze import frozen_setup


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


@pytest.fixture
def nothing_frozen():
    """These tests own the permanent generation: it must be empty when they start (and they leave it empty)."""
    assert gc.get_freeze_count() == 0, "an earlier test left objects frozen (gc.freeze without gc.unfreeze)"
    yield
    gc.unfreeze()


def test_frozen_setup_freezes_what_is_alive_and_gives_it_back_after_the_block(nothing_frozen):
    gc.collect()
    before = gc.get_freeze_count()
    setup = Node()  # alive when the block starts: frozen
    ref = weakref.ref(setup)
    with frozen_setup() as frozen:
        assert frozen > before and gc.get_freeze_count() > before  # (frozen objects still die by refcount)
        assert gc.is_tracked(setup) and not any(setup is o for o in gc.get_objects(generation=2))
        del setup
        gc.collect()
        assert ref() is not None  # cyclic garbage among frozen objects waits for the block's end ...
        during = Node()  # made inside the block: collected as usual
        during_ref = weakref.ref(during)
        del during
        gc.collect()
        assert during_ref() is None
    assert gc.get_freeze_count() == before
    gc.collect()
    assert ref() is None  # ... and is freed after it: nothing frozen outlives the block


def test_frozen_setup_unfreezes_when_the_block_raises(nothing_frozen):
    with pytest.raises(KeyError), frozen_setup():
        raise KeyError("step failed")
    assert gc.get_freeze_count() == 0


def test_frozen_setup_under_an_outer_freeze_leaves_that_freeze_in_place(nothing_frozen):
    """A caller's own gc.freeze (or an outer block) survives the inner block; the outer one still unfreezes all."""
    outer = Node()
    gc.collect()
    gc.freeze()  # the caller's freeze: `outer` is in the permanent generation
    outer_count = gc.get_freeze_count()
    made_between = Node()
    with frozen_setup() as frozen:
        assert frozen > outer_count  # what is new is frozen too
    # nothing handed back (the count only drops by frozen objects freed by refcount): the unfreeze is the caller's
    assert gc.get_freeze_count() > outer_count
    assert not any(o is outer or o is made_between for o in gc.get_objects(generation=2))

    with frozen_setup():  # the same, nested in our own block
        with frozen_setup():
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() > 0  # the outermost block did not own the freeze either

    gc.unfreeze()
    with frozen_setup():  # with nothing frozen before, the block owns and ends the freeze
        with frozen_setup():
            pass
        assert gc.get_freeze_count() > 0  # the inner block kept the outer's freeze
    assert gc.get_freeze_count() == 0


def test_the_trainers_steps_run_with_the_setup_frozen(tmp_path, make_trainer):
    """Every policy.train call of a run sees the setup's objects frozen; the run hands them back at its end."""
    seen: list[int] = []

    class FreezeProbe:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def train(self, data, loss_fn):
            seen.append(gc.get_freeze_count())
            return self.inner.train(data, loss_fn)

    before = gc.get_freeze_count()
    trainer = make_trainer(tmp_path / "run", "rise", ["train.steps=2"],
                           wrap=lambda policy, generator, judge: (FreezeProbe(policy), generator, judge))
    assert trainer.run() == 0
    assert len(seen) == 2 and all(count > before + 1000 for count in seen), seen  # the libraries, model, data
    assert gc.get_freeze_count() == before
