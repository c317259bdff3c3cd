"""Keep the driver's full garbage collections off the training steps' critical path.

CPython's full (generation-2) collection walks every container object the process tracks. A trainer's driver holds
~0.6 million of them once torch, transformers, Ray, vLLM's and NeMo-RL's modules, the tokenizer and the data are
loaded; one full collection of that heap takes 0.23-0.33 s on this project's 2-core CI machine (measured with those
imports, docs/results.md "Pipelined step"). The collector starts one whenever enough new objects have survived, so
it lands at a random point of a step: in the pipelined rubric step, the thread that hands finished responses to
the judge and makes the privileged requests stops for that long.

``frozen_setup`` collects once, then moves everything alive to the permanent generation (``gc.freeze``), which the
collector never walks: later full collections cost what the step's own objects cost. vLLM freezes its engine
process's heap after start-up for the same reason. Objects frozen here are still freed when their last reference
goes; only cyclic garbage among them waits until the block ends, where they are handed back to the collector
(``gc.unfreeze``), so a process that runs many trainers one after another (a test session) keeps nothing.

The block nests under someone else's freeze: ``gc.unfreeze`` cannot hand back only the objects one freeze moved, so
when the permanent generation is already in use at entry (an outer ``frozen_setup``, a caller's own ``gc.freeze``,
an in-process vLLM engine) the block still freezes what is new but leaves the unfreeze to whoever froze first.
Unfreezing there would silently undo the outer freeze and put its whole heap back under every full collection.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)


@contextlib.contextmanager
def frozen_setup() -> Iterator[int]:
    """Collect, freeze every object alive now for the block, unfreeze after it. Yields how many are frozen.

    Under an outer freeze (objects already frozen at entry) the block freezes too but does not unfreeze: see above.
    """
    start = time.perf_counter()
    owns_freeze = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("gc: %d setup objects frozen (%.2f s)%s", frozen, time.perf_counter() - start,
              "" if owns_freeze else "; an outer freeze was in place, it keeps the unfreeze")
    try:
        yield frozen
    finally:
        if owns_freeze:
            gc.unfreeze()
