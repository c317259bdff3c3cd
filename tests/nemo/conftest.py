"""tests/nemo: under ``make test-nemo`` (RISE_REQUIRE_NEMO_RL=1) a skipped real-NeMo-RL test fails the run.

The tests that import NeMo-RL's own code are marked ``nemo`` and import it through
``nemo_venv.import_nemo_rl()``: where NeMo-RL is absent they skip (a plain ``make test``); under
``make test-nemo`` a missing or broken NeMo-RL is an import error, and any skip at all (an environment
check, a missing example config) turns the exit status into a failure with the skipped tests listed.
"""

from __future__ import annotations

import os


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
