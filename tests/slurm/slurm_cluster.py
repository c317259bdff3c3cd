"""A real single-node Slurm for the launcher tests (Debian's slurm-wlm, no mocks).

The session fixture writes munge and Slurm configuration into a temporary directory, starts munged,
slurmctld and slurmd as daemons (no systemd), and stops each of them by PID at the end. Configuration
facts measured on the CI machines: proctrack/linuxproc and task/none (no cgroups in the
container), EnforcePartLimits=ALL (impossible jobs are refused instead of pending forever),
AuthInfo cred_expire=10 (a requeued job starts again after ~10 s instead of 120 s), scheduler passes
every 2 s (a requeued job waits for the next pass once eligible; the default is up to 60 s), a small MinJobAge,
and our own polling of `scontrol show job` (``sbatch --wait`` backs off and can miss a purged job).

Without Slurm installed the tests skip with the reason, unless RISE_REQUIRE_SLURM=1 (set by .ci/run),
where a missing Slurm is a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED"}


def unavailable_reason() -> str | None:
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm not installed (missing {', '.join(missing)}): apt-get install slurmctld slurmd slurm-client munge"
    if os.geteuid() != 0:
        return "the single-node Slurm test cluster runs slurmd as root; run the Slurm tests as root (CI does)"
    return None


def require_tool(name: str) -> str:
    """Path of a tool the tests need: skip without it, fail in CI (RISE_REQUIRE_SLURM=1)."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not installed (apt-get install {name})"
        if os.environ.get("RISE_REQUIRE_SLURM") == "1":
            pytest.fail(msg + " and RISE_REQUIRE_SLURM=1")
        pytest.skip(msg)
    return path


def run_as_laptop_and_as_ci(test_id: str, path: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """Runs one test in a fresh pytest with PATH=``path`` (what that machine has installed), once as on a
    laptop and once as in CI (RISE_REQUIRE_SLURM=1): a fixture must skip the first and fail the second."""
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RISE_"))}
    env["PATH"] = str(path)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test_id]
    laptop = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    ci = subprocess.run(cmd, env={**env, "RISE_REQUIRE_SLURM": "1"}, capture_output=True, text=True,
                        cwd=REPO_ROOT, timeout=120)
    return laptop, ci


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_below_ephemeral() -> int:
    """A free TCP port under 32768 (servers use ports outside the ephemeral range)."""
    for port in range(21000 + os.getpid() % 5000, 32000, 7):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below 32000")


def _wait_for(predicate, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.1
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
    tail = ""
    if log is not None and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}{tail}")


