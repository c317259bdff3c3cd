"""Slurm fixtures, each stopped by PID at the end:

- `slurm` (session): the real single-node Slurm of slurm_cluster.py, on 127.0.0.1;
- `netns_slurm` (module): the real 3-node Slurm in network namespaces of netns_cluster.py. Module-scoped,
  so its namespaces and daemons live only while tests/slurm/test_slurm_multinode.py runs. The two can
  run at the same time (separate configurations, munge sockets and network namespaces).

Either skips with the reason when the machine cannot run it, and fails instead under RISE_REQUIRE_SLURM=1
(set by .ci/run).
"""

from __future__ import annotations

import os
import time

import netns_cluster
import pytest
from slurm_cluster import SlurmCluster, start_cluster, unavailable_reason


def skip_or_fail(reason: str) -> None:
    if os.environ.get("RISE_REQUIRE_SLURM") == "1":
        pytest.fail(f"RISE_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> SlurmCluster:
    reason = unavailable_reason()
    if reason is not None:
        skip_or_fail(reason)
    started = time.monotonic()
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    print(f"single-node Slurm up in {time.monotonic() - started:.1f}s at {cluster.root}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def netns_slurm(tmp_path_factory) -> netns_cluster.NetnsCluster:
    reason = netns_cluster.unavailable_reason()
    if reason is not None:
        skip_or_fail(reason)
    started = time.monotonic()
    try:
        cluster = netns_cluster.start_netns_cluster(tmp_path_factory.mktemp("netns_slurm"))
    except netns_cluster.NamespacesUnavailable as exc:
        skip_or_fail(str(exc))
    print(f"3-node Slurm in network namespaces up in {time.monotonic() - started:.1f}s on {cluster.prefix}.0/24")
    yield cluster
    problems = cluster.stop()
    assert not problems, "teardown of the 3-node test cluster:\n" + "\n".join(problems)
