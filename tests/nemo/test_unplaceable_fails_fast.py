"""A Ray actor that can never be placed ends the run in bounded time with one line naming the layout, instead of
the driver blocking in its first call to it for ever (rise_nemo.backends.nemo.placement.PlacementWatchdog).

The stuck actor is the one this project hit: a third group of workers asking for a share of GPUs a two-group
placement group has already given away (half a GPU each of bundles whose GPU is taken). Real Ray on 127.0.0.1
with declared GPUs; needs no NeMo-RL (runs in ``make test``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = "ppo_math_7b: 1 training node(s) x 1 GPUs, on each training GPU: policy + vLLM + value model"

# One GPU in a placement-group bundle; two "groups" take half of it each; the third asks for half again.
STUCK = textwrap.dedent("""
    import os, ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from private_ray import init_local

    init_local(num_cpus=4, num_gpus=1, log_to_driver=False)
    pg = placement_group([{"CPU": 3, "GPU": 1}], strategy="PACK")
    ray.get(pg.ready())

    @ray.remote
    class Worker:
        def ping(self):
            return "pong"

    def group(name):
        return Worker.options(name=name, num_gpus=0.5, scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=0)).remote()

    policy, vllm, value = group("lm_policy-0-0"), group("vllm_policy-0-0"), group("lm_value-0-0")
""")


def _env() -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    return env


def test_the_watchdog_names_the_stuck_actor_and_the_layout(tmp_path):
    """In-process use: the watchdog reports (``on_stuck``) once the value worker has waited its timeout."""
    script = tmp_path / "watch.py"
    script.write_text(STUCK + textwrap.dedent(f"""
        import time
        from rise_nemo.backends.nemo.placement import PlacementWatchdog
        assert ray.get([policy.ping.remote(), vllm.ping.remote()]) == ["pong", "pong"]  # two groups fit
        seen = []
        dog = PlacementWatchdog({LAYOUT!r}, timeout_s=3, on_stuck=seen.append, poll_s=0.5).start()
        deadline = time.monotonic() + 120
        while not seen and time.monotonic() < deadline:
            time.sleep(0.5)
        print("MESSAGE:" + (seen[0] if seen else "none"))
        ray.shutdown()
    """))
    done = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    message = done.stdout.split("MESSAGE:", 1)[1].strip()
    assert message.startswith("Ray actor lm_value-0-0 (Worker) was not placed within 3 s"), message
    assert LAYOUT in message and "nemo.adapter.placement_timeout_s" in message and "\n" not in message


def test_a_driver_blocked_on_an_unplaceable_worker_ends_with_one_line(tmp_path):
    """The hang as it happened: the driver's main thread waits on the value worker (NeMo-RL's first call to a
    new worker group). Inside `rise-nemo train`'s fail-fast context the watchdog ends the process: exit 1, one
    line on stderr, the note in train.log, within the timeout plus Ray's bounded shutdown."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = tmp_path / "hang.py"
    script.write_text(STUCK + textwrap.dedent(f"""
        from pathlib import Path
        from rise_nemo.backends.nemo.failfast import fail_fast
        from rise_nemo.backends.nemo.placement import PlacementWatchdog
        with fail_fast("rise-nemo train", run_dir=lambda: Path({str(run_dir)!r})):
            PlacementWatchdog({LAYOUT!r}, timeout_s=3, poll_s=0.5).start()
            ray.get(value.ping.remote())  # never returns: the value worker is never placed
        print("unreachable")
    """))
    done = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    assert "unreachable" not in done.stdout
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("rise-nemo train:")]
    assert len(lines) == 1 and "lm_value-0-0" in lines[0] and LAYOUT in lines[0], done.stderr[-3000:]
    assert "was not placed within 3 s" in (run_dir / "train.log").read_text()


def test_no_watchdog_and_no_ray_started_when_this_process_has_no_ray(tmp_path):
    """A build with NeMo-RL's init_ray replaced (the mocked-NeMo-RL tests) has no Ray to watch. Asking Ray for
    the runtime context anyway started or attached to a Ray of its own: with a stale
    /tmp/ray/ray_current_cluster (left by an earlier `ray start`) four tests failed 'Failed to connect to Ray
    cluster at ...:6379'. Here the default temp dir holds such a file, pointing at a port nobody serves."""
    stale = tmp_path / "tmp"  # RAY_TMPDIR: Ray reads <it>/ray/ray_current_cluster
    (stale / "ray").mkdir(parents=True)
    (stale / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")
    probe = ("import ray\n"
             "from rise_nemo.backends.nemo.placement import start_watchdog\n"
             "watchdog = start_watchdog({'nemo': {'adapter': {'placement_timeout_s': 60}}})\n"
             "print('watchdog', watchdog, 'ray', ray.is_initialized())\n")
    env = {**_env(), "RAY_TMPDIR": str(stale)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "watchdog None ray False"
