"""Per-execution cgroups (rise_nemo/judges/sandbox_cgroups.py) and the rlimit-only fallback: the cap is per
execution, the pool's parallel executions stay within workers x the cap, every cgroup is removed (killed
or not), concurrent executions are apart, a crashed run's leftovers do not break the next one, and a
machine where the cgroups cannot be written falls back with one line instead of a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rise_nemo.judges.code_verifier import CodeTests, CodeVerifier
from rise_nemo.judges.sandbox import BubblewrapSandbox, HostMemoryBudget, SandboxPool, SandboxUnavailable
from rise_nemo.judges.sandbox_attacks import ATTACKS, HostBait, MemoryProbe, attack_sizes
from rise_nemo.judges.sandbox_cgroups import CgroupLayout, discover

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
# What this process's cgroups may hold beyond the executions' caps: the kernel charges in per-CPU batches of
# 64 pages, frees the last kernel objects of an ended execution a little later, and the launch prepared for
# each slot's next execution (a forked child waiting to exec) holds 16-256 KiB. Well under 1 MiB measured.
SLACK = 4 * MIB


def bomb_code(limits) -> str:
    """The multi-process memory bomb of sandbox_attacks (children holding about twice the cap together)."""
    attack = next(a for a in ATTACKS if a.name == "multiprocess_memory_bomb")
    with HostBait() as bait:
        return attack.code.format(**bait.fields(), **attack_sizes(limits))


def exec_dirs(sandbox) -> list[Path]:
    """The execution cgroups left, once the launches prepared for next executions are reaped."""
    sandbox.discard_prepared()
    return [d for parent in sandbox.cgroups.parents for d in parent.glob("exec-*")]


def test_a_multiprocess_bomb_is_killed_as_a_whole_within_its_cap(sandbox, cgroups, roomy_host):
    limits = sandbox.limits
    sizes = attack_sizes(limits)
    assert sizes["bomb_children"] * sizes["bomb_mb"] * MIB > 1.8 * limits.execution_memory_bytes  # a real threat
    assert sizes["bomb_mb"] < limits.memory_mb  # ... that the per-process limit lets through
    with MemoryProbe(cgroups) as probe:
        res = sandbox.run_python(bomb_code(limits))
    assert res.limit == "memory" and res.returncode is None and res.stdout == b"", res
    assert "whole execution killed" in res.reason
    assert res.peak_memory_bytes is not None and res.peak_memory_bytes <= limits.execution_memory_bytes
    assert probe.cgroup_peak is not None and probe.cgroup_peak <= limits.execution_memory_bytes + SLACK
    assert exec_dirs(sandbox) == []


def test_pool_of_n_never_holds_more_than_n_caps(sandbox, cgroups, roomy_host):
    """Four bombs on a pool of two (each bomb alone wants ~2 caps): each execution is killed at its cap; the
    executions' cgroups together never held more than 2 x the cap (sampled every 2 ms), nor, by the kernel's
    exact count, did everything of this process's sandboxes (SLACK: charge batches, launches waiting)."""
    limits = sandbox.limits
    code = bomb_code(limits)
    with MemoryProbe(cgroups) as probe, SandboxPool(sandbox, workers=2) as pool:
        results = pool.map([(code, "")] * 4)
    assert [r.limit for r in results] == ["memory"] * 4, [r.reason for r in results]
    assert all(r.peak_memory_bytes <= limits.execution_memory_bytes for r in results)
    assert probe.live_peak <= 2 * limits.execution_memory_bytes + SLACK
    assert probe.cgroup_peak is not None and probe.cgroup_peak <= 2 * limits.execution_memory_bytes + SLACK
    if probe.cgroup_peak_exact:  # the bombs did reach the cap (so the bound above is not vacuous)
        assert probe.cgroup_peak >= limits.execution_memory_bytes
    assert exec_dirs(sandbox) == []


def test_concurrent_executions_get_their_own_cgroups(sandbox, cgroups, roomy_host):
    """A bomb and an honest program side by side: distinct cgroups, the bomb's kill leaves the other alone."""
    honest = "import time\ntime.sleep(1.5)\nprint('still here')"
    with SandboxPool(sandbox, workers=2) as pool:
        bomb, calm = pool.map([(bomb_code(sandbox.limits), ""), (honest, "")])
    assert bomb.limit == "memory"
    assert calm.returncode == 0 and calm.stdout == b"still here\n" and calm.limit is None
    assert bomb.cgroup and calm.cgroup and bomb.cgroup != calm.cgroup