@dataclass
class Job:
    job_id: str
    state: str
    exit_code: int
    signal: int
    restarts: int
    fields: dict[str, str]


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    cpus: int
    env: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 60):
        res = subprocess.run(list(args), env={**self.env, **(env or {})}, capture_output=True, text=True,
                             timeout=timeout, cwd=REPO_ROOT)
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {res.returncode}: {res.stderr.strip()}")
        return res

    def sbatch(self, script: str | Path, *args: str, sbatch_args: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> str:
        out = self.run("sbatch", "--parsable", *sbatch_args, str(script), *args, env=env)
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> Job | None:
        """The job's record, or None once slurmctld has purged it."""
        res = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if res.returncode != 0:
            return None
        fields = dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", res.stdout))
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        return Job(job_id, fields.get("JobState", "?"), int(code), int(sig or 0),
                   int(fields.get("Restarts", "0")), fields)

    def wait(self, job_id: str, timeout: float = 240, states=TERMINAL_STATES, min_restarts: int = 0) -> Job:
        """Polls `scontrol show job` with backoff until the job reaches one of ``states``."""
        deadline = time.monotonic() + timeout
        delay, last = 0.25, None
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job is None:
                raise AssertionError(f"job {job_id} vanished (purged) before reaching {states}; last {last}")
            last = job
            if job.state in states and job.restarts >= min_restarts:
                return job
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
        self.run("scancel", job_id, check=False)
        raise AssertionError(f"job {job_id} not in {states} after {timeout}s; last {last}")

    def stop(self) -> None:
        self.run("scancel", "--full", "--user=root", check=False, timeout=20)
        # Started munged, slurmctld, slurmd(s): stop them the other way round.
        for name in reversed(list(self.pids)):
            terminate(self.pids[name])


def terminate(pid: int, grace: float = 10) -> bool:
    """SIGTERM, then SIGKILL after ``grace`` s; True if the process was still there to be stopped."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A daemon we started but did not reap shows up as a zombie until init collects it.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _read_pid(path: Path) -> int:
    _wait_for(lambda: path.exists() and path.read_text().strip().isdigit(), 20, f"pid file {path}")
    return int(path.read_text().strip())


def slurm_conf(root: Path, ctld_host: str, ctld_addr: str, nodes: dict[str, str], cpus: int, mem_mb: int,
               ctld_port: int, slurmd_port: int) -> str:
    """slurm.conf for a controller at ``ctld_addr`` and ``nodes`` (name -> address), all under ``root``.

    Per-node paths use %n, so several slurmd (one per network namespace) can share one machine."""
    node_lines = "".join(f"NodeName={name} NodeAddr={addr} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN\n"
                         for name, addr in nodes.items())
    return f"""\
ClusterName=risetest
SlurmctldHost={ctld_host}({ctld_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket,cred_expire=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
EnforcePartLimits=ALL
MinJobAge=60
KillWait=30
JobRequeue=1
MpiDefault=none
SwitchType=switch/none
{node_lines}PartitionName=debug Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP
"""


def prepare_root(root: Path) -> None:
    """Directories and a fresh munge key for one test cluster under ``root``."""
    for sub in ("munge", "state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # munged refuses a socket directory others can write to and a key others can read.
    os.chmod(root / "munge", 0o711)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)


def start_munged(root: Path) -> int:
    """munged on a socket under ``root`` (a path socket: reachable from every network namespace)."""
    subprocess.run(["munged", "--force", f"--key-file={root}/munge/munge.key", f"--socket={root}/munge/munge.socket",
                    f"--pid-file={root}/munge/munged.pid", f"--seed-file={root}/munge/seed",
                    f"--log-file={root}/log/munged.log"], check=True, capture_output=True, text=True)
    return _read_pid(root / "munge" / "munged.pid")


def slurm_env(conf: Path) -> dict[str, str]:
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for var in [v for v in env if v.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and v != "SLURM_CONF"]:
        del env[var]  # an outer Slurm job's variables would leak into our submissions
    return env


def wait_nodes_idle(cluster: SlurmCluster, nodes: int, timeout: float = 30) -> None:
    def idle() -> bool:
        res = cluster.run("sinfo", "-h", "-N", "-o", "%t", check=False)
        return res.returncode == 0 and res.stdout.split() == ["idle"] * nodes

    _wait_for(idle, timeout, f"{nodes} Slurm node(s) to become idle", cluster.root / "log" / "slurmctld.log")


def start_cluster(root: Path) -> SlurmCluster:
    prepare_root(root)
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, node, "127.0.0.1", {node: "127.0.0.1"}, cpus, 4000, _free_port(), _free_port()))
    env = slurm_env(conf)
    cluster = SlurmCluster(root, conf, node, cpus, env)
    try:
        cluster.pids["munged"] = start_munged(root)
        subprocess.run(["slurmctld", "-i", "-f", str(conf)], env=env, check=True, capture_output=True, text=True)
        cluster.pids["slurmctld"] = _read_pid(root / "slurmctld.pid")
        subprocess.run(["slurmd", "-f", str(conf), "-N", node], env=env, check=True, capture_output=True, text=True)
        cluster.pids["slurmd"] = _read_pid(root / f"slurmd-{node}.pid")
        wait_nodes_idle(cluster, 1)
    except Exception:
        cluster.stop()
        raise
    return cluster


