"""Run untrusted (model-written) Python in a bubblewrap sandbox: one process per execution, own namespaces.

Why bubblewrap (docs/DESIGN.md §10.1): it is the maintained, audited, unprivileged
namespace sandbox of Flatpak, a Debian package (``apt-get install bubblewrap``), a single setuid-free binary
that needs no daemon, no image and no root; nsjail needs a build from source or a container image, and a
SandboxFusion server is a service to deploy. What rise_nemo adds is only the policy below.

Every execution (``BubblewrapSandbox.run_python``) gets:
- new user, PID, network, IPC, UTS and cgroup namespaces: no network (loopback only, no route out), it sees
  only its own processes, it runs as uid/gid 65534 without capabilities and cannot nest user namespaces;
- a read-only view of the system (``/usr`` and the interpreter's prefix; the sandbox's own root is
  remounted read-only too), a fresh ``/proc`` and ``/dev``,
  a private size-capped tmpfs ``/tmp`` as its only writable place and working directory; the run
  directory, home directories, ``/work``, ``/etc`` (beyond the dynamic loader's cache) and the host's
  ``/tmp`` are not mounted at all;
- an empty environment (``--clearenv`` plus PATH, HOME=/tmp, LANG; bubblewrap itself is started with an
  empty one too, since its PID 1 is visible inside): no API keys or other trainer variables;
- rlimits: CPU seconds, address space, file size, process count (per sandbox: set inside its user
  namespace), no core dumps;
- the wall-clock deadline: the whole process group is killed (SIGKILL); bubblewrap's PID 1 dies with it
  (``--die-with-parent``), which makes the kernel kill every process left in the PID namespace (daemons,
  fork bombs, stopped processes);
- stdout/stderr read with a byte cap: a program that prints past it is killed (``output_limit``).
When the trainer runs as root, each execution drops to an unprivileged host uid first (``uid_base`` + pool
slot), because the kernel does not apply RLIMIT_NPROC to host root even inside a user namespace.

``SandboxPool`` runs executions in parallel on a fixed number of threads with a bounded submission queue
(``submit`` blocks when it is full: back-pressure, never an unbounded backlog). On a NeMo-RL cluster the same
pool can live in a Ray actor on the judge or CPU nodes; that wrapper is not written yet.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rise_nemo.errors import UserError

__all__ = ["ExecResult", "SandboxLimits", "BubblewrapSandbox", "SandboxPool", "SandboxUnavailable", "bwrap_path"]

SANDBOX_UID = 65534  # "nobody" inside the sandbox
_MIB = 1 << 20


class SandboxUnavailable(UserError):
    """bubblewrap is missing or cannot create namespaces here (one line: which, and what to do); the CLI
    prints it instead of a traceback."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 10.0  # killed (whole process group) after this
    cpu_seconds: int = 10  # RLIMIT_CPU (SIGXCPU, then SIGKILL)
    memory_mb: int = 1024  # RLIMIT_AS: address space of each process
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file it may write
    processes: int = 32  # RLIMIT_NPROC inside its user namespace
    tmp_mb: int = 64  # size of its private /tmp
    stdout_bytes: int = 4 * _MIB  # read cap; beyond it the program is killed
    stderr_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_mb", "file_size_mb", "processes", "tmp_mb",
                     "stdout_bytes", "stderr_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class ExecResult:
    returncode: int | None  # None when killed by us (deadline / output cap)
    stdout: bytes
    stderr: bytes
    wall_seconds: float
    timed_out: bool = False  # the wall-clock deadline killed it
    output_limited: bool = False  # it printed past the cap and was killed
    signal_name: str | None = None  # the signal that ended it, if any (SIGKILL, SIGSEGV, SIGXCPU, ...)

    @property
    def reason(self) -> str:
        """One line for logs: how the execution ended."""
        if self.timed_out:
            return f"wall-clock limit ({self.wall_seconds:.1f}s) reached, process group killed"
        if self.output_limited:
            return "output limit exceeded, process group killed"
        if self.signal_name:
            return f"killed by {self.signal_name}"
        return f"exit code {self.returncode}"


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed; the code sandbox needs it: apt-get install bubblewrap")
    return path


_CLEAN_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_RLIMIT_PROLOGUE = (
    "import resource as _rl; _rl.setrlimit(_rl.RLIMIT_NPROC, ({n}, {n})); del _rl\n"
)


