"""Fail fast on the cluster path: an exception ends the process in bounded time with one line on stderr.

On ``backend: nemo`` the driver owns Ray actors (NeMo-RL's policy, vLLM and value worker groups) and NeMo-RL
starts threads of its own. When one worker raises, its peers can stay blocked in a collective, and a Python
driver that returns normally then waits at exit for non-daemon threads and Ray's atexit shutdown: the
process never ends, and on Slurm the job holds every node until its time limit. ``fail_fast``
turns any exception that escapes the command into:

- one line on stderr (``rise-nemo train: RayTaskError(RuntimeError): ...``; a user error keeps the CLI's
  own format and exit code 2), the full traceback appended to ``<run dir>/train.log`` when the run
  directory exists;
- ``ray.shutdown()`` with a bound (``shutdown_timeout_s``), so the driver's actors and, for a driver that
  started its own Ray, the local raylet go away;
- ``os._exit`` with a non-zero status: no wait for stuck threads or atexit handlers.

Only when something could keep the process alive (Ray initialised in this process, or a live non-daemon
thread besides the main one): an error raised before any of that started (a refused recipe, say) propagates
as usual, so a caller that runs the command in-process (tests, notebooks) is not ended with it.

Nothing in the run directory is deleted or rewritten: checkpoints written before the failure stay, and
``rise-nemo train`` resumes from the newest one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SHUTDOWN_TIMEOUT_S = 60.0
# The fail_fast contexts open in this process, innermost last: (command, run_dir) for ``abort``.
_ACTIVE: list[tuple[str, Callable[[], Path | None]]] = []


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``. A Ray task error (``RayTaskError(X)``, its message the remote
    traceback) names the remote function and the remote exception's own first line."""
    where = ""
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError: the worker's exception
    if isinstance(cause, BaseException):
        where = f" in {getattr(exc, 'function_name', 'a Ray worker')}"
        text = str(cause)
    else:
        text = str(exc)
    text = re.sub(r"\x1b\[[0-9;]*m", "", text).strip()  # Ray colours the remote function name
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}{where}: {first}" if first else f"{type(exc).__name__}{where}"


# NeMo-RL worker objects registered by ``shut_down_at_exit`` (weak references), shut down by ``shut_down_workers``.
_LIVE_WORKERS: list[weakref.ref] = []
_EXIT_HOOK_REGISTERED = False


def shut_down_at_exit(*workers: Any) -> None:
    """Shut NeMo-RL's worker objects (``Policy``, ``VllmGeneration``, ``Value``) down while Ray is still up: when
    the interpreter exits, BEFORE Ray's own atexit ``ray.shutdown()``, or earlier in ``shutdown_ray``.

    Each of them shuts its Ray workers down in ``__del__`` through actor calls. One still alive after Ray has shut
    down (held by a reference cycle, a module global or an exception's traceback) is collected later; its actor
    call then starts Ray again, while the interpreter finalises, and the process never ends: `rise-nemo train` on
    the async vLLM engine finished its run and hung in ``VllmGeneration.__del__`` -> ``ray.init`` ->
    ``Thread.start`` (make test-nemo, 2026-12-04), and bench/pipelined_step.py, after an error and its own
    ``ray.shutdown()``, hung in the same call. atexit runs its hooks last in, first out, and Ray registers its hook
    when ``ray`` is imported, so this one (registered once, at the first call, after that import) runs first;
    ``worker_group.shutdown`` empties the group, so ``__del__`` finds nothing left to do. Weak references: an
    object collected earlier is skipped, and one that cannot be referenced weakly (a test's stand-in) is not
    registered."""
    global _EXIT_HOOK_REGISTERED
    for worker in workers:
        try:
            _LIVE_WORKERS.append(weakref.ref(worker))
        except TypeError:
            continue
    if _LIVE_WORKERS and not _EXIT_HOOK_REGISTERED:
        atexit.register(shut_down_workers)
        _EXIT_HOOK_REGISTERED = True


