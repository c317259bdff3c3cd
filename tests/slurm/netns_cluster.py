"""A real 3-node Slurm in Linux network namespaces on one machine, for the multi-node launcher tests.

Every node is a network namespace with its own address, so an address or binding mistake in
slurm/launch.sh (a server bound to 127.0.0.1, a worker joining the wrong head, a health check against
the wrong host) fails here as it would on a real cluster. What `start_netns_cluster` builds, and
`NetnsCluster.stop` removes again (checking afterwards that nothing is left):

- an L2 bridge ``rs<NN>br`` in the root namespace with NO address, plus an ``unreachable`` route for the
  subnet there: nothing in the root namespace can send to the cluster's addresses (without the route such
  packets would follow the default route off the machine); all test traffic stays inside the namespaces;
- namespaces ``rs<NN>-n0`` (slurmctld) and ``rs<NN>-n1`` .. ``-n3`` (slurmd of nodes rise-n1 .. rise-n3),
  each with loopback and one veth on the bridge (``eth0`` inside) holding an address from the private
  10.213.<NN>.0/24 (.10 .. .13); no default route, so nothing leaves the bridge;
- munged in the root namespace (its socket is a path, reachable from every namespace); slurmctld and one
  ``slurmd -N <node>`` per namespace, entered with ``nsenter --net=/var/run/netns/<ns>`` (``ip netns
  exec`` remounts /sys, and slurmd then fails on cgroups); per-node spool, pid and log files (``%n``).
  ``SlurmctldHost=<hostname>(<n0 address>)``. Slurm clients (sbatch, scontrol, ...) run inside n0 too.

The subnet is the first of SUBNETS that no address, route, link or namespace on the machine uses, held
with a lock file while the cluster lives (two test sessions at once get different subnets). Processes are
found by the network namespace they live in (/proc/<pid>/ns/net) and stopped by PID, never by name.
Needs root, iproute2 (ip) and util-linux (nsenter); without them, or when the kernel refuses the
namespaces, the fixture skips with the reason (fails under RISE_REQUIRE_SLURM=1, as in CI).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from slurm_cluster import (
    SlurmCluster,
    _alive,
    _read_pid,
    _wait_for,
    prepare_root,
    slurm_conf,
    slurm_env,
    start_munged,
    terminate,
    wait_nodes_idle,
)
from slurm_cluster import (
    unavailable_reason as slurm_unavailable_reason,
)

SUBNETS = ("10.213.77", "10.213.78", "10.213.79", "10.213.80")
NODE_NAMES = ("rise-n1", "rise-n2", "rise-n3")
NETNS_DIR = Path("/var/run/netns")
CTLD_PORT, SLURMD_PORT = 6817, 6818  # each daemon has its namespace's ports to itself


class NamespacesUnavailable(RuntimeError):
    """This machine cannot build the namespaced cluster (a reason to skip, not a test failure)."""


def unavailable_reason() -> str | None:
    reason = slurm_unavailable_reason()
    if reason is not None:
        return reason
    missing = [tool for tool in ("ip", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"network namespace tools missing ({', '.join(missing)}): apt-get install iproute2 util-linux"
    return None


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """`ip ARGS`, in the root namespace or entered into ``ns`` with nsenter."""
    cmd = ["ip", *args] if ns is None else ["nsenter", f"--net={NETNS_DIR / ns}", "ip", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr.strip()}")
    return res


def subnet_users(prefix: str, tag: str) -> list[str]:
    """Where ``prefix``.0/24 (or a link or namespace named like ours) is already in use on this machine."""
    in_subnet = re.compile(rf"(?<![\d.]){re.escape(prefix)}\.\d")
    users = []
    for what, args in (("address", ("-4", "-o", "addr", "show")), ("route", ("-4", "route", "show", "table", "all"))):
        if in_subnet.search(ip(*args).stdout):
            users.append(f"a root-namespace {what} in {prefix}.0/24")
    if re.search(rf"^\d+: {tag}", ip("-o", "link", "show").stdout, re.M):
        users.append(f"links named {tag}*")
    for ns in sorted(NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else ():
        if ns.name.startswith(f"{tag}-") or in_subnet.search(ip("-4", "-o", "addr", "show", ns=ns.name, check=False).stdout):
            users.append(f"namespace {ns.name}")
    return users


def _claim_subnet() -> tuple[str, int]:
    """(prefix, lock fd) of the first free subnet, locked; or raises with what uses each one."""
    lock_dir = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())
    busy = []
    for prefix in SUBNETS:
        fd = os.open(lock_dir / f"rise_nemo_netns_{prefix}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            busy.append(f"{prefix}.0/24: held by another test session")
            continue
        users = subnet_users(prefix, _tag(prefix))
        if not users:
            return prefix, fd
        os.close(fd)
        busy.append(f"{prefix}.0/24: {', '.join(users)}")
    raise RuntimeError("no free test subnet: " + "; ".join(busy))


def _tag(prefix: str) -> str:
    return "rs" + prefix.rsplit(".", 1)[1]  # link names stay within 15 characters


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _ns_inode(ns: str) -> int:
    return os.stat(NETNS_DIR / ns).st_ino


@dataclass
class NetnsCluster(SlurmCluster):
    prefix: str = ""
    lock_fd: int = -1
    namespaces: list[str] = field(default_factory=list)  # created, n0 first
    links: list[str] = field(default_factory=list)  # root-namespace ends (deleting one end removes a veth)
    route: bool = False
    ns_inodes: dict[int, str] = field(default_factory=dict)
    node_ips: dict[str, str] = field(default_factory=dict)  # Slurm node name -> its address

    @property
    def tag(self) -> str:
        return _tag(self.prefix)

    @property
    def ctld_ip(self) -> str:
        return f"{self.prefix}.10"

    def ns_of(self, node: str) -> str:
        return f"{self.tag}-n{NODE_NAMES.index(node) + 1}"

    def in_ns(self, ns: str, *args: str) -> list[str]:
        return ["nsenter", f"--net={NETNS_DIR / ns}", *args]

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 60):
        """Slurm clients run inside the controller's namespace (the root namespace cannot reach it)."""
        return super().run(*self.in_ns(f"{self.tag}-n0", *args), check=check, env=env, timeout=timeout)

    # ------------------------------------------------------------------ processes in our namespaces
    def processes(self) -> dict[int, tuple[str, str]]:
        """pid -> (namespace, command line) of every live process inside one of our namespaces."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                link = os.readlink(entry / "ns" / "net")  # "net:[<inode>]"
                ns = self.ns_inodes.get(int(link[5:-1]))
                if ns is None or not _alive(int(entry.name)):
                    continue
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except (OSError, ValueError):
                continue  # the process ended while we looked
            found[int(entry.name)] = (ns, cmd)
        return found

    def strays(self) -> dict[int, tuple[str, str]]:
        """Processes in our namespaces other than the Slurm daemons (and slurmctld's own helper,
        slurmscriptd): job steps, Ray, servers."""
        daemons = set(self.pids.values())
        return {pid: v for pid, v in self.processes().items()
                if pid not in daemons and not (_parent(pid) in daemons and v[1] == ": slurmscriptd")}

    def wait_no_strays(self, timeout: float = 30) -> dict[int, tuple[str, str]]:
        """Waits for jobs' processes to end; returns those still there after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while (left := self.strays()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    # ------------------------------------------------------------------ build and tear down
    def build_network(self) -> None:
        tag, prefix = self.tag, self.prefix
        bridge = f"{tag}br"
        ip("link", "add", bridge, "type", "bridge")
        self.links.append(bridge)
        ip("link", "set", bridge, "up")  # no address: the root namespace is not on this network
        ip("route", "add", "unreachable", f"{prefix}.0/24")
        self.route = True
        for i in range(len(NODE_NAMES) + 1):
            ns, outer, inner = f"{tag}-n{i}", f"{tag}n{i}b", f"{tag}n{i}"
            ip("netns", "add", ns)
            self.namespaces.append(ns)
            self.ns_inodes[_ns_inode(ns)] = ns
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self.links.append(outer)
            ip("link", "set", outer, "master", bridge, "up")
            ip("link", "set", inner, "netns", ns)
            ip("link", "set", inner, "name", "eth0", ns=ns)
            ip("addr", "add", f"{prefix}.1{i}/24", "dev", "eth0", ns=ns)
            ip("link", "set", "eth0", "up", ns=ns)
            ip("link", "set", "lo", "up", ns=ns)

    def leftovers(self) -> list[str]:
        """What of ours still exists on the machine (empty after a clean stop)."""
        left = [f"daemon {name} (pid {pid})" for name, pid in self.pids.items() if _alive(pid)]
        left += [f"process {pid} in {ns}: {cmd}" for pid, (ns, cmd) in self.processes().items()]
        left += [f"namespace {ns}" for ns in self.namespaces if (NETNS_DIR / ns).exists()]
        links = ip("-o", "link", "show").stdout
        left += [f"link {name}" for name in re.findall(rf"^\d+: ({self.tag}[^:@\s]*)", links, re.M)]
        if re.search(rf"unreachable {re.escape(self.prefix)}\.0/24", ip("-4", "route", "show").stdout):
            left.append(f"route unreachable {self.prefix}.0/24")
        return left

    def stop(self) -> list[str]:
        """Removes everything this cluster made; returns the problems found (an empty list when clean)."""
        problems = []
        if "slurmctld" in self.pids:
            self.run("scancel", "--full", "--user=root", check=False, timeout=20)
        self.wait_no_strays(45)  # cancelled jobs' steps end on their own (KillWait is 30 s)
        for name in reversed(list(self.pids)):
            terminate(self.pids[name])
        # Anything still inside our namespaces was left behind by a job (a Ray process, a server): stop
        # it by PID and report it.
        stray = self.processes()
        for pid in stray:
            terminate(pid, grace=5)
        if stray:
            problems.append("processes left in the namespaces (stopped by PID): "
                            + "; ".join(f"{pid} in {ns}: {cmd[:120]}" for pid, (ns, cmd) in stray.items()))
        for link in reversed(self.links):
            ip("link", "del", link, check=False)
        if self.route:
            ip("route", "del", "unreachable", f"{self.prefix}.0/24", check=False)
        for ns in reversed(self.namespaces):
            ip("netns", "del", ns, check=False)
        # The kernel frees a namespace's devices asynchronously: wait until nothing of ours is listed.
        try:
            _wait_for(lambda: not self.leftovers(), 20, "the namespaces, links and route to go")
        except RuntimeError:
            problems.append("left on the machine after teardown: " + "; ".join(self.leftovers()))
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1
        return problems


