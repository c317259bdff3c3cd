"""LLM judge throughput: per-criterion vs batched mode vs a warm cache, side by side in one run.

A loopback OpenAI-compatible rule-grader server (rise_nemo.judges.rule_server, its own process) answers
every call after a fixed latency. 512 responses x 20 criteria are judged:
  1. per-criterion mode (one call per criterion),
  2. batched mode (chunks of <= batch_size criteria per call),
  3. per-criterion again with the cache warm from run 1.
The bound for a run is the time the calls need at the concurrency limit: calls x latency / concurrency.

Targets: batched calls <= 1/10 of per-criterion calls; throughput within 1.5x of the bound
(efficiency = bound / actual >= 0.67, the worse of the two modes is reported); a cached re-run makes 0 calls.

    .venv/bin/python bench/judge_throughput.py [--latency 0.2] [--concurrency 64] [--batch-size 10]

Last line: RESULT call_ratio=<batched/per-criterion calls> efficiency=<bound/actual> cached_calls=<n>
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's rise_nemo, wherever a venv's editable install points

from rise_nemo.core.rubric import Criterion, Rubric  # noqa: E402
from rise_nemo.data.samples import healthbench_sample_path  # noqa: E402
from rise_nemo.interfaces import JudgeRequest  # noqa: E402
from rise_nemo.judges.http import build_http_judge  # noqa: E402
from rise_nemo.judges.rule_server import rule_verdict  # noqa: E402


def load_pool(n_responses: int, n_criteria: int, seed: int = 0) -> list[JudgeRequest]:
    """Real HealthBench conversations and criteria (the sample shipped in rise_nemo.data.samples)."""
    rng = random.Random(seed)
    path = healthbench_sample_path()
    if path.exists():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        convs = [r["prompt"] for r in rows]
        crits = [Criterion(c["criterion"], float(c["points"])) for r in rows for c in r["rubrics"]]
    else:
        convs = [[{"role": "user", "content": f"Question {i} about leg cramps?"}] for i in range(50)]
        crits = [Criterion(f"Mentions keyword{i:03d}", 5.0 if i % 3 else -2.0) for i in range(500)]
    crits = list(dict.fromkeys(crits))  # distinct criteria, so no verdict is shared inside a rubric
    positive = [c for c in crits if c.weight > 0]
    requests = []
    for i in range(n_responses):
        chosen = rng.sample(crits, n_criteria)
        if not any(c.weight > 0 for c in chosen):  # a valid rubric needs positive points (eq. 3)
            chosen[0] = rng.choice([c for c in positive if c not in chosen])
        words = [max(c.text.split(), key=len) for c in chosen if rng.random() < 0.5]
        response = f"Response {i}: " + " ".join(words)  # distinct per i, so nothing is cached across responses
        requests.append(JudgeRequest(rng.choice(convs), response, Rubric(tuple(chosen)), prompt_id=str(i)))
    return requests


def start_server(latency: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rise_nemo.judges.rule_server", "--port", "0", "--latency", str(latency)],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line.startswith("READY"):
        proc.kill()
        raise SystemExit(f"rule server failed to start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}/v1"


def run(name, judge, requests, latency, concurrency, truth) -> dict:
    calls_before = judge.stats.calls
    t0 = time.perf_counter()
    got = judge.judge(requests)
    elapsed = time.perf_counter() - t0
    calls = judge.stats.calls - calls_before
    verdicts = sum(len(r.rubric) for r in requests)
    wrong = sum(g != w for gr, wr in zip(got, truth) for g, w in zip(gr, wr))
    bound = calls * latency / concurrency
    row = {"name": name, "calls": calls, "seconds": elapsed, "verdicts_per_s": verdicts / elapsed,
           "bound_s": bound, "efficiency": bound / elapsed if calls else float("nan"), "wrong_or_unknown": wrong}
    print(f"{name:<22} calls={calls:>6}  time={elapsed:7.2f}s  verdicts/s={row['verdicts_per_s']:9.0f}  "
          f"bound={bound:6.2f}s  efficiency={row['efficiency']:.3f}  wrong_or_unknown={wrong}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--responses", type=int, default=512)
    p.add_argument("--criteria", type=int, default=20)
    p.add_argument("--latency", type=float, default=0.2, help="server seconds per call")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=10)
    args = p.parse_args()

    requests = load_pool(args.responses, args.criteria)
    truth = [[rule_verdict(c.text, r.response) for c in r.rubric.criteria] for r in requests]
    print(f"{len(requests)} responses x {args.criteria} criteria; server latency {args.latency} s; "
          f"concurrency {args.concurrency}; batch size {args.batch_size}", flush=True)
    proc, url = start_server(args.latency)
    base = {"type": "http", "model": "rule-grader", "base_urls": [url], "max_concurrency": args.concurrency,
            "batch_size": args.batch_size, "timeout_s": 30.0, "backoff_base_s": 0.05}
    try:
        per = build_http_judge({**base, "mode": "per_criterion"})
        batched = build_http_judge({**base, "mode": "batched", "cache": False})
        rows = [
            run("per_criterion", per, requests, args.latency, args.concurrency, truth),
            run("batched", batched, requests, args.latency, args.concurrency, truth),
            run("per_criterion cached", per, requests, args.latency, args.concurrency, truth),
        ]
        per.close()
        batched.close()
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
    pc, bt, cached = rows
    if pc["wrong_or_unknown"] or bt["wrong_or_unknown"] or cached["wrong_or_unknown"]:
        print("WARNING: some verdicts were wrong or unknown", flush=True)
    call_ratio = bt["calls"] / pc["calls"]
    efficiency = min(pc["efficiency"], bt["efficiency"])
    print(f"targets: call_ratio<=0.1 {'ok' if call_ratio <= 0.1 else 'MISSED'}; "
          f"efficiency>=0.667 {'ok' if efficiency >= 1 / 1.5 else 'MISSED'}; "
          f"cached_calls==0 {'ok' if cached['calls'] == 0 else 'MISSED'}")
    print(f"RESULT call_ratio={call_ratio:.4f} efficiency={efficiency:.3f} cached_calls={cached['calls']}")


if __name__ == "__main__":
    main()
