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
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ATTACKS", "Attack", "AttackReport", "HostBait", "run_attack", "leftover_processes"]

KEY_VAR = "RISE_NEMO_JUDGE_API_KEY"  # the bait "judge API key" variable name


@dataclass(frozen=True)
class Attack:
    name: str
    code: str  # str.format template: {proof} {home} {run_dir} {port} {trainer_pid} {key_var} {token}


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
                        Path(f"/etc/pwned-{self.token}"), Path(f"/dev/shm/pwned-{self.token}")):
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


def run_attack(verifier: Any, attack: Attack, bait: HostBait) -> AttackReport:
    """Grade one attack with ``verifier`` (a CodeVerifier) against ``bait``; contained or not, and why."""
    from rise_nemo.judges.code_verifier import CodeTests

    code = attack.code.format(**bait.fields())
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
                        trainer_ok)
