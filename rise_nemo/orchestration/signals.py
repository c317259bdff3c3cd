"""Graceful stop on SIGINT / SIGTERM / SIGUSR1: finish the current step, checkpoint, exit 0.

Slurm sends a signal before the time limit (``--signal``) and SIGTERM on preemption/requeue; the trainer
checks ``StopFlag.requested`` after each step. A second SIGINT while stopping raises KeyboardInterrupt
(an impatient Ctrl-C still works).
"""

from __future__ import annotations

import signal
import threading

HANDLED = ("SIGINT", "SIGTERM", "SIGUSR1")


class StopFlag:
    def __init__(self) -> None:
        self.requested: str | None = None  # name of the signal that asked us to stop
        self._previous: dict[int, object] = {}

    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and name == "SIGINT":
            raise KeyboardInterrupt
        self.requested = name

    def __enter__(self) -> StopFlag:
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
        return False