def shut_down_workers() -> None:
    """Shut every registered worker object still alive down, newest first (Ray must be up: without it there is
    nothing to call). NeMo-RL bounds each group's graceful cleanup (30 s) before it kills the actors."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    while _LIVE_WORKERS:
        worker = _LIVE_WORKERS.pop()()
        shutdown = getattr(worker, "shutdown", None)
        if not callable(shutdown):
            continue
        try:
            shutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down: report, never block the exit
            print(f"rise-nemo: shutting {type(worker).__name__} down failed: {one_line(exc)}", file=sys.stderr)


def shutdown_ray(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
    """The registered worker objects, then ``ray.shutdown()``, in a daemon thread waited for at most
    ``timeout_s``; True when it finished (or Ray was never started in this process). A script that ends Ray
    itself calls this instead of ``ray.shutdown()``, so no worker object outlives Ray (``shut_down_at_exit``)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return True
    done = threading.Event()

    def stop() -> None:
        try:
            shut_down_workers()
            ray.shutdown()
        finally:
            done.set()

    threading.Thread(target=stop, name="rise-ray-shutdown", daemon=True).start()
    return done.wait(timeout_s)


def could_hang() -> bool:
    """Whether a normal return could leave the process waiting: Ray is initialised here, or a non-daemon thread
    other than the main one is alive (Python joins those at exit)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return True
    main = threading.main_thread()
    return any(t.is_alive() and not t.daemon and t is not main for t in threading.enumerate())


def _append_traceback(run_dir: Path | None, exc: BaseException) -> Path | None:
    if run_dir is None or not Path(run_dir).is_dir():
        return None
    log = Path(run_dir) / "train.log"
    try:
        with open(log, "a") as fh:
            fh.write("rise-nemo: the run failed; traceback:\n")
            fh.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    except OSError:
        return None
    return log


@contextlib.contextmanager
def fail_fast(command: str, run_dir: Callable[[], Path | None] = lambda: None,
              user_errors: tuple[type[BaseException], ...] = (),
              shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S, exit: Callable[[int], None] = os._exit,
              must_exit: Callable[[], bool] = could_hang) -> Iterator[None]:
    """Run the body; on any exception print one line, shut Ray down (bounded) and ``exit`` non-zero, when
    ``must_exit()`` says the process could otherwise hang; else the exception propagates unchanged.

    ``run_dir``: called after the failure, the run directory to append the traceback to (None: nowhere).
    ``exit``: ``os._exit`` (tests pass a recorder)."""
    _ACTIVE.append((command, run_dir))
    try:
        yield
    except BaseException as exc:  # noqa: BLE001 - every failure must end the process
        if not must_exit():
            raise  # nothing can keep the process alive: the caller's own error handling ends it
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            code = 0
        else:
            code = 2 if isinstance(exc, user_errors) else 130 if isinstance(exc, KeyboardInterrupt) else 1
        where = None
        if code != 0:
            try:
                where = _append_traceback(run_dir(), exc)
            except Exception:  # noqa: BLE001 - reporting must not block the exit
                where = None
            message = str(exc) if code == 2 else one_line(exc)
            hint = f" (traceback in {where})" if where is not None else ""
            print(f"{command}: {message}{hint}", file=sys.stderr)
        stopped = shutdown_ray(shutdown_timeout_s)
        if not stopped:
            print(f"{command}: ray.shutdown() did not finish within {shutdown_timeout_s:g} s; exiting anyway",
                  file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        exit(code)
        raise  # only reached when ``exit`` returns (tests)
    finally:
        _ACTIVE.pop()


def abort(message: str, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S, exit: Callable[[int], None] = os._exit) -> None:
    """End the process from any thread, the way ``fail_fast`` ends it: ``message`` as one line on stderr (after
    the innermost open command's name, else ``rise-nemo``), appended to that command's ``train.log``, exit
    status 1. For failures no exception reports, e.g. a Ray actor that is never placed while the main thread
    waits for it (rise_nemo.backends.nemo.placement.PlacementWatchdog).

    Ray is shut down (with a bound) only from the main thread: ``ray.shutdown()`` from another thread while the
    main thread waits in ``ray.get`` ends the process at once with status 0 (measured, Ray 2.60), which would
    report the failure as a success. Ray ends a job's actors when its driver process exits."""
    command, run_dir = _ACTIVE[-1] if _ACTIVE else ("rise-nemo", lambda: None)
    print(f"{command}: {message}", file=sys.stderr)
    try:
        directory = run_dir()
        if directory is not None and Path(directory).is_dir():
            with open(Path(directory) / "train.log", "a") as fh:
                fh.write(f"rise-nemo: the run was ended: {message}\n")
    except Exception:  # noqa: BLE001 - reporting must not block the exit
        pass
    if threading.current_thread() is threading.main_thread() and not shutdown_ray(shutdown_timeout_s):
        print(f"{command}: ray.shutdown() did not finish within {shutdown_timeout_s:g} s; exiting anyway",
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    exit(1)
