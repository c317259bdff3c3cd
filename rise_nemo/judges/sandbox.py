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
- a cgroup of its own (rise_nemo.judges.sandbox_cgroups): memory (swap 0) and process count capped over the
  execution as a whole, its private /tmp included; hitting either cap kills the whole execution
  (``ExecResult.limit``); the cgroup is removed when the execution ends;
- rlimits, the second line: CPU seconds, address space and file size per process, process count (per
  sandbox: set inside its user namespace), no core dumps. Without a usable cgroup they are the only line,
  and ``HostMemoryBudget`` bounds processes x memory of all parallel executions to a fraction of the host's
  memory (one warning line says so when the first sandbox is made);
- a seccomp filter: no ptrace, no reading or writing another process's memory, no memfd or System V
  shared memory (memory that no process's address space limit would count); bubblewrap's PID 1 is hidden
  (``/proc/1`` is an empty read-only directory);
- the wall-clock deadline: the whole process group is killed (SIGKILL); bubblewrap's PID 1 dies with it
  (``--die-with-parent``), which makes the kernel kill every process left in the PID namespace (daemons,
  fork bombs, stopped processes);
- stdout/stderr read with a byte cap: a program that prints past it is killed (``output_limit``).
When the trainer runs as root, each execution drops to an unprivileged host uid first (``uid_base`` + pool
slot), because the kernel does not apply RLIMIT_NPROC to host root even inside a user namespace.

With cgroups, each thread forks the process of its next execution on a slot ahead of time, already in its
own cgroup (rise_nemo.judges.sandbox_launch: entering a cgroup waits for an RCU grace period, which then
overlaps the current execution instead of delaying the next).

``SandboxPool`` runs executions in parallel on a fixed number of threads with a bounded submission queue
(``submit`` blocks when it is full: back-pressure, never an unbounded backlog), so N workers hold at most N
executions' caps. On a Ray cluster the pool lives in actors (rise_nemo.judges.ray_actor).
"""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import platform
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rise_nemo.errors import UserError
from rise_nemo.judges.sandbox_cgroups import CGROUP_ENV, ExecutionCgroup, ExecutionCgroups, discover
from rise_nemo.judges.sandbox_launch import ChildProcess, PreparedLaunch, limit_then_drop

__all__ = ["ExecResult", "SandboxLimits", "BubblewrapSandbox", "SandboxPool", "SandboxUnavailable", "bwrap_path",
           "HostMemoryBudget", "default_containment", "FALLBACK_HOST_FRACTION"]

log = logging.getLogger(__name__)

SANDBOX_UID = 65534  # "nobody" inside the sandbox
_MIB = 1 << 20
# Without cgroups: processes x memory_mb (+ tmp_mb) of all executions running at once in one trainer process
# stay within this fraction of the host's memory (HostMemoryBudget).
FALLBACK_HOST_FRACTION = 0.5


class SandboxUnavailable(UserError):
    """bubblewrap is missing or cannot create namespaces here (one line: which, and what to do); the CLI
    prints it instead of a traceback."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per execution (a cgroup): ``execution_memory_mb``, ``processes`` (pids.max), ``tmp_mb``, the wall
    clock and the output caps. Per process (rlimits): ``memory_mb``, ``cpu_seconds``, ``file_size_mb``; and
    ``processes`` again as RLIMIT_NPROC of the sandbox's user."""

    wall_seconds: float = 10.0  # killed (whole process group) after this
    cpu_seconds: int = 10  # RLIMIT_CPU (SIGXCPU, then SIGKILL)
    memory_mb: int = 1024  # RLIMIT_AS: address space of each process
    file_size_mb: int = 16  # RLIMIT_FSIZE: largest file it may write
    processes: int = 32  # processes + threads of the execution, bubblewrap's 2 included (pids.max; RLIMIT_NPROC)
    tmp_mb: int = 64  # size of its private /tmp
    stdout_bytes: int = 4 * _MIB  # read cap; beyond it the program is killed
    stderr_bytes: int = 64 * 1024
    execution_memory_mb: int | None = None  # memory.max of the whole execution; None: memory_mb + tmp_mb

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_mb", "file_size_mb", "processes", "tmp_mb",
                     "stdout_bytes", "stderr_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.execution_memory_mb is not None and not self.execution_memory_mb > 0:
            raise ValueError(f"SandboxLimits.execution_memory_mb must be > 0, got {self.execution_memory_mb!r}")

    @property
    def execution_memory_bytes(self) -> int:
        """The memory cap of one execution as a whole: by default one process's whole address space plus a
        full /tmp (one program using its limit passes; N processes share it)."""
        mb = self.execution_memory_mb if self.execution_memory_mb is not None else self.memory_mb + self.tmp_mb
        return mb * _MIB


@dataclass(frozen=True)
class ExecResult:
    returncode: int | None  # None when killed by us (deadline / output cap)
    stdout: bytes
    stderr: bytes
    wall_seconds: float
    timed_out: bool = False  # the wall-clock deadline killed it
    output_limited: bool = False  # it printed past the cap and was killed
    signal_name: str | None = None  # the signal that ended it, if any (SIGKILL, SIGSEGV, SIGXCPU, ...)
    limit: str | None = None  # "memory" / "processes": it hit its cgroup's cap; the whole execution was killed
    limit_reason: str = ""  # one line on that cap
    peak_memory_bytes: int | None = None  # the most its cgroup held at once (None without a cgroup)
    cgroup: str | None = None  # the cgroup it ran in (removed since)

    @property
    def reason(self) -> str:
        """One line for logs: how the execution ended."""
        if self.limit:
            return self.limit_reason or f"execution {self.limit} cap reached, whole execution killed"
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
# How often a running execution's cgroup is checked for a hit cap (two small reads).
_WATCH_SECONDS = 0.05


class HostMemoryBudget:
    """The fallback without cgroups: caps stay per process (RLIMIT_AS x RLIMIT_NPROC), so an execution may
    hold ``processes x memory_mb`` plus its /tmp. This bounds that product over every execution that may run
    at once in this trainer process (the pool slots registered by ``SandboxPool``, at least one) to
    ``fraction`` of the host's memory: each execution gets ``fraction x MemTotal / slots``, its process
    count lowered to fit, and, where one process does not fit, its address space too."""

    def __init__(self, total_bytes: int | None = None, fraction: float = FALLBACK_HOST_FRACTION,
                 reason: str = ""):
        if not 0 < fraction <= 1:
            raise ValueError(f"HostMemoryBudget fraction must be in (0, 1], got {fraction}")
        self.total_bytes = int(total_bytes if total_bytes is not None else _host_memory_bytes())
        self.fraction = float(fraction)
        self.reason = reason  # why there is no cgroup
        self._slots = 0
        self._lock = threading.Lock()
        self._reported: set[tuple[int, int]] = set()

    @property
    def budget_bytes(self) -> int:
        return int(self.fraction * self.total_bytes)

    def register(self, slots: int) -> None:
        with self._lock:
            self._slots += slots
        self.per_execution_bytes()  # fail now, at pool creation, when the slots cannot fit

    def unregister(self, slots: int) -> None:
        with self._lock:
            self._slots = max(0, self._slots - slots)

    def per_execution_bytes(self) -> int:
        with self._lock:
            slots = max(1, self._slots)
        share = self.budget_bytes // slots
        if share < 64 * _MIB:
            raise SandboxUnavailable(
                f"code sandbox: without cgroups ({self.reason}) {slots} parallel executions get "
                f"{share / _MIB:.0f} MiB each of {self.fraction:.0%} of host memory; lower the pool's workers or "
                f"give the sandbox a cgroup (run as root, or set {CGROUP_ENV} to a delegated cgroup v2 directory)")
        return share

    def bound(self, limits: SandboxLimits) -> SandboxLimits:
        """``limits`` with processes (then memory_mb) lowered so that processes x memory_mb + tmp_mb fits."""
        share = self.per_execution_bytes()
        room = share - limits.tmp_mb * _MIB
        processes = min(limits.processes, room // (limits.memory_mb * _MIB))
        memory_mb = limits.memory_mb
        if processes < 2:  # bubblewrap's PID 1 counts as one of the sandbox user's processes
            processes = 2
            memory_mb = min(memory_mb, max(32, room // (2 * _MIB)))
        if (processes, memory_mb) == (limits.processes, limits.memory_mb):
            return limits
        if (processes, memory_mb) not in self._reported:
            self._reported.add((processes, memory_mb))
            log.info("code sandbox (no cgroups): processes %d -> %d, memory_mb %d -> %d to fit %.0f MiB per "
                     "execution", limits.processes, processes, limits.memory_mb, memory_mb, share / _MIB)
        return replace(limits, processes=int(processes), memory_mb=int(memory_mb))

    def notice(self) -> str:
        return (f"code sandbox: no cgroup for executions ({self.reason}); memory and processes are capped per "
                f"process only (RLIMIT_AS, RLIMIT_NPROC), with processes x memory_mb + tmp_mb of all parallel "
                f"executions bounded to {self.fraction:.0%} of host memory ({self.budget_bytes / 2**30:.1f} GiB)")


def _host_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_DEFAULT: dict[int, ExecutionCgroups | HostMemoryBudget] = {}  # per process id (a forked child finds its own)
_DEFAULT_LOCK = threading.Lock()


def default_containment() -> ExecutionCgroups | HostMemoryBudget:
    """This process's containment, found once: per-execution cgroups where usable, else the host memory
    budget, announced by one warning line."""
    with _DEFAULT_LOCK:
        found = _DEFAULT.get(os.getpid())
        if found is None:
            cgroups = discover()
            if isinstance(cgroups, ExecutionCgroups):
                found = cgroups
                atexit.register(cgroups.close)
                log.info("code sandbox: one cgroup v%d per execution under %s (%s)", cgroups.version,
                         ", ".join(str(p) for p in cgroups.parents), cgroups.where)
            else:
                found = HostMemoryBudget(reason=cgroups)
                log.warning(found.notice())
            _DEFAULT[os.getpid()] = found
        return found


class BubblewrapSandbox:
    """Runs a Python program in a fresh bubblewrap sandbox per call (see the module docstring).

    ``python``: the interpreter inside the sandbox (default ``/usr/bin/python3`` when present, else the
    trainer's base interpreter; its prefix is mounted read-only). ``uid_base``: the host uids the executions
    drop to when the trainer runs as root (one per pool slot). ``containment``: per-execution cgroups or the
    fallback budget (default: this process's, ``default_containment()``).
    """

    def __init__(self, limits: SandboxLimits | None = None, python: str | None = None, uid_base: int = 200000,
                 containment: ExecutionCgroups | HostMemoryBudget | None = None):
        self.bwrap = bwrap_path()
        self.limits = limits or SandboxLimits()
        self.python = python or _default_python()
        self.uid_base = int(uid_base)
        self.containment = containment if containment is not None else default_containment()
        self._ro_paths = _system_mounts(self.python)
        self._seccomp = _seccomp_filter()
        self._checked = False
        self._prepared: dict[tuple[int, int], PreparedLaunch] = {}  # (slot, thread): the next execution's, forked
        self._prepared_lock = threading.Lock()
        weakref.finalize(self, _discard_all, self._prepared, self._prepared_lock)  # at collection or exit

    @property
    def cgroups(self) -> ExecutionCgroups | None:
        """The per-execution cgroups, or None on the rlimit-only fallback."""
        return self.containment if isinstance(self.containment, ExecutionCgroups) else None

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
        args += ["--proc", "/proc", "--tmpfs", "/proc/1", "--remount-ro", "/proc/1", "--dev", "/dev",
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
        if self.cgroups is None:
            limits = self.containment.bound(limits)
        launch = self._take_prepared(slot, limits) or self._prepare(slot, limits)
        cgroup = launch.cgroup
        program = (_RLIMIT_PROLOGUE.format(n=limits.processes) + code).encode("utf-8", errors="surrogatepass")

        def spawn() -> ChildProcess:
            try:
                launch.release(program, int(limits.cpu_seconds), limits.memory_mb * _MIB,
                               limits.file_size_mb * _MIB)
            except OSError as exc:
                raise SandboxUnavailable(f"code sandbox: {exc}") from None
            return launch.process

        def prepare_next() -> None:  # the next execution on this slot joins its cgroup while this one runs
            if self.cgroups is None:
                return
            try:
                self._keep_prepared(slot, self._prepare(slot, limits))
            except OSError as exc:  # only a head start lost: the next execution forks its own
                log.warning("code sandbox: could not prepare the next execution ahead: %s", exc)

        try:
            res = execute([], stdin, limits, spawn=spawn, started=prepare_next,
                          stop=lambda proc: _stop_sandbox(proc, launch.info_read),
                          watch=cgroup.limit_hit if cgroup is not None else None)
        finally:
            launch.close_fds()
            if cgroup is not None:
                cgroup.kill()  # whatever outlived bubblewrap's PID 1 (nothing should)
                hit, peak = cgroup.limit_hit(), cgroup.peak_bytes()
                cgroup.remove()
        if cgroup is None:
            return res
        return _with_cgroup(res, cgroup, hit, peak)

    # ---- launches prepared ahead (rise_nemo.judges.sandbox_launch) -----------------------------------------
    def _prepare(self, slot: int, limits: SandboxLimits) -> PreparedLaunch:
        cgroup = None
        if self.cgroups is not None:
            cgroup = self.cgroups.create(limits.execution_memory_bytes, limits.processes)
        try:
            return PreparedLaunch(self.argv(limits), [self.python, "-I", "/tmp/main.py"], self._seccomp, cgroup,
                                  self.uid_base + slot if os.geteuid() == 0 else None, dict(_CLEAN_ENV),
                                  _launch_key(limits))
        except BaseException:
            if cgroup is not None:
                cgroup.remove()
            raise

    # A launch is kept for the slot and the thread that forked it, and only that thread runs it: bubblewrap's
    # --die-with-parent follows the thread that forked it (prctl PR_SET_PDEATHSIG), so a launch handed to
    # another thread would die with its first thread (a closed pool's worker) in the middle of an execution.
    def _take_prepared(self, slot: int, limits: SandboxLimits) -> PreparedLaunch | None:
        with self._prepared_lock:
            launch = self._prepared.pop((slot, threading.get_ident()), None)
        if launch is not None and launch.key != _launch_key(limits):
            _discard(launch)
            launch = None
        return launch

    def _keep_prepared(self, slot: int, launch: PreparedLaunch) -> None:
        with self._prepared_lock:
            launch, self._prepared[(slot, threading.get_ident())] = (
                self._prepared.get((slot, threading.get_ident())), launch)
        if launch is not None:  # cannot happen (one thread, one execution at a time); never leak one
            _discard(launch)

    def discard_prepared(self, threads: Iterable[int] | None = None) -> None:
        """Reap the launches prepared for next executions (and remove their cgroups), of ``threads`` (their
        ``threading.get_ident()``; default all): when a pool closes, at close and at exit."""
        _discard_all(self._prepared, self._prepared_lock, None if threads is None else set(threads))

    def close(self) -> None:
        self.discard_prepared()


def _launch_key(limits: SandboxLimits) -> tuple:
    """What a prepared launch fixed: the argv (/tmp size) and the cgroup's caps."""
    return limits.tmp_mb, limits.execution_memory_bytes, limits.processes


def _discard(launch: PreparedLaunch) -> None:
    launch.discard()
    if launch.cgroup is not None:
        launch.cgroup.remove()


def _discard_all(prepared: dict[tuple[int, int], PreparedLaunch], lock: threading.Lock,
                 threads: set[int] | None = None) -> None:
    with lock:
        keys = [k for k in prepared if threads is None or k[1] in threads]
        launches = [prepared.pop(k) for k in keys]
    for launch in launches:
        _discard(launch)


def _drain(stream: Any, chunks: list[bytes], room: int) -> None:
    """Append up to ``room`` more bytes of what is already buffered in ``stream`` (non-blocking)."""
    try:
        os.set_blocking(stream.fileno(), False)  # a process that escaped the kill may still hold the pipe
    except (OSError, ValueError):
        return
    while room > 0:
        try:
            block = os.read(stream.fileno(), 65536)
        except (BlockingIOError, OSError, ValueError):
            return
        if not block:
            return
        chunks.append(block[:room])
        room -= len(block)


def _with_cgroup(res: ExecResult, cgroup: ExecutionCgroup, hit: str | None, peak: int | None) -> ExecResult:
    """``res`` with what its cgroup saw: a hit cap makes the whole execution a failure of that kind, even
    when the program caught the failed fork and exited by itself."""
    name = "/".join(cgroup.dirs[0].parts[-2:])
    if hit is None:
        return replace(res, peak_memory_bytes=peak, cgroup=name)
    if hit == "memory":
        why = (f"execution memory cap ({cgroup.memory_bytes / _MIB:.0f} MiB, all its processes and /tmp) reached, "
               f"out-of-memory kill, whole execution killed")
    else:
        why = (f"execution process cap ({cgroup.processes} processes and threads) reached, "
               f"whole execution killed")
    return replace(res, returncode=None, signal_name=None, limit=hit, limit_reason=why, peak_memory_bytes=peak,
                   cgroup=name)


# seccomp: the program may not trace or read/write another process (bubblewrap's PID 1 is its only other
# process; ptrace on it would hand the program a process outside its RLIMIT_NPROC) nor create memory that
# no address-space limit counts (memfd, System V shared memory: without a cgroup, detached segments and
# unmapped memfds would hold memory past RLIMIT_AS until the sandbox ends). POSIX shared memory needs
# /dev/shm, which is read-only. Numbers per architecture (the kernel's syscall tables).
_DENIED_SYSCALLS = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
               "memfd_create": 319, "shmget": 29},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
                "memfd_create": 279, "shmget": 194},
}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _seccomp_filter(machine: str | None = None) -> bytes | None:
    """A classic-BPF seccomp program (as bubblewrap's ``--seccomp`` reads it) that fails the denied calls with
    EPERM, every call of another ABI (x86's i386 and x32) with ENOSYS, and allows the rest. None on an
    architecture without a table here (then the filter is left out, with one log line)."""
    machine = machine or platform.machine()
    if machine not in _DENIED_SYSCALLS:
        log.warning("code sandbox: no seccomp table for %s; ptrace/memfd/shmget stay allowed", machine)
        return None
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    denied = sorted(_DENIED_SYSCALLS[machine].values())
    x32 = machine == "x86_64"  # x32 calls carry bit 30 of the number
    # Layout: ld arch; jeq arch; ld nr; [jge x32]; jeq nr_1 .. nr_D; ret allow; ret eperm; ret enosys.
    # Jump offsets count the instructions skipped.
    prog: list[tuple[int, int, int, int]] = [(ld_abs, 0, 0, 4)]  # seccomp_data.arch
    prog.append((jeq, 0, 1 + int(x32) + len(denied) + 2, _AUDIT_ARCH[machine]))  # another ABI -> enosys
    prog.append((ld_abs, 0, 0, 0))  # seccomp_data.nr
    if x32:
        prog.append((jge, len(denied) + 2, 0, 0x40000000))  # -> enosys
    for i, nr in enumerate(denied):
        prog.append((jeq, len(denied) - i, 0, nr))  # -> eperm
    prog += [(ret, 0, 0, allow), (ret, 0, 0, eperm), (ret, 0, 0, enosys)]
    return b"".join(struct.pack("=HBBI", code, jt, jf, k) for code, jt, jf, k in prog)


def bare_python(code: str, stdin: bytes | str = b"", limits: SandboxLimits | None = None,
                python: str | None = None) -> ExecResult:
    """The same program as a plain subprocess (same rlimits except the process count, no namespaces): the
    baseline of bench/sandbox.py's overhead ratio. Never use it for model-written code."""
    limits = limits or SandboxLimits()
    return execute([python or _default_python(), "-I", "-c", code], stdin, limits,
                   preexec=_rlimits_then(limits, None))


def _rlimits_then(limits: SandboxLimits, drop_to_uid: int | None) -> Callable[[], None]:
    """The sandbox's rlimits for a plain subprocess (the bare baseline; sandboxed executions set the same in
    their prepared launch)."""
    cpu, mem, fsize = int(limits.cpu_seconds), limits.memory_mb * _MIB, limits.file_size_mb * _MIB
    return lambda: limit_then_drop(cpu, mem, fsize, drop_to_uid)


def _stop_sandbox(proc: Any, info_fd: int) -> None:
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
            stop: Callable[[Any], None] | None = None,
            watch: Callable[[], str | None] | None = None,
            spawn: Callable[[], ChildProcess] | None = None) -> ExecResult:
    """Run ``argv`` in its own process group with capped output and a wall-clock deadline; the whole group
    is SIGKILLed at the deadline, when the output cap is passed, and in any case before returning.

    ``argv`` starts with an empty environment (``_CLEAN_ENV``), never the trainer's: bubblewrap's own PID 1
    inside the sandbox keeps the environment it was started with.
    ``started`` runs once the process exists; ``stop(proc)`` runs before the group kill when it is still
    running (bubblewrap's orderly teardown); ``watch()`` is polled every ``_WATCH_SECONDS`` while it runs and
    ends it when it answers (its cgroup's cap was hit: the caller reads which). ``spawn()``, when given,
    starts the process instead (a prepared launch; ``argv``, ``preexec`` and ``pass_fds`` are then unused)."""
    data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
    start = time.monotonic()
    deadline = start + limits.wall_seconds
    if spawn is not None:
        proc: Any = spawn()
    else:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=preexec, pass_fds=pass_fds, close_fds=True,
                                env=dict(_CLEAN_ENV), cwd="/")
    if started is not None:
        started()
    caps = {proc.stdout: limits.stdout_bytes, proc.stderr: limits.stderr_bytes}
    chunks: dict[Any, list[bytes]] = {proc.stdout: [], proc.stderr: []}
    sizes = dict.fromkeys(chunks, 0)
    timed_out = output_limited = capped = False
    tick = _WATCH_SECONDS if watch is not None else 1.0
    next_watch = 0.0
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
                if watch is not None and time.monotonic() >= next_watch:
                    next_watch = time.monotonic() + tick
                    if watch() is not None:
                        capped = True
                        break
                for key, _ in sel.select(timeout=min(left, tick)):
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
        while not (timed_out or output_limited or capped):  # pipes closed: wait for the exit
            try:
                proc.wait(timeout=max(0.0, min(tick, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:  # closed its pipes but kept running
                if time.monotonic() >= deadline:
                    timed_out = True
                elif watch is not None and watch() is not None:
                    capped = True
    finally:
        if stop is not None and proc.poll() is None:
            stop(proc)
        _kill_group(proc)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            # What the program wrote before it was stopped is still in the pipe: a watcher that sees a cap
            # before the loop read the last lines must not erase them (non-blocking: nobody writes now)
            _drain(stream, chunks[stream], caps[stream] - sizes[stream])
            stream.close()
        writer.join(timeout=5)
    wall = time.monotonic() - start
    code = proc.returncode
    killed_by_us = timed_out or output_limited or capped
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


def _kill_group(proc: Any) -> None:
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
    slot (its host uid when the trainer is root). At most ``workers`` executions run at once, each in its own
    cgroup: together they never hold more than ``workers`` x the execution memory cap. Without cgroups the
    slots register with the host memory budget, which shrinks each execution's rlimits to its share. Use as
    a context manager or call ``close``.
    """

    def __init__(self, sandbox: BubblewrapSandbox, workers: int = 2, max_pending: int | None = None):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.sandbox = sandbox
        self.workers = workers
        self._budget = sandbox.containment if isinstance(sandbox.containment, HostMemoryBudget) else None
        if self._budget is not None:  # without cgroups the host memory budget is shared by every slot
            self._budget.register(workers)
        self.max_pending = max_pending or 2 * workers
        self._room = threading.BoundedSemaphore(self.max_pending)
        self._local = threading.local()
        self._threads: set[int] = set()
        slots = itertools.count()

        def start_worker() -> None:
            self._local.slot = next(slots)
            self._threads.add(threading.get_ident())

        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="sandbox", initializer=start_worker)

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
        self.sandbox.discard_prepared(self._threads)  # its workers' launches would never be used
        if self._budget is not None:
            self._budget.unregister(self.workers)
            self._budget = None

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
