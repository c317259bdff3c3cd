"""One stop request per process, shared by the trainer's signal handler and the stages that wait on servers.

Why: on a Slurm requeue, preemption or ``scancel`` every step of the job gets SIGTERM at the same moment.
The judge and teacher servers run as ``srun`` steps, and an srun client answers SIGTERM by SIGKILLing its
step, so they are gone within a second; the driver (in the batch step) has until ``KillWait`` (30 s by
default) before its own SIGKILL. A training step still waiting for those servers can never finish in that
time. So once a stop is requested, a stage that needs a server gives up at its first failure instead of
retrying, raising ``StopInterrupted``; the trainer then checkpoints the last complete step
(rise_nemo/loop/trainer.py) and exits 0, and the requeued attempt resumes from there.
"""

from __future__ import annotations

import threading

# Set by rise_nemo.loop.signals.StopFlag on SIGINT / SIGTERM / SIGUSR1 (and by stop_after);
# cleared when a StopFlag is entered and left. Read from any thread (the judge's event-loop thread too).
STOP_REQUESTED = threading.Event()


class StopInterrupted(RuntimeError):
    """Work abandoned because the run was asked to stop and a service that work needs failed."""
