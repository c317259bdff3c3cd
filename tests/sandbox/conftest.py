"""Fixtures for the code sandbox tests: a bubblewrap sandbox with small limits and a CodeVerifier on it.

Without bubblewrap (or where it cannot create namespaces) the tests skip with the reason, except in CI
(``CI=true``, set by .ci/run, which installs bubblewrap): there they fail.
"""

from __future__ import annotations

import os

import pytest

from rise_nemo.judges.sandbox import BubblewrapSandbox, SandboxLimits, SandboxUnavailable

# Small limits: attacks are stopped early and cheaply (the 50 GB allocation by the 256 MiB address space).
TEST_LIMITS = SandboxLimits(wall_seconds=10.0, cpu_seconds=10, memory_mb=256, processes=16, tmp_mb=16,
                            stdout_bytes=1 << 20)


@pytest.fixture(scope="session")
def sandbox() -> BubblewrapSandbox:
    try:
        box = BubblewrapSandbox(TEST_LIMITS)
        box.check()
    except SandboxUnavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))
    return box


@pytest.fixture(scope="session")
def verifier(sandbox):
    from rise_nemo.judges.code_verifier import CodeVerifier

    v = CodeVerifier(per_test_seconds=5.0, total_seconds=15.0, workers=2, sandbox=sandbox)
    yield v
    v.close()