def test_cgroup_removed_after_every_ending(sandbox, cgroups, roomy_host):
    """Clean exit, wall-clock kill, output-cap kill, process-cap kill, memory kill: nothing left behind."""
    quick = replace(sandbox.limits, wall_seconds=2.0)
    runs = {
        "clean": ("print(1)", lambda r: r.returncode == 0),
        "timeout": ("import time\ntime.sleep(60)", lambda r: r.timed_out),
        "output": ("while True:\n    print('y' * 65536)", lambda r: r.output_limited),
        "processes": ("import os\nwhile True:\n    os.fork()", lambda r: r.limit == "processes"),
        "memory": (bomb_code(quick), lambda r: r.limit == "memory"),
    }
    names = set()
    for what, (code, ended_so) in runs.items():
        res = sandbox.run_python(code, limits=quick)
        assert ended_so(res), (what, res, res.stderr.decode(errors="replace")[-3000:])  # the whole traceback
        assert not any((parent / res.cgroup.split("/")[-1]).exists() for parent in cgroups.parents), what
        names.add(res.cgroup)
    assert len(names) == len(runs) and exec_dirs(sandbox) == []


def test_prepared_launches_hold_no_other_executions_pipes(sandbox, cgroups):
    """The next execution's process is forked ahead while others run; it must drop their pipes at once, or a
    program reading its stdin to the end would wait for a copy held elsewhere (until its wall clock)."""
    code = "import sys\nprint(len(sys.stdin.read()))"
    with SandboxPool(sandbox, workers=2) as pool:
        results = pool.map([(code, "x" * n) for n in range(1, 13)], replace(sandbox.limits, wall_seconds=30.0))
        prepared = {k: v for k, v in sandbox._prepared.items() if k[1] in pool._threads}
    assert [r.stdout for r in results] == [f"{n}\n".encode() for n in range(1, 13)], [r.reason for r in results]
    assert all(r.wall_seconds < 25 for r in results)  # hang guard, not a timing target
    assert len(prepared) == 2  # one per worker, waiting in its cgroup ...
    assert not any(k in sandbox._prepared for k in prepared)  # ... reaped when the pool closed,
    assert all(launch.process.returncode == 0 for launch in prepared.values())  # exited at its discard,
    assert not any(d.exists() for launch in prepared.values() for d in launch.cgroup.dirs)  # cgroups removed


def test_a_launch_runs_only_in_the_thread_that_forked_it(sandbox, cgroups):
    """bubblewrap dies with the thread that forked it (--die-with-parent): a launch prepared by a thread that
    has ended is never handed to another; the other forks its own."""
    done = []
    worker = threading.Thread(target=lambda: done.append(sandbox.run_python("print(1)", slot=5)))
    worker.start()
    worker.join(60)
    assert done and done[0].returncode == 0
    [(key, orphan)] = [(k, v) for k, v in sandbox._prepared.items() if k[0] == 5]
    assert key[1] == worker.ident
    again = sandbox.run_python("print(2)", slot=5)  # this thread: a fresh launch, the orphan left alone
    assert again.returncode == 0 and again.stdout == b"2\n"
    assert sandbox._prepared[key] is orphan and orphan.process.poll() is None
    sandbox.discard_prepared([worker.ident])
    assert key not in sandbox._prepared and orphan.process.returncode == 0


def test_pids_cap_kills_a_program_that_handles_the_failed_fork(sandbox, cgroups):
    """Hitting the process cap fails the execution even when the program catches the error and answers."""
    code = ("import os, time\nkids = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
            "            time.sleep(5)\n            os._exit(0)\n        kids += 1\nexcept OSError:\n"
            "    pass\nprint(kids)")
    verifier = CodeVerifier(per_test_seconds=5.0, workers=1, sandbox=sandbox)
    try:
        [r] = verifier.grade([f"```python\n{code}\n```"], [CodeTests([""], ["13"])])
    finally:
        verifier.close()
    assert r.outcome == "processes" and "process cap" in r.reason, r


# The scripts below load the sandbox modules alone: the judges package's __init__ imports torch, seconds
# of start-up (and not installed for the system interpreter the unprivileged test uses).
SANDBOX_ONLY = ("import sys, types\n"
                "sys.path.insert(0, {repo!r})\n"
                "pkg = types.ModuleType('rise_nemo.judges'); pkg.__path__ = [{judges!r}]\n"
                "sys.modules['rise_nemo.judges'] = pkg\n")


