"""Session fixture `slurm`: the real single-node Slurm of slurm_cluster.py, stopped by PID at the end."""

from __future__ import annotations

import os
import time

import pytest
from slurm_cluster import SlurmCluster, start_cluster, unavailable_reason


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> SlurmCluster:
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("RISE_REQUIRE_SLURM") == "1":
            pytest.fail(f"RISE_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    started = time.monotonic()
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    print(f"single-node Slurm up in {time.monotonic() - started:.1f}s at {cluster.root}")
    yield cluster
    cluster.stop()
