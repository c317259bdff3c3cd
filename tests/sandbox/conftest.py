"""Fixtures for the code sandbox tests: a bubblewrap sandbox with small limits and a CodeVerifier on it.

Without bubblewrap (or where it cannot create namespaces) the tests skip with the reason, except in CI
(``CI=true``, set by .ci/run, which installs bubblewrap): there they fail. The same holds for per-execution
cgroups (``cgroups``): CI runs as root, where they must work; a non-root machine without a delegated
subtree runs the rlimit-only fallback, and the tests that need cgroups skip there.

Memory attacks are finite (about twice the execution cap, 272 MiB here) and ``roomy_host`` skips them on a
host with less than 2 GiB available, so they can never push this machine into its OOM killer.
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
def cgroups(sandbox):
    """The session sandbox's per-execution cgroups (skip without them, fail in CI)."""
    if sandbox.cgroups is None:
        reason = f"no per-execution cgroups here ({sandbox.containment.reason})"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return sandbox.cgroups


def mem_available() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture
def roomy_host():
    if mem_available() < 2 << 30:
        pytest.skip(f"only {mem_available() >> 20} MiB available: no memory bomb on this host now")


@pytest.fixture(scope="session")
def verifier(sandbox):
    from rise_nemo.judges.code_verifier import CodeVerifier

    v = CodeVerifier(per_test_seconds=5.0, total_seconds=15.0, workers=2, sandbox=sandbox)
    yield v
    v.close()