def _daemon(cluster: NetnsCluster, ns: str, *cmd: str) -> None:
    res = subprocess.run(cluster.in_ns(ns, *cmd), env=cluster.env, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"{cmd[0]} in {ns} exited {res.returncode}: {(res.stderr or res.stdout).strip()[-2000:]}")


def start_netns_cluster(root: Path) -> NetnsCluster:
    """Builds the network, starts munged, slurmctld (n0) and three slurmd (n1..n3); waits until idle."""
    prepare_root(root)
    prefix, lock_fd = _claim_subnet()
    cpus = os.cpu_count() or 1
    conf = root / "slurm.conf"
    cluster = NetnsCluster(root, conf, NODE_NAMES[0], cpus, slurm_env(conf), prefix=prefix, lock_fd=lock_fd)
    cluster.node_ips = {node: f"{prefix}.1{i}" for i, node in enumerate(NODE_NAMES, start=1)}
    host = socket.gethostname().split(".")[0]
    conf.write_text(slurm_conf(root, host, cluster.ctld_ip, cluster.node_ips, cpus, 4000, CTLD_PORT, SLURMD_PORT))
    try:
        try:
            cluster.build_network()
        except (RuntimeError, OSError) as exc:
            raise NamespacesUnavailable(f"cannot build the network namespaces of the 3-node test cluster: {exc}") from exc
        cluster.pids["munged"] = start_munged(root)
        _daemon(cluster, f"{cluster.tag}-n0", "slurmctld", "-i", "-f", str(conf))
        cluster.pids["slurmctld"] = _read_pid(root / "slurmctld.pid")
        for node in NODE_NAMES:
            _daemon(cluster, cluster.ns_of(node), "slurmd", "-f", str(conf), "-N", node)
            cluster.pids[f"slurmd-{node}"] = _read_pid(root / f"slurmd-{node}.pid")
        wait_nodes_idle(cluster, len(NODE_NAMES), timeout=60)
    except BaseException:
        problems = cluster.stop()
        if problems:
            print("netns cluster teardown after a failed start:", *problems, sep="\n  ")
        raise
    return cluster
