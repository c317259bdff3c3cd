"""Suite-wide test settings: offline, loopback-only, small thread counts (2-core CI machines)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Set before any test module imports transformers / ray.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keeps Ray on 127.0.0.1 (docs/DESIGN.md §5)

REPO_ROOT = Path(__file__).resolve().parents[1]
# Tests keep the warm-start cache inside the checkout (.cache/, git-ignored) unless told otherwise.
os.environ.setdefault("RISE_NEMO_CACHE", str(REPO_ROOT / ".cache"))


@pytest.fixture(scope="session")
def healthbench_path() -> Path:
    """The HealthBench sample shipped in the package (rise_nemo/data/samples, MIT licence)."""
    from rise_nemo.data.samples import healthbench_sample_path

    return healthbench_sample_path()


_STARTED_RAY: list[bool] = []  # whether this session started the Ray the tests share


@pytest.fixture
def ray_session():
    """One small loopback Ray cluster shared by the session's Ray tests (reused if another suite started one).
    Checked at every use, not once: an in-process test of the fail-fast exit (tests/nemo/test_fail_fast.py)
    shuts Ray down on purpose, and a later test would otherwise get a dead cluster."""
    ray = pytest.importorskip("ray")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray.init: stay on 127.0.0.1
    if not ray.is_initialized():
        # always our own small cluster on 127.0.0.1, never one another process on the machine runs (retried when
        # the raylet misses Ray's start-up window: tests/private_ray.py)
        from private_ray import init_local

        init_local(num_cpus=2, log_to_driver=False)
        _STARTED_RAY.append(True)
    return ray


def pytest_sessionfinish(session, exitstatus):
    if _STARTED_RAY:
        import ray

        if ray.is_initialized():
            ray.shutdown()