class BubblewrapSandbox:
    """Runs a Python program in a fresh bubblewrap sandbox per call (see the module docstring).

    ``python``: the interpreter inside the sandbox (default ``/usr/bin/python3`` when present, else the
    trainer's base interpreter; its prefix is mounted read-only). ``uid_base``: the host uids the executions
    drop to when the trainer runs as root (one per pool slot).
    """

    def __init__(self, limits: SandboxLimits | None = None, python: str | None = None, uid_base: int = 200000):
        self.bwrap = bwrap_path()
        self.limits = limits or SandboxLimits()
        self.python = python or _default_python()
        self.uid_base = int(uid_base)
        self._ro_paths = _system_mounts(self.python)
        self._checked = False

    def check(self) -> None:
        """Fail early, with the reason, when bubblewrap cannot create its namespaces on this machine."""
        if self._checked:
            return
        res = self.run_python("print('ok')", limits=replace(self.limits, wall_seconds=30.0))
        if res.returncode != 0 or res.stdout.strip() != b"ok":
            raise SandboxUnavailable(
                "bubblewrap cannot start a sandbox here (user namespaces disabled? see "
                f"/proc/sys/user/max_user_namespaces): {res.reason}: {res.stderr.decode(errors='replace')[:300]}")
        self._checked = True

    def argv(self, limits: SandboxLimits) -> list[str]:
        args = [self.bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox"]
        args += self._ro_paths
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(limits.tmp_mb * _MIB), "--perms", "1777", "--tmpfs", "/tmp",
                 "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv",
                 "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
                 "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONIOENCODING", "utf-8",
                 "--setenv", "OPENBLAS_NUM_THREADS", "1", "--setenv", "OMP_NUM_THREADS", "1"]
        return args

    def run_python(self, code: str, stdin: bytes | str = b"", limits: SandboxLimits | None = None,
                   slot: int = 0) -> ExecResult:
        """Run ``code`` as ``python -I /tmp/main.py`` in a new sandbox, ``stdin`` on its standard input."""
        limits = limits or self.limits
        program = _RLIMIT_PROLOGUE.format(n=limits.processes) + code
        fd = os.memfd_create("rise-nemo-program", os.MFD_CLOEXEC)
        info_read, info_write = os.pipe2(os.O_CLOEXEC)
        open_write = [info_write]
        try:
            os.write(fd, program.encode("utf-8", errors="surrogatepass"))
            os.lseek(fd, 0, os.SEEK_SET)
            argv = self.argv(limits) + ["--info-fd", str(info_write), "--file", str(fd), "/tmp/main.py",
                                        "--", self.python, "-I", "/tmp/main.py"]

            def started() -> None:  # bwrap holds its copy; never close a descriptor number twice (threads)
                os.close(open_write.pop())

            return execute(argv, stdin, limits, preexec=self._preexec(limits, slot), pass_fds=(fd, info_write),
                           started=started, stop=lambda proc: _stop_sandbox(proc, info_read))
        finally:
            os.close(fd)
            os.close(info_read)
            if open_write:
                os.close(open_write.pop())

    def _preexec(self, limits: SandboxLimits, slot: int) -> Callable[[], None]:
        drop_to = self.uid_base + slot if os.geteuid() == 0 else None
        return _rlimits_then(limits, drop_to)


def bare_python(code: str, stdin: bytes | str = b"", limits: SandboxLimits | None = None,
                python: str | None = None) -> ExecResult:
    """The same program as a plain subprocess (same rlimits except the process count, no namespaces): the
    baseline of bench/sandbox.py's overhead ratio. Never use it for model-written code."""
    limits = limits or SandboxLimits()
    return execute([python or _default_python(), "-I", "-c", code], stdin, limits,
                   preexec=_rlimits_then(limits, None))


def _rlimits_then(limits: SandboxLimits, drop_to_uid: int | None) -> Callable[[], None]:
    cpu, mem, fsize = int(limits.cpu_seconds), limits.memory_mb * _MIB, limits.file_size_mb * _MIB

    def preexec() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if drop_to_uid is not None:
            os.setgroups([])
            os.setgid(drop_to_uid)
            os.setuid(drop_to_uid)

    return preexec


