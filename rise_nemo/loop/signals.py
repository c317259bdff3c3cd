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
        self._previous = _install(self._handler)
        return self

    def __exit__(self, *exc) -> bool:
        _restore(self._previous)
        STOP_REQUESTED.clear()
        return False


def _install(handler) -> dict[int, object]:
    """Set ``handler`` for every HANDLED signal (main thread only: elsewhere nothing); the previous handlers."""
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():  # handlers can only be set there
        for name in HANDLED:
            sig = getattr(signal, name, None)
            if sig is not None:
                previous[sig] = signal.signal(sig, handler)
    return previous


def _restore(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    previous.clear()


class SetupInterrupted(BaseException):
    """A stop signal arrived before training started (model build, warm start): nothing to checkpoint yet.
    A BaseException, like KeyboardInterrupt, so every ``finally`` / cleanup on the way out runs."""

    def __init__(self, signal_name: str):
        super().__init__(f"stopped by {signal_name} before training started (model build or warm start): "
                         "nothing was trained or checkpointed; run the same command again to start")
        self.signal_name = signal_name


class interrupt_setup:
    """While entered (main thread only), SIGINT / SIGTERM / SIGUSR1 raise ``SetupInterrupted``: a run stopped
    during its set-up removes what it created (its run directory's lock) instead of dying on the spot, and
    exits 0 like a stop during training (a Slurm requeue then simply runs the command again)."""

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}

    @staticmethod
    def _handler(signum, frame) -> None:
        raise SetupInterrupted(signal.Signals(signum).name)

    def __enter__(self) -> interrupt_setup:
        self._previous = _install(self._handler)
        return self

    def __exit__(self, *exc) -> bool:
        _restore(self._previous)
        return False
