"""Code sandbox bench: containment of the attacks, real APPS solutions, and the sandbox's time overhead.

1. Every attack of rise_nemo.judges.sandbox_attacks (fork bomb, rm -rf of home and run dir, reading the API
   key / ~/.ssh / the run dir, sockets, 50 GB, 1 GB of output, daemons, ...) graded by CodeVerifier against
   temporary bait; contained = reward 0 with a reason, bait unchanged, no process left, grading still works.
2. The first human solution of each of the 5 shipped APPS problems (rise_nemo/data/samples,
   apps_solutions_5.jsonl) graded with the APPS preamble: how many pass.
3. Overhead: the same (program, stdin) executions (those of step 2, every test, ``--rounds`` times) run as
   sandboxes (one bubblewrap sandbox per execution) and as bare subprocesses of the same interpreter with
   the same rlimits, each on ``--workers`` threads; ratio = sandboxed wall time / bare wall time. The two
   modes alternate round by round so that load from other processes hits both alike.

Last line: RESULT containment=<contained/attacks> attacks=<n> overhead_ratio=<x> real_solutions_pass=<k>/5
Targets: containment=1 with attacks >= 14, real_solutions_pass=5/5, overhead_ratio <= 1.5.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rise_nemo.data.reasoning import load_reasoning_problems  # noqa: E402
from rise_nemo.data.samples import apps_solutions_path  # noqa: E402
from rise_nemo.judges.code_verifier import CodeVerifier, parse_tests  # noqa: E402
from rise_nemo.judges.sandbox import BubblewrapSandbox, SandboxLimits, SandboxPool, bare_python  # noqa: E402
from rise_nemo.judges.sandbox_attacks import ATTACKS, HostBait, run_attack  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="parallel executions in both modes")
    ap.add_argument("--rounds", type=int, default=4, help="passes over the real solutions' tests per mode")
    ap.add_argument("--per-test-seconds", type=float, default=2.0, help="attack wall limit per execution")
    args = ap.parse_args(argv)

    limits = SandboxLimits(memory_mb=512, processes=32, tmp_mb=32, stdout_bytes=1 << 20)
    sandbox = BubblewrapSandbox(limits)
    sandbox.check()
    verifier = CodeVerifier(per_test_seconds=args.per_test_seconds, total_seconds=4 * args.per_test_seconds,
                            workers=args.workers, sandbox=sandbox)

    contained = 0
    with HostBait() as bait:
        for attack in ATTACKS:
            report = run_attack(verifier, attack, bait)
            contained += report.contained
            print(f"attack {attack.name:18s} {'contained' if report.contained else 'ESCAPED'}  reward={report.reward:g} "
                  f"outcome={report.outcome} reason={report.reason!r}"
                  + (f" damage={list(report.damage)}" if report.damage else "")
                  + (f" leftover={list(report.leftover)}" if report.leftover else ""), flush=True)

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
    print(f"RESULT containment={contained / len(ATTACKS):g} attacks={len(ATTACKS)} overhead_ratio={ratio:.3f} "
          f"real_solutions_pass={real_pass}/{len(problems)}")


if __name__ == "__main__":
    main()