def script(body: str) -> str:
    return SANDBOX_ONLY.format(repo=str(REPO), judges=str(REPO / "rise_nemo" / "judges")) + textwrap.dedent(body)


RUNNER = script("""
    from rise_nemo.judges.sandbox import BubblewrapSandbox, SandboxLimits
    box = BubblewrapSandbox(SandboxLimits(memory_mb=256, processes=16, tmp_mb=16, wall_seconds=120))
    print(" ".join(str(p) for p in box.cgroups.parents), flush=True)
    box.run_python("import time\\ntime.sleep(120)")
""")

NEXT_RUN = script("""
    import logging, os
    from pathlib import Path
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    bases = [Path(p).parent for p in sys.argv[1:]]
    for base in bases:  # what a crashed earlier process with this very pid would have left
        (base / f"rise-nemo-sandbox-{os.getpid()}" / "exec-0").mkdir(parents=True)
    from rise_nemo.judges.sandbox import BubblewrapSandbox, SandboxLimits
    box = BubblewrapSandbox(SandboxLimits(memory_mb=256, processes=16, tmp_mb=16))
    print("removed", sorted(str(p) for p in box.cgroups.removed_leftovers))
    res = box.run_python("print(6 * 7)")
    print("result", res.returncode, res.stdout.decode().strip(), res.cgroup)
""")


