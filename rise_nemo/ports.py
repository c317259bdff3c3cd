"""Every TCP port or port range a node of a cluster run uses, in ONE table (docs/slurm.md "Ports" prints it).

Who listens where on a node launched by ``slurm/launch.sh`` running a NeMo-RL recipe: Ray's head and per-node
services, Ray's worker processes, NeMo-RL's rendezvous and vLLM's, the judge / teacher vLLM servers of
launch.sh. Two fixed ports or ranges that overlap make a run fail intermittently (whichever process binds
first wins), so ``overlaps()`` must find none at the largest node this project plans for (8 GPUs: 8 vLLM
engines of TP 1, 8 judge or teacher replicas). Everything sits below Linux's ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 by default), where the kernel picks the source ports of outgoing
connections and the listening ports of NCCL's and gloo's data sockets; a fixed port there can be taken by any
connection at any time.

``tests/slurm/test_ports.py`` checks launch.sh's defaults against this table and NeMo-RL's own constants
(nemo_rl/distributed/virtual_cluster.py:84-100, vllm_worker.py:121-135) against its NeMo-RL rows.
Not TCP, listed for completeness: the colocated refit's ZMQ socket is a Unix socket,
``ipc:///tmp/<device uuid>.sock`` (nemo_rl/models/policy/workers/base_policy_worker.py:74-76).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GPUS_PER_NODE = 8  # the largest node the recipes plan for: 8 vLLM engines, 8 server replicas
EPHEMERAL = (32768, 60999)  # Linux's default ip_local_port_range


@dataclass(frozen=True)
class PortUse:
    name: str
    low: int
    high: int  # inclusive
    who: str  # the process that binds it
    setting: str  # where it is set: a launch.sh variable, a NeMo-RL constant or config key
    ephemeral: bool = False  # kernel-assigned inside this range, not a fixed port

    def overlaps(self, other: PortUse) -> bool:
        return self.low <= other.high and other.low <= self.high

    def __str__(self) -> str:
        ports = str(self.low) if self.low == self.high else f"{self.low}-{self.high}"
        return f"{self.name} {ports}"


def vllm_rendezvous(gpus_per_node: int = GPUS_PER_NODE) -> PortUse:
    """NeMo-RL gives vLLM engine i on a node ``VLLM_PORT = 20001 + 100 * i`` (vllm_worker.py:121-135; vLLM
    counts up from there on collision): one engine per GPU at TP 1."""
    return PortUse("vLLM TP/DP rendezvous", 20001, 20001 + 100 * gpus_per_node - 1, "each vLLM engine (NeMo-RL)",
                   "NeMo-RL DEFAULT_VLLM_PORT_RANGE_LOW + 100 x engine (VLLM_PORT)")


def server_replicas(name: str, first: int, setting: str, gpus_per_node: int = GPUS_PER_NODE) -> PortUse:
    """launch.sh's start_servers: GPUS_PER_NODE / TP replicas per node on ports first, first+1, ... (TP 1 at most)."""
    return PortUse(name, first, first + gpus_per_node - 1, f"{name} (vllm serve, one per replica)", setting)


def table(gpus_per_node: int = GPUS_PER_NODE) -> tuple[PortUse, ...]:
    return (
        PortUse("Ray GCS (head)", 6379, 6379, "ray start --head", "RISE_RAY_PORT"),
        PortUse("Ray node manager", 6800, 6800, "raylet", "RAY_NODE_MANAGER_PORT"),
        PortUse("Ray object manager", 6801, 6801, "raylet", "RAY_OBJECT_MANAGER_PORT"),
        PortUse("Ray dashboard agent (HTTP)", 6802, 6802, "dashboard agent", "RAY_DASHBOARD_AGENT_LISTEN_PORT"),
        PortUse("Ray dashboard agent (gRPC)", 6803, 6803, "dashboard agent", "RAY_DASHBOARD_AGENT_GRPC_PORT"),
        PortUse("Ray runtime-env agent", 6804, 6804, "runtime-env agent", "RAY_RUNTIME_ENV_AGENT_PORT"),
        PortUse("Ray metrics export", 6805, 6805, "raylet", "RAY_METRICS_EXPORT_PORT"),
        server_replicas("judge servers", 8000, "RISE_JUDGE_PORT", gpus_per_node),
        server_replicas("teacher servers", 8100, "RISE_TEACHER_PORT", gpus_per_node),
        PortUse("Ray dashboard (head)", 8265, 8265, "ray start --head", "RAY_DASHBOARD_PORT"),
        PortUse("Ray client server (head)", 10001, 10001, "ray start --head", "RAY_CLIENT_SERVER_PORT"),
        PortUse("vLLM / SGLang HTTP servers", 11001, 15000, "NeMo-RL's async vLLM engine (refused by the nemo "
                "backend; reserved)", "NeMo-RL DEFAULT_GENERATION_PORT_RANGE_LOW/HIGH"),
        PortUse("NeMo Gym HTTP servers", 15001, 20000, "NeMo-RL's NeMo Gym (unused here; reserved)",
                "NeMo-RL DEFAULT_GYM_PORT_RANGE_LOW/HIGH"),
        vllm_rendezvous(gpus_per_node),
        PortUse("NeMo-RL master address / TCPStore", 25000, 27999, "rank 0 of each worker group (torch.distributed "
                "rendezvous for NCCL / gloo)", "nemo.cluster.master_port_range_low/high (NeMo-RL default "
                "25000-28000, upper bound exclusive)"),
        PortUse("Ray worker processes", 29001, 29512, "every Ray worker (actors and tasks)",
                "RAY_MIN_WORKER_PORT / RAY_MAX_WORKER_PORT"),
        PortUse("NCCL / gloo data sockets, outgoing connections", *EPHEMERAL, "the kernel (port 0 binds)",
                "net.ipv4.ip_local_port_range", ephemeral=True),
    )


def overlaps(uses: Iterable[PortUse]) -> list[tuple[PortUse, PortUse]]:
    """Pairs that would collide: two fixed uses sharing a port, or a fixed use inside the ephemeral range."""
    uses = list(uses)
    return [(a, b) for i, a in enumerate(uses) for b in uses[i + 1:] if a.overlaps(b)]


def markdown(uses: Iterable[PortUse] | None = None) -> str:
    """The table as docs/slurm.md shows it."""
    lines = ["| ports | what | bound by | set by |", "|---|---|---|---|"]
    for u in uses or table():
        ports = str(u.low) if u.low == u.high else f"{u.low}-{u.high}"
        lines.append(f"| {ports} | {u.name} | {u.who} | `{u.setting}` |")
    return "\n".join(lines)


__all__ = ["EPHEMERAL", "GPUS_PER_NODE", "PortUse", "markdown", "overlaps", "server_replicas", "table",
           "vllm_rendezvous"]