def _stop_sandbox(proc: subprocess.Popen, info_fd: int) -> None:
    """Kill a sandbox that is still running, innermost first: bubblewrap's PID 1 (host pid from --info-fd),
    whose death makes the kernel kill every process of the PID namespace before bubblewrap outside reaps it
    and exits. Killing the outer bubblewrap first would leave that teardown racing the caller (and an
    orphaned PID 1 for the host's init to reap)."""
    os.set_blocking(info_fd, False)
    try:
        info = json.loads(os.read(info_fd, 4096) or b"{}")
    except (OSError, ValueError):
        info = {}
    child = info.get("child-pid")
    if isinstance(child, int) and child > 1:
        try:
            os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def execute(argv: list[str], stdin: bytes | str, limits: SandboxLimits, preexec: Callable[[], None] | None = None,
            pass_fds: tuple[int, ...] = (), started: Callable[[], None] | None = None,
            stop: Callable[[subprocess.Popen], None] | None = None) -> ExecResult:
    """Run ``argv`` in its own process group with capped output and a wall-clock deadline; the whole group
    is SIGKILLed at the deadline, when the output cap is passed, and in any case before returning.

    ``argv`` starts with an empty environment (``_CLEAN_ENV``), never the trainer's: bubblewrap's own PID 1
    inside the sandbox keeps the environment it was started with, readable at /proc/1/environ.
    ``started`` runs once the process exists; ``stop(proc)`` runs before the group kill when it is still
    running (bubblewrap's orderly teardown)."""
    data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
    start = time.monotonic()
    deadline = start + limits.wall_seconds
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=preexec, pass_fds=pass_fds, close_fds=True,
                            env=dict(_CLEAN_ENV), cwd="/")
    if started is not None:
        started()
    caps = {proc.stdout: limits.stdout_bytes, proc.stderr: limits.stderr_bytes}
    chunks: dict[Any, list[bytes]] = {proc.stdout: [], proc.stderr: []}
    sizes = dict.fromkeys(chunks, 0)
    timed_out = output_limited = False
    writer = threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True)
    writer.start()
    try:
        with selectors.DefaultSelector() as sel:
            for stream in chunks:
                os.set_blocking(stream.fileno(), False)
                sel.register(stream, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in sel.select(timeout=min(left, 1.0)):
                    stream = key.fileobj
                    try:
                        block = os.read(stream.fileno(), 65536)
                    except BlockingIOError:
                        continue
                    if not block:
                        sel.unregister(stream)
                        continue
                    keep = max(0, caps[stream] - sizes[stream])
                    if keep:
                        chunks[stream].append(block[:keep])
                    sizes[stream] += len(block)
                    if stream is proc.stdout and sizes[stream] > caps[stream]:
                        output_limited = True  # stdout is the answer: past its cap the program is killed
                        break
                    # stderr past its cap: its head is kept, the rest read and dropped (never blocks it)
                if output_limited:
                    break
        if not (timed_out or output_limited):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # closed its pipes but kept running
                timed_out = True
    finally:
        if stop is not None and proc.poll() is None:
            stop(proc)
        _kill_group(proc)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
        writer.join(timeout=5)
    wall = time.monotonic() - start
    code = proc.returncode
    killed_by_us = timed_out or output_limited
    sig = signal.Signals(-code).name if code is not None and code < 0 and not killed_by_us else None
    if code is not None and code >= 128 + 1 and not killed_by_us:  # bwrap reports the child's signal so
        try:
            sig = signal.Signals(code - 128).name
        except ValueError:
            sig = None
    return ExecResult(None if killed_by_us else code, b"".join(chunks[proc.stdout]), b"".join(chunks[proc.stderr]),
                      wall, timed_out, output_limited, sig)


def _feed(pipe: Any, data: bytes) -> None:
    try:
        if data:
            pipe.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the program exited or closed its stdin: not our failure
    finally:
        try:
            pipe.close()
        except (BrokenPipeError, OSError):
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _default_python() -> str:
    system = Path("/usr/bin/python3")
    if system.exists():
        return str(system)
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _system_mounts(python: str) -> list[str]:
    """Read-only mounts: /usr (merged-/usr symlinks for /bin, /lib, ...), the loader's cache, and the
    interpreter's prefix when it lives outside /usr."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / top
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"):
        args += ["--ro-bind-try", etc, etc]
    real = Path(os.path.realpath(python))
    if not str(real).startswith("/usr/"):
        prefix = real.parent.parent  # <prefix>/bin/python3.x
        args += ["--ro-bind", str(prefix), str(prefix)]
    return args


class SandboxPool:
    """A fixed number of sandbox slots running in parallel, with a bounded queue (back-pressure).

    ``submit`` blocks while ``max_pending`` executions are queued or running; each worker thread owns one
    slot (its host uid when the trainer is root). Use as a context manager or call ``close``.
    """

    def __init__(self, sandbox: BubblewrapSandbox, workers: int = 2, max_pending: int | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.sandbox = sandbox
        self.workers = workers
        self.max_pending = max_pending or 2 * workers
        self._room = threading.BoundedSemaphore(self.max_pending)
        self._local = threading.local()
        slots = itertools.count()
        self._executor = ThreadPoolExecutor(
            workers, thread_name_prefix="sandbox", initializer=lambda: setattr(self._local, "slot", next(slots)))

    def submit_task(self, task: Callable[[BubblewrapSandbox, int], Any]) -> Future:
        """Run ``task(sandbox, slot)`` on a worker (a task may run several executions on its slot, in order)."""
        self._room.acquire()  # back-pressure: wait for room instead of queueing without bound
        try:
            future = self._executor.submit(lambda: task(self.sandbox, getattr(self._local, "slot", 0)))
        except BaseException:
            self._room.release()
            raise
        future.add_done_callback(lambda _f: self._room.release())
        return future

    def submit(self, code: str, stdin: bytes | str = b"", limits: SandboxLimits | None = None) -> Future:
        """One ``run_python`` execution; the future's result is its ``ExecResult``."""
        return self.submit_task(lambda sandbox, slot: sandbox.run_python(code, stdin, limits, slot=slot))

    def map(self, jobs: Iterable[tuple[str, bytes | str]], limits: SandboxLimits | None = None) -> list[ExecResult]:
        """Run ``(code, stdin)`` jobs; results in input order."""
        return [f.result() for f in [self.submit(code, stdin, limits) for code, stdin in jobs]]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