def test_a_crashed_runs_leftovers_do_not_break_the_next(sandbox, cgroups, tmp_path):
    """A trainer SIGKILLed mid-execution leaves its cgroup directories; the next trainer (here with a pid
    whose directory also exists, as after a container restart) removes both and runs."""
    crashed = subprocess.Popen([sys.executable, "-c", RUNNER], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        parents = [Path(p) for p in crashed.stdout.readline().split()]
        assert parents, "the crashed run never started"
        deadline = time.monotonic() + 120
        while not any(list(p.glob("exec-*")) for p in parents) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(parents[0].glob("exec-*")), "its execution never started"
    finally:
        os.killpg(crashed.pid, signal.SIGKILL)
        crashed.wait(60)
    assert all(p.exists() for p in parents)  # the crash left them
    out = subprocess.run([sys.executable, "-c", NEXT_RUN, *map(str, parents)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "result 0 42" in out.stdout, out.stdout + out.stderr
    assert all(str(p) in out.stdout for p in parents), out.stdout  # the crashed run's, reported removed
    assert not any(p.exists() for p in parents)
    assert "Traceback" not in out.stderr


def test_read_only_or_missing_cgroup_path_gives_the_reason_not_a_traceback(tmp_path):
    missing = discover(env=str(tmp_path / "nowhere"))
    assert isinstance(missing, str) and "nowhere" in missing and "\n" not in missing
    assert isinstance(discover(env="off"), str)


NON_ROOT = script("""
    from rise_nemo.judges.sandbox import BubblewrapSandbox, SandboxLimits, SandboxPool
    box = BubblewrapSandbox(SandboxLimits(memory_mb=256, processes=16, tmp_mb=16))
    with SandboxPool(box, workers=2) as pool:
        [res] = pool.map([("import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])", "")])
    print("cgroups" if box.cgroups else "fallback", res.returncode, res.stdout.decode().strip())
""")


def test_a_user_who_cannot_write_cgroups_gets_the_fallback_and_one_line():
    """The real thing as an unprivileged uid (as on a laptop): one warning line, no traceback, sandboxed."""
    if os.geteuid() != 0 or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root (to become an unprivileged uid) and /usr/bin/python3")
    nobody = 65534

    def become_nobody() -> None:
        os.setgroups([])
        os.setgid(nobody)
        os.setuid(nobody)

    out = subprocess.run(["/usr/bin/python3", "-I", "-c", NON_ROOT], capture_output=True, text=True, timeout=300,
                         preexec_fn=become_nobody, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"}, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no cgroup for executions" in lines[0] and "of host memory" in lines[0], lines
    assert "not writable" in lines[0] or "Permission denied" in lines[0], lines
    assert out.stdout.split()[:2] == ["fallback", "0"], out.stdout


def test_fallback_bounds_processes_times_memory_to_its_share(sandbox):
    """Without cgroups a pool of N gets processes x memory_mb + tmp_mb <= fraction x host / N per execution,
    as the real rlimits inside the sandbox show."""
    limits = sandbox.limits  # 16 processes x 256 MiB + 16 MiB, about 4 GiB per execution unbounded
    budget = HostMemoryBudget(total_bytes=4 << 30, fraction=0.5, reason="test")  # 2 GiB for everything
    box = BubblewrapSandbox(limits, containment=budget)
    assert box.cgroups is None
    report = ("import resource\nprint(resource.getrlimit(resource.RLIMIT_NPROC)[0], "
              "resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)")
    with SandboxPool(box, workers=2) as pool:
        results = pool.map([(report, "")] * 2)
    for res in results:
        assert res.returncode == 0 and res.cgroup is None, res.reason
        processes, memory_mb = map(int, res.stdout.split())
        assert 2 * (processes * memory_mb + limits.tmp_mb) <= 2048
        assert processes < limits.processes and memory_mb == limits.memory_mb
    [alone] = [box.run_python(report)]  # the pool closed: its slots are given back
    assert int(alone.stdout.split()[0]) == min(limits.processes, (2048 - limits.tmp_mb) // limits.memory_mb)
    too_small = HostMemoryBudget(total_bytes=256 << 20, fraction=0.5, reason="test")
    with pytest.raises(SandboxUnavailable, match="lower the pool's workers"):
        too_small.register(8)


def test_layout_is_read_from_proc_on_every_kind_of_host(tmp_path):
    """cgroup v2 only (systemd), hybrid (v1 memory and pids, an empty v2), and a container whose mount root is
    its own cgroup: the directories of this process in each."""
    def layout(mountinfo: str, cgroup: str) -> CgroupLayout:
        (tmp_path / "mountinfo").write_text(textwrap.dedent(mountinfo).strip() + "\n")
        (tmp_path / "cgroup").write_text(textwrap.dedent(cgroup).strip() + "\n")
        return CgroupLayout.read(str(tmp_path / "mountinfo"), str(tmp_path / "cgroup"))

    v2 = layout("""
        25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
        35 25 0:30 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
    """, "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run.scope")
    assert v2.v2_dir == Path("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run.scope")
    assert v2.v1_dirs == {}
    hybrid = layout("""
        35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
        39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
        41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
    """, """
        8:pids:/
        4:memory:/process_api/abc
        0::/
    """)
    assert hybrid.v1_dirs == {"memory": Path("/sys/fs/cgroup/memory/process_api/abc"),
                              "pids": Path("/sys/fs/cgroup/pids")}
    assert hybrid.v2_dir == Path("/sys/fs/cgroup/unified")
    container = layout("""
        700 690 0:40 /kubepods/pod1/ctr /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw
    """, "0::/kubepods/pod1/ctr/worker")
    assert container.v2_dir == Path("/sys/fs/cgroup/worker")


def test_seccomp_denies_tracing_and_uncounted_shared_memory(sandbox):
    code = textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        def errno_of(rc):
            return ctypes.get_errno() if rc == -1 else 0
        print(errno_of(libc.ptrace(16, os.getppid(), 0, 0)), errno_of(libc.shmget(0, 1 << 20, 0o1600)))
        try:
            os.memfd_create("x")
            print("memfd")
        except OSError as exc:
            print(exc.errno)
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        print("forks still work")
    """)
    res = sandbox.run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().split("\n")[:3] == ["1 1", "1", "forks still work"]  # EPERM, EPERM, EPERM


class _Unjoinable:
    """A cgroup that the child cannot enter (as when the cgroupfs stops accepting it)."""

    fds: tuple[int, ...] = ()
    dirs = [Path("/sys/fs/cgroup/unjoinable")]

    def join(self) -> None:
        raise PermissionError("no")


def test_a_launch_that_cannot_join_its_cgroup_fails_with_the_reason_and_leaves_nothing(sandbox):
    from rise_nemo.judges.sandbox_launch import PreparedLaunch

    launch = PreparedLaunch(sandbox.argv(sandbox.limits), ["/bin/true"], None, _Unjoinable(), None, {}, ())
    with pytest.raises(OSError, match="could not join its cgroup /sys/fs/cgroup/unjoinable"):
        launch.release(b"print(1)", 1, 64 << 20, 1 << 20)
    assert launch.process.returncode == 127  # the child exited before exec, and was reaped
    launch.close_fds()  # a second close is a no-op (the descriptors were closed once)
