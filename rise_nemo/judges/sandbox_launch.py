"""bubblewrap forked ahead of its execution, already in its cgroup (rise_nemo.judges.sandbox uses it).

Moving a process into a cgroup makes the kernel wait for an RCU grace period (the cgroup core's
threadgroup semaphore; measured here: 8 ms on an idle machine, 20-50 ms under load, against 0.1 ms when
moves follow each other within a grace period). Paid between fork and exec of every execution, that wait
was most of the cgroup's cost (bench/sandbox.py's overhead: +12-18 ms per execution at 2 workers). So the
sandbox forks the process of its next execution ahead of time (``PreparedLaunch``): the child joins its
fresh cgroup and waits, before exec, for the program and its rlimits; ``release`` hands them over and the
child drops to its uid and execs bubblewrap. The join's wait overlaps the previous execution.

The child is forked, not started with subprocess: it must close every descriptor it inherited before it
waits (a copy of another execution's stdin would keep that program from ever seeing end of file), and
subprocess closes them only after ``preexec_fn`` returns. Until exec it runs only os/resource calls.
"""

from __future__ import annotations

import os
import resource
import select
import subprocess
import time
from typing import Any

__all__ = ["ChildProcess", "PreparedLaunch", "limit_then_drop"]

_READY_SECONDS = 120.0  # how long a release waits for a child still joining its cgroup (a grace period)


class ChildProcess:
    """The part of ``subprocess.Popen`` that ``sandbox.execute`` uses, for a process forked here."""

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int, stderr_fd: int):
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = open(stdin_fd, "wb")
        self.stdout = open(stdout_fd, "rb", buffering=0)
        self.stderr = open(stderr_fd, "rb", buffering=0)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: cannot happen for our own child, but never hang
                self.returncode = -9
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode  # type: ignore[return-value]


class PreparedLaunch:
    """One forked child waiting to exec ``bwrap_args + [--info-fd, --file, --seccomp] + ["--"] + command``.

    ``cgroup``: joined by the child right after the fork (None: none); ``drop_to_uid``: the host uid it
    becomes before exec (None: stays); ``key``: what must match for an execution to use it (the sandbox's
    limits that shape the argv and the cgroup)."""

    def __init__(self, bwrap_args: list[str], command: list[str], seccomp: bytes | None, cgroup: Any,
                 drop_to_uid: int | None, env: dict[str, str], key: tuple):
        self.cgroup = cgroup
        self.key = key
        self.program_fd = _memfd("rise-nemo-program", b"")
        self.seccomp_fd = _memfd("rise-nemo-seccomp", seccomp) if seccomp is not None else None
        self.info_read, info_write = os.pipe2(os.O_CLOEXEC)
        release_read, self.release_write = os.pipe2(os.O_CLOEXEC)
        self.ready_read, ready_write = os.pipe2(os.O_CLOEXEC)
        stdin_read, stdin_write = os.pipe2(os.O_CLOEXEC)
        stdout_read, stdout_write = os.pipe2(os.O_CLOEXEC)
        stderr_read, stderr_write = os.pipe2(os.O_CLOEXEC)
        argv = bwrap_args + ["--info-fd", str(info_write), "--file", str(self.program_fd), "/tmp/main.py"]
        if self.seccomp_fd is not None:
            argv += ["--seccomp", str(self.seccomp_fd)]
        argv += ["--", *command]
        keep = [fd for fd in (self.program_fd, self.seccomp_fd, info_write) if fd is not None]
        max_fd = os.sysconf("SC_OPEN_MAX")
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(argv, env, cgroup, drop_to_uid, (stdin_read, stdout_write, stderr_write), ready_write,
                   release_read, keep, max_fd)
        for fd in (info_write, release_read, ready_write, stdin_read, stdout_write, stderr_write):
            os.close(fd)
        self.process = ChildProcess(pid, stdin_write, stdout_read, stderr_read)
        self._released = self._closed = False

    def release(self, program: bytes, cpu_seconds: int, memory_bytes: int, file_bytes: int) -> None:
        """Hand over the program and the rlimits; the child execs bubblewrap. OSError when the child did not
        come through its cgroup join (then it has exited)."""
        os.pwrite(self.program_fd, program, 0)
        readable, _, _ = select.select([self.ready_read], [], [], _READY_SECONDS)
        if not readable or os.read(self.ready_read, 1) != b"r":
            self.discard()
            raise OSError(f"a sandbox process could not join its cgroup {self.cgroup.dirs[0]}")
        os.write(self.release_write, f"{cpu_seconds} {memory_bytes} {file_bytes}\n".encode())
        os.close(self.release_write)
        self._released = True

    def close_fds(self) -> None:
        """The parent's descriptors (the process's pipes stay with ``process``); once."""
        if self._closed:
            return
        self._closed = True
        for fd in (self.program_fd, self.seccomp_fd, self.info_read, self.ready_read):
            if fd is not None:
                os.close(fd)
        if not self._released:
            os.close(self.release_write)
            self._released = True

    def discard(self) -> None:
        """Never used: the child sees end of file instead of a release and exits; reap it, close everything
        (its cgroup is the caller's)."""
        self.close_fds()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, 9)
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            try:
                stream.close()
            except OSError:
                pass


def limit_then_drop(cpu_seconds: int, memory_bytes: int, file_bytes: int, drop_to_uid: int | None) -> None:
    """The sandbox's per-process rlimits, then the unprivileged host uid (when the trainer is root). Runs in a
    child between fork and exec."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if drop_to_uid is not None:
        os.setgroups([])
        os.setgid(drop_to_uid)
        os.setuid(drop_to_uid)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _child(argv: list[str], env: dict[str, str], cgroup: Any, drop_to_uid: int | None,
           stdio: tuple[int, int, int], ready_write: int, release_read: int, keep: list[int], max_fd: int) -> None:
    try:
        os.setsid()  # its own process group: the whole group is killed at the end
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        join_fds = list(cgroup.fds) if cgroup is not None else []
        lo = 3
        for fd in sorted({*keep, *join_fds, ready_write, release_read}):  # first of all: drop every other
            os.closerange(lo, fd)  # descriptor of the trainer's (other executions' pipes among them)
            lo = fd + 1
        os.closerange(lo, max_fd)
        for fd in keep:
            os.set_inheritable(fd, True)  # bubblewrap reads these
        if cgroup is not None:
            cgroup.join()  # the grace-period wait happens here, ahead of the execution
        for fd in join_fds:
            os.close(fd)
        os.write(ready_write, b"r")
        os.close(ready_write)
        data = b""
        while chunk := os.read(release_read, 256):
            data += chunk
        if not data:  # discarded
            os._exit(0)
        os.close(release_read)
        cpu, memory, size = (int(x) for x in data.split())
        limit_then_drop(cpu, memory, size, drop_to_uid)
        os.chdir("/")
        os.execve(argv[0], argv, env)
    except BaseException:
        pass
    os._exit(127)
