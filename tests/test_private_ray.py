"""tests/private_ray.py: a raylet that misses Ray's fixed start-up window is cleaned up by PID and started again.

The stall is made inside Ray's own start-up loop (ray/_private/node.py): the GCS and the raylet really start,
``services.get_node`` does not find the node yet and Ray's clock is moved past its 30 s wait, so Ray raises its
real "The current node timed out during startup" error with its processes left running, as on a loaded CI
machine. Runs in a subprocess: it patches Ray's internals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray")

TESTS = Path(__file__).resolve().parent

DRIVER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    import ray
    import ray._private.node as node_module
    import ray._private.services as services
    from private_ray import descendants, init_local

    state = {{"stall": False, "left": set(), "jump": 0.0}}
    real_get_node = services.get_node

    def get_node(*args, **kwargs):
        if state["stall"]:  # the raylet has not registered yet; Ray's clock moves past its 30 s wait
            state["left"] |= descendants(os.getpid())
            state["jump"] += 31.0
            raise RuntimeError("node not registered yet")
        return real_get_node(*args, **kwargs)

    class Clock:
        def __getattr__(self, name):
            return getattr(time, name)

        def monotonic(self):
            return time.monotonic() + state["jump"]

    services.get_node, node_module.time = get_node, Clock()
    real_init, calls = ray.init, []

    def init(*args, **kwargs):
        calls.append(1)
        state["stall"] = len(calls) == {stalls}
        return real_init(*args, **kwargs)

    ray.init = init
    try:
        init_local(num_cpus=1, log_to_driver=False)
    except Exception as exc:
        print(json.dumps({{"error": str(exc)}}))
        raise SystemExit(0)

    def alive(pid):
        try:
            return "zombie" not in open(f"/proc/{{pid}}/status").read().lower()
        except OSError:
            return False

    print(json.dumps({{"attempts": len(calls), "left": sorted(state["left"]),
                      "left_alive": [p for p in state["left"] if alive(p)],
                      "cpus": ray.cluster_resources().get("CPU")}}))
    ray.shutdown()
""")


def _run(tmp_path: Path, stalls: int) -> dict:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(tests=str(TESTS), stalls=stalls))
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_raylet_that_misses_the_startup_window_is_killed_and_started_again(tmp_path):
    out = _run(tmp_path, stalls=1)
    assert out.get("attempts") == 2, out  # the first attempt hit Ray's timeout, the second started
    assert out["left"], out  # the failed attempt had started Ray processes (GCS, raylet) ...
    assert out["left_alive"] == [], out  # ... and none of them outlived it
    assert out["cpus"] == 1.0, out


def test_other_startup_errors_are_not_retried():
    from private_ray import with_retry

    calls = []

    def start():
        calls.append(1)
        raise ValueError("bad option")

    with pytest.raises(ValueError, match="bad option"):
        with_retry(start, "test")
    assert calls == [1]


def test_the_retries_are_bounded():
    from private_ray import ATTEMPTS, with_retry

    calls = []

    def start():
        calls.append(1)
        raise Exception("The current node timed out during startup. This could happen ...")

    with pytest.raises(RuntimeError, match="missed its start-up window"):
        with_retry(start, "test")
    assert len(calls) == ATTEMPTS
