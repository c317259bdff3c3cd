"""tests/nemo: under ``make test-nemo`` (RISE_REQUIRE_NEMO_RL=1) a skipped real-NeMo-RL test fails the run.

The tests that import NeMo-RL's own code are marked ``nemo`` and import it through
``nemo_venv.import_nemo_rl()``: where NeMo-RL is absent they skip (a plain ``make test``); under
``make test-nemo`` a missing or broken NeMo-RL is an import error, and any skip at all (an environment
check, a missing example config) turns the exit status into a failure with the skipped tests listed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("RISE_REQUIRE_NEMO_RL") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = list(reporter.stats.get("skipped", [])) if reporter is not None else []
    if skipped:
        lines = [f"  {r.nodeid}: {r.longrepr[2] if isinstance(r.longrepr, tuple) else r.longrepr}" for r in skipped]
        print(f"\nRISE_REQUIRE_NEMO_RL=1: {len(skipped)} real-NeMo-RL test(s) skipped, which make test-nemo "
              "does not allow:\n" + "\n".join(lines))
        session.exitstatus = 1
    elif session.testscollected == 0:
        print("\nRISE_REQUIRE_NEMO_RL=1: no real-NeMo-RL test was collected")
        session.exitstatus = 1


@pytest.fixture(scope="module")
def ray_private(tmp_path_factory):
    """A private Ray cluster of this process on 127.0.0.1 (address='local': never attaches to another one);
    its workers run the CPU harness (PYTHONPATH: the generated sitecustomize, our code, NeMo-RL and whatever
    PYTHONPATH already holds, e.g. the Automodel source), and the DTensor workers run in this interpreter."""
    import ray

    sys.path.insert(0, str(HERE))
    import cpu_harness
    from private_ray import init_local

    site = cpu_harness.write_worker_sitecustomize(tmp_path_factory.mktemp("worker_site"))
    old = dict(os.environ)
    nemo_dir = os.environ.get("NEMO_RL_DIR", "")
    os.environ.update(
        RISE_NEMO_CPU_HARNESS="1", RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        NRL_DISABLE_NUMA_BINDING="1", RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(site.parent), str(ROOT), nemo_dir, old.get("PYTHONPATH", "")) if p),
    )
    os.environ.pop("RAY_ADDRESS", None)
    previous = cpu_harness.patch_driver()
    try:  # whatever happens, the harness environment must not leak into the next test module
        init_local(num_cpus=4, log_to_driver=True)  # retried when the raylet misses Ray's start-up window
        yield
    finally:
        ray.shutdown()
        cpu_harness.unpatch_driver(previous)
        os.environ.clear()
        os.environ.update(old)
