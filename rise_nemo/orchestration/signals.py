"""Graceful stop on SIGINT / SIGTERM / SIGUSR1: finish the current step, checkpoint, exit 0 (a step that
waits on a server which stopped with the job is abandoned instead: trainer.py).

Slurm sends a signal before the time limit (``--signal``) and SIGTERM on preemption/requeue; the trainer
checks ``StopFlag.requested`` after each step. A second SIGINT while stopping raises KeyboardInterrupt
(an impatient Ctrl-C still works). The request is also published process-wide (rise_nemo.stopping), so a
stage waiting on a server that went down with the job stops retrying (see that module for why).
"""

from __future__ import annotations

import signal
import threading

from rise_nemo.stopping import STOP_REQUESTED

HANDLED = ("SIGINT", "SIGTERM", "SIGUSR1")


class StopFlag:
    def __init__(self) -> None:
        self.requested: str | None = None  # name of the signal that asked us to stop
        self._previous: dict[int, object] = {}

    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and name == "SIGINT":
            raise KeyboardInterrupt
        self.request(name)

    def request(self, reason: str) -> None:
        """Asks the run to stop (what a signal does; also ``stop_after``)."""
        self.requested = reason
        STOP_REQUESTED.set()

    def __enter__(self) -> StopFlag:
        STOP_REQUESTED.clear()  # a request belongs to one run (tests run several in one process)
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for name in HANDLED:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> bool:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        STOP_REQUESTED.clear()
        return False
