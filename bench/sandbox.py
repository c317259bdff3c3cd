"""Code sandbox bench: containment of the attacks, real APPS solutions, and the sandbox's time overhead.

1. Every attack of rise_nemo.judges.sandbox_attacks (fork bomb, rm -rf of home and run dir, reading the API
   key / ~/.ssh / the run dir, sockets, 50 GB, 1 GB of output, daemons, a multi-process memory bomb, a
   thread bomb, a double-forked pid-hopping daemon, ptrace of PID 1, /dev/shm and shared memory, filling
   /tmp, ...) graded by CodeVerifier against temporary bait; contained = reward 0 with a reason, bait
   unchanged, no process left, grading still works.
1b. Aggregate memory, at the default limits (memory_mb=1024, tmp_mb=64: a cap of 1088 MiB, large against
   the noise of a shared host): the multi-process memory bomb (children of 60% of memory_mb each, about
   twice the execution's cap together) ``--memory-trials`` times with the sandbox's containment (a cgroup
   per execution where usable), alternating with the same bomb under the per-process rlimits only; per trial
   the host's drop (/proc/meminfo sampled every 1 ms by a separate process: the larger of MemAvailable's
   largest fall and the largest rise of AnonPages + Shmem + PageTables + KernelStack since the start;
   other tenants' allocations count too) and, with cgroups, the kernel's peak of what the executions held.
   aggregate_memory_capped=1 when every contained trial was killed as a whole (outcome memory) with the
   kernel's peak within the cap (+1%: its per-CPU charge batches); host_drop_ratio = the median over
   trials of drop / cap (target <= 1.1; the largest is printed too); host_noise_ratio the same over a
   harmless program as long as the trial's bomb run, run after it (other tenants' allocations, which
   every drop includes); rlimit_only_drop_ratio the bomb without a cgroup, for comparison. Runs are a second
   apart (a run without a cgroup returns before its processes have all gone).
2. The first human solution of each of the 5 shipped APPS problems (rise_nemo/data/samples,
   apps_solutions_5.jsonl) graded with the APPS preamble: how many pass.
3. Overhead: the same (program, stdin) executions (those of step 2, every test, ``--rounds`` times) run as
   sandboxes (one bubblewrap sandbox per execution) and as bare subprocesses of the same interpreter with
   the same rlimits, each on ``--workers`` threads; ratio = sandboxed wall time / bare wall time. The two
   modes alternate round by round so that load from other processes hits both alike.

Last line: RESULT containment=<contained/attacks> attacks=<n> aggregate_memory_capped=<0|1> host_drop_ratio=<x>
overhead_ratio=<x> real_solutions_pass=<k>/5 host_drop_ratio_max=<x> cgroup_peak_ratio=<x> host_noise_ratio=<x>
rlimit_only_drop_ratio=<x> containment_mode=<cgroup-v1|cgroup-v2|rlimits>
Targets: containment=1 with attacks >= 20, aggregate_memory_capped=1, host_drop_ratio <= 1.1,
real_solutions_pass=5/5, overhead_ratio <= 1.5.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rise_nemo.data.reasoning import load_reasoning_problems  # noqa: E402
from rise_nemo.data.samples import apps_solutions_path  # noqa: E402
from rise_nemo.judges.code_verifier import CodeVerifier, parse_tests  # noqa: E402
from rise_nemo.judges.sandbox import (  # noqa: E402
    BubblewrapSandbox,
    HostMemoryBudget,
    SandboxLimits,
    SandboxPool,
    bare_python,
)
from rise_nemo.judges.sandbox_attacks import (  # noqa: E402
    ATTACKS,
    Attack,
    AttackReport,
    HostBait,
    attack_sizes,
    run_attack,
)

_MIB = 1 << 20


def _mem_available() -> int:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def _print_attack(report: AttackReport) -> None:
    print(f"attack {report.name:24s} {'contained' if report.contained else 'ESCAPED'}  reward={report.reward:g} "
          f"outcome={report.outcome} reason={report.reason!r}"
          + (f" damage={list(report.damage)}" if report.damage else "")
          + (f" leftover={list(report.leftover)}" if report.leftover else ""), flush=True)


def _drop(rep: AttackReport) -> str:
    return (f"{rep.host_drop_bytes / _MIB:.0f} MiB (MemAvailable -{rep.available_drop_bytes / _MIB:.0f}, "
            f"held +{rep.held_rise_bytes / _MIB:.0f})")


_SETTLE_SECONDS = 1.0  # between runs: a run without a cgroup returns before its processes are all gone


def aggregate_memory(limits: SandboxLimits, trials: int, bait: HostBait) -> dict[str, float]:
    """The memory bomb ``trials`` times in a sandbox with ``limits`` and this process's containment,
    alternating with a harmless program as long as that bomb run and with the same bomb under the
    per-process rlimits only; per run the host's drop and, with cgroups, the kernel's peak."""
    bomb = next(a for a in ATTACKS if a.name == "multiprocess_memory_bomb")
    cap = limits.execution_memory_bytes
    sizes = attack_sizes(limits)
    bomb_bytes = sizes["bomb_children"] * sizes["bomb_mb"] * _MIB
    print(f"memory bomb: {sizes['bomb_children']} children x {sizes['bomb_mb']} MiB against an execution cap of "
          f"{cap / _MIB:.0f} MiB (memory_mb={limits.memory_mb}, tmp_mb={limits.tmp_mb})", flush=True)
    # 10 s per run: on a loaded machine the bombs need seconds to touch their memory
    verifier = CodeVerifier(per_test_seconds=10.0, workers=1, sandbox=BubblewrapSandbox(limits))
    rlimit_verifier = None
    if _mem_available() > 4 * bomb_bytes:  # the uncapped bomb really allocates this much
        rlimit_box = BubblewrapSandbox(limits, containment=HostMemoryBudget(reason="per-process rlimits only"))
        rlimit_verifier = CodeVerifier(per_test_seconds=10.0, workers=1, sandbox=rlimit_box)
    else:
        print(f"rlimit-only comparison left out: {_mem_available() / _MIB:.0f} MiB available, the uncapped "
              f"bomb would take {bomb_bytes / _MIB:.0f}", flush=True)
    contained: list[bool] = []
    drops: list[float] = []
    peaks: list[float] = []
    noise: list[float] = []
    rlimit_drops: list[float] = []
    for trial in range(trials):
        time.sleep(_SETTLE_SECONDS)
        start = time.perf_counter()
        rep = run_attack(verifier, bomb, bait, watch_host=True)
        took = time.perf_counter() - start
        # the kernel's peak may pass the cap by its per-CPU charge batches (64 pages per CPU): 1% allowed
        contained.append(rep.contained and rep.outcome == "memory"
                         and rep.cgroup_peak_bytes is not None and rep.cgroup_peak_bytes <= 1.01 * cap)
        drops.append(rep.host_drop_bytes / cap)
        peaks.append((rep.cgroup_peak_bytes or 0) / cap)
        line = (f"memory trial {trial + 1}/{trials}: bomb {rep.outcome} in {took:.1f}s, host drop {_drop(rep)} = "
                f"{drops[-1]:.3f} x cap"
                + (f", cgroup peak {rep.cgroup_peak_bytes / _MIB:.0f} MiB = {peaks[-1]:.3f} x cap"
                   if rep.cgroup_peak_bytes is not None else ", no cgroup"))
        time.sleep(_SETTLE_SECONDS)
        control = Attack("control", f"import time\ntime.sleep({max(0.1, took - 0.3):.2f})\nprint('idle')")
        ctl = run_attack(verifier, control, bait, watch_host=True)
        noise.append(ctl.host_drop_bytes / cap)
        line += f"; control as long: host drop {_drop(ctl)} = {noise[-1]:.3f} x cap"
        if rlimit_verifier is not None:
            time.sleep(_SETTLE_SECONDS)
            rl = run_attack(rlimit_verifier, bomb, bait, watch_host=True)
            rlimit_drops.append(rl.host_drop_bytes / cap)
            line += (f"; rlimits only: {rl.outcome}, {'contained' if rl.contained else 'ESCAPED'}, host drop "
                     f"{_drop(rl)} = {rlimit_drops[-1]:.3f} x cap")
        print(line, flush=True)
    verifier.close()
    if rlimit_verifier is not None:
        rlimit_verifier.close()
    return {"capped": float(all(contained)), "drop": statistics.median(drops), "drop_max": max(drops),
            "peak": max(peaks), "noise": statistics.median(noise),
            "rlimit_drop": statistics.median(rlimit_drops) if rlimit_drops else float("nan")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="parallel executions in both modes")
    ap.add_argument("--rounds", type=int, default=4, help="passes over the real solutions' tests per mode")
    ap.add_argument("--per-test-seconds", type=float, default=2.0, help="attack wall limit per execution")
    ap.add_argument("--memory-trials", type=int, default=7, help="memory bomb trials per containment")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the sandbox's containment line

    limits = SandboxLimits(memory_mb=512, processes=32, tmp_mb=32, stdout_bytes=1 << 20)
    sandbox = BubblewrapSandbox(limits)
    sandbox.check()
    mode = f"cgroup-v{sandbox.cgroups.version}" if sandbox.cgroups else "rlimits"
    verifier = CodeVerifier(per_test_seconds=args.per_test_seconds, total_seconds=4 * args.per_test_seconds,
                            workers=args.workers, sandbox=sandbox)
    contained = 0
    with HostBait() as bait:
        for attack in ATTACKS:
            report = run_attack(verifier, attack, bait)
            contained += report.contained
            _print_attack(report)
        memory = aggregate_memory(SandboxLimits(stdout_bytes=1 << 20), args.memory_trials, bait)

    problems = load_reasoning_problems(apps_solutions_path(), "apps").problems
    specs = [parse_tests(p.answer) for p in problems]
    results = verifier.grade([p.reference_solution for p in problems], specs)
    real_pass = sum(r is not None and r.reward == 1.0 for r in results)
    for p, r in zip(problems, results):
        print(f"solution {p.prompt_id:10s} {r.outcome} {r.passed}/{r.total}", flush=True)
    verifier.close()

    from rise_nemo.judges.code_verifier import extract_code

    jobs = [job for p, spec in zip(problems, specs)
            for job in CodeVerifier.programs(verifier, extract_code(p.reference_solution) or "", spec)]
    run_limits = SandboxLimits(wall_seconds=30.0, cpu_seconds=30, memory_mb=512, processes=32, tmp_mb=32)
    times = {"sandboxed": 0.0, "bare": 0.0}
    with SandboxPool(sandbox, workers=args.workers, max_pending=4 * args.workers) as pool, \
            ThreadPoolExecutor(args.workers) as bare_pool:
        for rnd in range(args.rounds):
            start = time.perf_counter()
            boxed = pool.map(jobs, run_limits)
            times["sandboxed"] += time.perf_counter() - start
            start = time.perf_counter()
            bare = list(bare_pool.map(lambda job: bare_python(job[0], job[1], run_limits, sandbox.python), jobs))
            times["bare"] += time.perf_counter() - start
            bad = [r.reason for r in boxed + bare if r.returncode != 0]
            if bad:
                raise SystemExit(f"bench/sandbox.py: an execution failed in round {rnd}: {bad[0]}")
            print(f"round {rnd + 1}/{args.rounds}: {len(jobs)} executions per mode, "
                  f"sandboxed {times['sandboxed']:.2f}s bare {times['bare']:.2f}s (cumulative)", flush=True)
    ratio = times["sandboxed"] / times["bare"]
    print(f"per execution: sandboxed {times['sandboxed'] / (len(jobs) * args.rounds) * 1000:.1f} ms, "
          f"bare {times['bare'] / (len(jobs) * args.rounds) * 1000:.1f} ms (wall over {args.workers} workers)")
    print(f"RESULT containment={contained / len(ATTACKS):g} attacks={len(ATTACKS)} "
          f"aggregate_memory_capped={int(memory['capped']) if sandbox.cgroups else 0} "
          f"host_drop_ratio={memory['drop']:.3f} overhead_ratio={ratio:.3f} "
          f"real_solutions_pass={real_pass}/{len(problems)} host_drop_ratio_max={memory['drop_max']:.3f} "
          f"cgroup_peak_ratio={memory['peak']:.3f} host_noise_ratio={memory['noise']:.3f} "
          f"rlimit_only_drop_ratio={memory['rlimit_drop']:.3f} "
          f"containment_mode={mode}")


if __name__ == "__main__":
    main()
