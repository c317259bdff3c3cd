"""Private loopback Ray clusters for tests, started again when Ray's start-up window runs out.

Every test that needs Ray starts its own cluster on 127.0.0.1 (never one another process on the machine runs,
docs/DESIGN.md §5) through one of these three helpers:

- ``init_local(...)``: ``ray.init(address="local", ...)`` in this process (its GCS and raylet are children of it);
- ``head_process(env, ...)``: ``ray start --head --block`` in its own session, for drivers in subprocesses;
- ``local_cluster(nodes, ...)``: ``ray.cluster_utils.Cluster``, one raylet per node, for declared GPUs.

Why the retry: after starting a raylet Ray waits a fixed 30 s for it to register with the GCS and then gives up
with "The current node timed out during startup" (ray/_private/node.py, ``raylet_start_wait_time_s = 30``, a
local variable: Ray 2.60 has no environment variable or ``_system_config`` entry for it). On a loaded 2-core
CI machine a raylet can miss that window although nothing is wrong. Only that failure is retried (a few
attempts); the processes the failed attempt left behind (Ray does not stop them: the node object never came
into being) are killed by PID, so the next attempt starts clean.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ATTEMPTS = 5  # a loaded 2-core machine missed the window 3 times in a row (make test-nemo beside make test)
STARTUP_TIMEOUT = "timed out during startup"  # ray/_private/node.py's message for the 30 s wait
HEAD_READY_S = 180  # hang guard for a `ray start` head to accept a driver

# Loopback only, no usage report, no auth prompt: what every private cluster's processes inherit.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "disabled"}


def is_startup_timeout(exc: BaseException) -> bool:
    return STARTUP_TIMEOUT in str(exc)


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc: no psutil in every venv)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def kill_pids(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:  # reap our own children (SIGKILL cannot be ignored: the wait is short); others raise at once
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def with_retry(start: Callable[[], T], what: str, attempts: int = ATTEMPTS,
               cleanup: Callable[[], None] | None = None) -> T:
    """``start()``, again after Ray's start-up timeout (at most ``attempts`` times). Processes this one started
    during a failed attempt are killed by PID, then ``cleanup()`` runs. Any other error is raised at once."""
    for attempt in range(1, attempts + 1):
        before = descendants(os.getpid())
        try:
            return start()
        except Exception as exc:  # noqa: BLE001 - only the start-up timeout is retried
            if not is_startup_timeout(exc):
                raise
            kill_pids(descendants(os.getpid()) - before)
            if cleanup is not None:
                cleanup()
            if attempt == attempts:
                raise RuntimeError(f"{what}: Ray's raylet missed its start-up window {attempts} times "
                                   f"(last: {exc})") from exc
            print(f"{what}: Ray's raylet missed its start-up window (attempt {attempt}/{attempts}); "
                  "starting again", file=sys.stderr)
    raise AssertionError("unreachable")


def init_local(**kwargs: Any) -> Any:
    """``ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, **kwargs)``: a private
    cluster of this process, retried after the start-up timeout. Returns the ``ray`` module."""
    import ray

    auth_mode = os.environ.get("RAY_AUTH_MODE")
    os.environ.update(LOOPBACK_ENV)
    os.environ.pop("RAY_ADDRESS", None)
    options = {"address": "local", "_node_ip_address": "127.0.0.1", "include_dashboard": False, **kwargs}
    try:
        with_retry(lambda: ray.init(**options), "ray.init(address='local')", cleanup=ray.shutdown)
    finally:
        # The token mode matters while Ray starts. Left 'disabled' in this process's environment it reached
        # every later subprocess of the session: a Slurm job a test submitted then wrote no Ray token
        # (tests/slurm/test_slurm_launcher.py). Unset is Ray's own default (no token).
        if auth_mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth_mode
    return ray


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _accepts_driver(address: str, env: dict[str, str]) -> bool:
    probe = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); ray.shutdown()"
    try:
        done = subprocess.run([sys.executable, "-c", probe, address], env=env, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _stop_session(head: subprocess.Popen) -> None:
    """A ``ray start --block`` head and everything in its session (GCS, raylet, workers) by PID: SIGTERM makes
    the head tear its cluster down; what is left after 60 s, or of a head that already exited (its daemons
    outlive it), is killed."""
    if head.poll() is None:
        head.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(head.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=10)


@contextlib.contextmanager
def head_process(env: dict[str, str], num_cpus: int, num_gpus: int = 0,
                 attempts: int = ATTEMPTS) -> Iterator[str]:
    """A private ``ray start --head --block`` on 127.0.0.1 (its own session and temp dir, stopped by PID),
    for drivers run as subprocesses with ``env``. Yields its address once a driver can attach. A head whose
    raylet misses the start-up window exits; it is cleaned up and started again on a new port."""
    env = {**env, **LOOPBACK_ENV}
    env.pop("RAY_ADDRESS", None)
    for attempt in range(1, attempts + 1):
        ray_tmp = Path("/tmp") / f"rn{uuid.uuid4().hex[:8]}"  # short: Ray's socket paths must fit in 107 bytes
        port = free_port()
        log = ray_tmp.with_suffix(".log")
        with open(log, "wb") as out:
            head = subprocess.Popen(
                [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                 "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
                 "--include-dashboard=false", f"--temp-dir={ray_tmp}", "--disable-usage-stats"],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        address = f"127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + HEAD_READY_S
            ready = False
            while not ready and head.poll() is None and time.monotonic() < deadline:
                ready = _accepts_driver(address, env)
            if not ready:
                text = log.read_text(errors="replace")
                if STARTUP_TIMEOUT in text and attempt < attempts:
                    print(f"private Ray head on {address}: the raylet missed its start-up window "
                          f"(attempt {attempt}/{attempts}); starting again", file=sys.stderr)
                    continue  # the finally below stops this head's session
                last = text.strip().splitlines()[-1:] or ["(no output)"]
                raise RuntimeError(f"private Ray head on {address} did not start (exit {head.poll()}): {last[0]}")
            yield address
            return
        finally:
            _stop_session(head)
            shutil.rmtree(ray_tmp, ignore_errors=True)
            log.unlink(missing_ok=True)


@contextlib.contextmanager
def local_cluster(nodes: int, num_gpus: int, num_cpus: int, temp_dir: Path,
                  attempts: int = ATTEMPTS) -> Iterator[Any]:
    """``nodes`` raylets on 127.0.0.1 (``ray.cluster_utils.Cluster``), each declaring ``num_gpus`` GPUs it need
    not have and ``num_cpus`` CPUs. Yields the cluster; shuts it down (its own processes) on exit."""
    from ray.cluster_utils import Cluster

    os.environ.update(LOOPBACK_ENV)
    holder: list[Any] = []

    def start() -> Any:
        cluster = Cluster(initialize_head=False)
        holder[:] = [cluster]
        cluster.add_node(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                         node_ip_address="127.0.0.1", temp_dir=str(temp_dir))
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=num_cpus, num_gpus=num_gpus, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        return cluster

    def cleanup() -> None:
        for cluster in holder:
            with contextlib.suppress(Exception):
                cluster.shutdown()

    cluster = with_retry(start, f"Ray cluster of {nodes} node(s) x {num_gpus} GPU(s)", attempts, cleanup)
    try:
        yield cluster
    finally:
        cluster.shutdown()
