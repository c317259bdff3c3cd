"""One cgroup per sandboxed execution: memory and process caps over the execution as a whole.

The per-process rlimits of rise_nemo.judges.sandbox cap each process (RLIMIT_AS) and the sandbox user's
process count (RLIMIT_NPROC), so an execution that forks N processes may hold N x ``memory_mb``. A cgroup
caps what the execution holds in total: every process and thread of it, bubblewrap's own, and the pages of
its private /tmp. This is how nsjail and SandboxFusion contain a run; rise_nemo writes the cgroup files
itself (no daemon, no library).

Per execution: ``memory.max`` (v1: ``memory.limit_in_bytes``) = the execution's memory cap, swap 0
(``memory.swap.max`` 0; v1: ``memory.memsw.limit_in_bytes`` = the cap), ``pids.max`` = its process cap,
and on v2 ``memory.oom.group`` 1 (an out-of-memory kill takes the whole execution). The child joins its
cgroup between fork and exec of bubblewrap (``ExecutionCgroup.join``), so nothing of the execution ever
runs outside it, and the cgroup namespace that bubblewrap creates is rooted there.

Where the cgroups go (``discover``): cgroup v2 when its memory and pids controllers are usable, else the
cgroup v1 memory and pids hierarchies (hybrid hosts such as this project's CI machine). The base is, in
order: ``$RISE_NEMO_SANDBOX_CGROUP`` (a delegated subtree; must hold no processes), this process's own
cgroup when it may have children with those controllers (v1 always; v2 at the hierarchy's root), or a
sibling of it (v2: the subtree that holds this process, e.g. a Slurm step or systemd's delegated
``user@.service``). Executions are never created above this process's cgroup: their memory stays charged
to the job that started them. Layout::

    <base>/rise-nemo-sandbox-<trainer pid>/exec-<n>

One directory per trainer process, so that a crashed trainer's leftovers are recognised (their pid is dead,
or is ours in a fresh process: a reused pid) and removed when the next trainer starts. Each execution's
cgroup is removed when it ends, killed or not, after every process in it has gone; one that cannot be
removed in time is retried later and at exit.

Without a usable cgroup (not root and no delegated subtree, no controllers, a read-only cgroupfs)
``discover`` returns the reason, and the sandbox falls back to the per-process rlimits with a bound on
processes x memory (rise_nemo.judges.sandbox: ``HostMemoryBudget``).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CGROUP_ENV", "CgroupLayout", "ExecutionCgroup", "ExecutionCgroups", "discover"]

log = logging.getLogger(__name__)

CGROUP_ENV = "RISE_NEMO_SANDBOX_CGROUP"  # a delegated cgroup v2 directory for the executions, or "off"
PREFIX = "rise-nemo-sandbox-"
_REMOVE_SECONDS = 10.0  # how long one removal waits for the kernel to release the last processes


@dataclass(frozen=True)
class CgroupLayout:
    """Where this process is in the cgroup hierarchies, read from /proc (paths are parameters for tests)."""

    v2_dir: Path | None  # this process's cgroup v2 directory (None: no cgroup2 mount)
    v1_dirs: dict[str, Path]  # controller -> this process's directory in that v1 hierarchy

    @classmethod
    def read(cls, mountinfo: str = "/proc/self/mountinfo", cgroup: str = "/proc/self/cgroup") -> CgroupLayout:
        own: dict[str, str] = {}  # controller ("" for v2) -> path
        for line in Path(cgroup).read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                for ctrl in parts[1].split(",") if parts[1] else [""]:
                    own[ctrl] = parts[2]
        v2_dir = None
        v1_dirs: dict[str, Path] = {}
        for line in Path(mountinfo).read_text().splitlines():
            fields = line.split()
            if " - " not in line:
                continue
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3].split(",")
            root, mount_point = fields[3], _unescape(fields[4])
            if fstype == "cgroup2" and "" in own and v2_dir is None:
                v2_dir = _join(mount_point, root, own[""])
            elif fstype == "cgroup":
                for ctrl in ("memory", "pids"):
                    if ctrl in options and ctrl in own and ctrl not in v1_dirs:
                        v1_dirs[ctrl] = _join(mount_point, root, own[ctrl])
        return cls(v2_dir, v1_dirs)


def _unescape(path: str) -> str:  # mountinfo escapes space, tab, newline and backslash as octal
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _join(mount_point: str, mount_root: str, own: str) -> Path:
    """The directory of cgroup ``own`` under a mount of the hierarchy whose root is ``mount_root``."""
    rel = own
    if mount_root != "/" and (own == mount_root or own.startswith(mount_root.rstrip("/") + "/")):
        rel = own[len(mount_root):]
    return Path(mount_point) / rel.lstrip("/")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counter(text: str, key: str) -> int:
    """The value of ``key`` in a flat-keyed cgroup file ("oom_kill 3\\nmax 0")."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ExecutionCgroup:
    """The cgroup (v2: one directory; v1: one per hierarchy, memory and pids) of one execution."""

    def __init__(self, owner: ExecutionCgroups, name: str, memory_bytes: int, processes: int):
        self.owner = owner
        self.name = name
        self.memory_bytes = memory_bytes
        self.processes = processes
        self.dirs = [parent / name for parent in owner.parents]
        self._fds: list[int] = []
        made: list[Path] = []
        try:
            for d in self.dirs:
                d.mkdir()
                made.append(d)
        except BaseException:
            owner.remove_dirs(made, _REMOVE_SECONDS)
            raise
        try:
            owner.configure(self)
            self._fds = [os.open(d / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for d in self.dirs]
        except BaseException:
            self.remove()
            raise

    @property
    def fds(self) -> tuple[int, ...]:
        """The open ``cgroup.procs`` files that ``join`` writes to (a forked child keeps them until then)."""
        return tuple(self._fds)

    def join(self) -> None:
        """Move the calling process into this cgroup. Runs in the child between fork and exec: no allocation."""
        for fd in self._fds:
            os.write(fd, b"0")

    def limit_hit(self) -> str | None:
        """"memory" when the kernel killed a process of it for memory, "processes" when a fork or a thread
        failed on its process cap, else None."""
        if self.owner.oom_kills(self) > 0:
            return "memory"
        if self.owner.pids_refusals(self) > 0:
            return "processes"
        return None

    def peak_bytes(self) -> int | None:
        """The most memory it held at once (None where the kernel does not say)."""
        return self.owner.peak(self)

    def pids(self) -> list[int]:
        found: set[int] = set()
        for d in self.dirs:
            found.update(int(p) for p in _read(d / "cgroup.procs").split())
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL every process in it (v2: ``cgroup.kill``, atomic against forks)."""
        self.owner.kill(self)

    def remove(self, timeout: float = _REMOVE_SECONDS) -> bool:
        """Kill what is left, wait until the kernel has released every process, remove the directories.
        False (and retried later) when a directory is still busy after ``timeout`` seconds."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        return self.owner.remove_dirs([d for d in self.dirs if d.exists()], timeout)


class ExecutionCgroups:
    """Creates the per-execution cgroups of this trainer process under ``parents`` (one per hierarchy)."""

    def __init__(self, version: int, bases: list[Path], where: str):
        self.version = version
        self.bases = bases
        self.where = where  # one phrase for the log line: which base and why
        self.pid = os.getpid()
        self.parents = [base / f"{PREFIX}{self.pid}" for base in bases]
        self._names = itertools.count()
        self._stale: list[Path] = []
        self._lock = threading.Lock()
        self.removed_leftovers = self._remove_leftovers()
        for parent in self.parents:
            parent.mkdir(exist_ok=True)  # exists only when a leftover of a reused pid is still busy
            if version == 2:  # the executions below get both controllers (this directory holds no process)
                _write(parent / "cgroup.subtree_control", "+memory +pids")

    # ---- creation ---------------------------------------------------------------------------------------
    def create(self, memory_bytes: int, processes: int) -> ExecutionCgroup:
        """A fresh cgroup for one execution, distinct from every other of this process (a counter)."""
        self._retry_stale()
        while True:
            try:
                return ExecutionCgroup(self, f"exec-{next(self._names)}", memory_bytes, processes)
            except FileExistsError:  # a leftover still being released: take the next name
                continue

    def configure(self, cg: ExecutionCgroup) -> None:
        if self.version == 2:
            [d] = cg.dirs
            _write(d / "memory.max", str(cg.memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            if (d / "memory.oom.group").exists():
                _write(d / "memory.oom.group", "1")
            _write(d / "pids.max", str(cg.processes))
        else:
            mem, pids = cg.dirs
            _write(mem / "memory.limit_in_bytes", str(cg.memory_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():  # memory + swap = memory: no swap
                _write(mem / "memory.memsw.limit_in_bytes", str(cg.memory_bytes))
            _write(pids / "pids.max", str(cg.processes))

    # ---- reading -----------------------------------------------------------------------------------------
    def oom_kills(self, cg: ExecutionCgroup) -> int:
        if self.version == 2:
            return _counter(_read(cg.dirs[0] / "memory.events"), "oom_kill")
        return _counter(_read(cg.dirs[0] / "memory.oom_control"), "oom_kill")

    def pids_refusals(self, cg: ExecutionCgroup) -> int:
        return _counter(_read(cg.dirs[-1] / "pids.events"), "max")

    def peak(self, cg: ExecutionCgroup) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        text = _read(cg.dirs[0] / name).strip()
        return int(text) if text.isdigit() else None

    # ---- teardown ------------------------------------------------------------------------------------------
    def kill(self, cg: ExecutionCgroup) -> None:
        self._kill_dirs(cg.dirs)

    def _kill_dirs(self, dirs: Iterable[Path]) -> None:
        for d in dirs:
            if self.version == 2 and (d / "cgroup.kill").exists():
                try:
                    _write(d / "cgroup.kill", "1")
                    continue
                except OSError:
                    pass
            for pid in _read(d / "cgroup.procs").split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError, ValueError):
                    pass

    def remove_dirs(self, dirs: list[Path], timeout: float) -> bool:
        """Kill and remove cgroup directories (children before parents), waiting up to ``timeout`` seconds for
        processes that are still exiting; the ones left busy are kept for a later retry."""
        deadline = time.monotonic() + timeout
        pending = sorted(dirs, key=lambda p: len(p.parts), reverse=True)
        delay = 0.0005
        while pending:
            still = []
            for d in pending:
                self._kill_dirs([d])
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    still.append(d)
            pending = still
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        if pending:
            with self._lock:
                self._stale.extend(pending)
            log.warning("code sandbox: cgroup %s still busy after %.0fs; will retry its removal", pending[0], timeout)
            return False
        return True

    def _retry_stale(self) -> None:
        with self._lock:
            stale, self._stale = self._stale, []
        if stale:
            self.remove_dirs([d for d in stale if d.exists()], timeout=0.0)

    def _remove_leftovers(self) -> list[Path]:
        """Remove what a crashed trainer left: ``rise-nemo-sandbox-<pid>`` directories whose pid is dead, or is
        this process's own (created before it existed: a reused pid)."""
        found = []
        for base in self.bases:
            for entry in base.glob(PREFIX + "*"):
                tail = entry.name[len(PREFIX):]
                if not entry.is_dir() or not tail.isdigit():
                    continue
                if int(tail) != self.pid and _alive(int(tail)):
                    continue
                found.append(entry)
                tree = [p for p in entry.rglob("*") if p.is_dir()] + [entry]
                self.remove_dirs(tree, _REMOVE_SECONDS)  # still busy: retried later; never blocks this run
        if found:
            log.info("code sandbox: removed %d leftover cgroup(s) of crashed runs: %s", len(found),
                     ", ".join(str(p) for p in found))
        return found

    def close(self) -> None:
        """Remove this process's directories at exit, with whatever is still in them (executions remove their
        own as they end; a launch prepared for an execution that never came holds one)."""
        self._retry_stale()
        tree = [d for parent in self.parents if parent.exists() for d in parent.glob("exec-*")]
        self.remove_dirs(tree + [p for p in self.parents if p.exists()], timeout=1.0)

    # ---- the aggregate over all executions of this process (bench and tests) ------------------------------
    def memory_bytes(self) -> int:
        """Memory charged now to this process's executions together, including what the kernel has yet to
        free of executions that already ended (their cgroups are gone, their last kernel objects not yet)."""
        return self._usage(self.parents[0])

    def live_memory_bytes(self) -> int:
        """Memory held now by the executions whose cgroups exist (the running ones), summed."""
        return sum(self._usage(d) for d in self.parents[0].glob("exec-*"))

    def _usage(self, d: Path) -> int:
        text = _read(d / ("memory.current" if self.version == 2 else "memory.usage_in_bytes")).strip()
        return int(text) if text.isdigit() else 0

    def reset_peak(self) -> Callable[[], int | None] | None:
        """Restart the kernel's count of the most all executions of this process held at once; the returned
        function reads it (once). None where the kernel cannot reset it (v2 before Linux 6.12)."""
        parent = self.parents[0]
        if self.version == 1:
            try:
                _write(parent / "memory.max_usage_in_bytes", "0")
            except OSError:
                return None

            def read_v1() -> int | None:
                text = _read(parent / "memory.max_usage_in_bytes").strip()
                return int(text) if text.isdigit() else None

            return read_v1
        try:  # v2: a write resets the peak seen through this open file only
            f = open(parent / "memory.peak", "r+")
        except OSError:
            return None
        try:
            f.write("reset\n")
            f.flush()
        except OSError:
            f.close()
            return None

        def read_v2() -> int | None:
            with f:
                f.seek(0)
                text = f.read().strip()
            return int(text) if text.isdigit() else None

        return read_v2


def discover(layout: CgroupLayout | None = None, env: str | None = None) -> ExecutionCgroups | str:
    """The per-execution cgroups usable here, or the one-line reason why none are."""
    env = os.environ.get(CGROUP_ENV, "") if env is None else env
    if env.strip().lower() in ("off", "0", "false", "no"):
        return f"disabled by {CGROUP_ENV}={env}"
    try:
        layout = layout or CgroupLayout.read()
    except OSError as exc:
        return f"cannot read this process's cgroups: {exc}"
    reasons: list[str] = []
    candidates: list[tuple[int, list[Path], str]] = []
    if env.strip():
        candidates.append((2, [Path(env.strip())], f"{CGROUP_ENV}={env.strip()}"))
    elif layout.v2_dir is not None:
        if {"memory", "pids"} <= set(_read(layout.v2_dir / "cgroup.controllers").split()):
            candidates.append((2, [layout.v2_dir], "this process's cgroup (v2)"))
            candidates.append((2, [layout.v2_dir.parent], "a sibling of this process's cgroup (v2)"))
        else:
            reasons.append(f"cgroup v2 at {layout.v2_dir} offers no memory and pids controllers")
    if not env.strip():
        if {"memory", "pids"} <= set(layout.v1_dirs):
            candidates.append((1, [layout.v1_dirs["memory"], layout.v1_dirs["pids"]],
                               "this process's cgroups (v1 memory and pids)"))
        elif layout.v2_dir is None or reasons:
            reasons.append("no cgroup v1 memory and pids hierarchies")
    for version, bases, where in candidates:
        problem = _unusable(version, bases)
        if problem is None:
            try:
                cgroups = ExecutionCgroups(version, bases, where)
                _probe(cgroups)
                return cgroups
            except OSError as exc:
                problem = _short(exc)
                for parent in [b / f"{PREFIX}{os.getpid()}" for b in bases]:
                    try:
                        parent.rmdir()
                    except OSError:
                        pass
        reasons.append(f"{where}: {problem}")
    return "; ".join(reasons) or "no cgroup hierarchy found"


def _short(exc: OSError) -> str:
    return f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc)


def _unusable(version: int, bases: list[Path]) -> str | None:
    """Why executions cannot go under ``bases`` (None when they may)."""
    for base in bases:
        if not base.is_dir():
            return f"{base} is not a directory"
        if not os.access(base, os.W_OK):
            return f"{base} is not writable by uid {os.geteuid()}"
    if version == 2:
        [base] = bases
        enabled = set(_read(base / "cgroup.subtree_control").split())
        if not {"memory", "pids"} <= enabled:
            try:  # refused (EBUSY) when the base holds processes and is not the hierarchy's root
                _write(base / "cgroup.subtree_control", "+memory +pids")
            except OSError as exc:
                return f"cannot enable memory and pids for its children: {_short(exc)}"
    return None


def _probe(cgroups: ExecutionCgroups) -> None:
    """Run one short process inside a fresh execution cgroup: the whole path (create, limit, join from the
    child, remove) works here, or OSError says where it does not."""
    cg = cgroups.create(64 << 20, 8)
    try:
        true = shutil.which("true") or "/bin/true"
        subprocess.run([true], preexec_fn=cg.join, check=True, timeout=30, env={}, cwd="/")
    except subprocess.SubprocessError as exc:
        raise OSError(f"a process cannot join {cg.dirs[0]}: {exc}") from None
    finally:
        if not cg.remove():
            raise OSError(f"cannot remove {cg.dirs[0]}")
