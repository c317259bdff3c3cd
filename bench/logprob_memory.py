"""Peak memory and time of chunked vs naive per-token log-probs (forward + backward), side by side.

Each variant runs in its own subprocess so that peak resident memory (Linux VmHWM, reset through
/proc/self/clear_refs after the inputs are built) belongs to that variant alone; tracemalloc cannot see
torch's allocations. "Peak extra" = peak RSS during forward+backward minus RSS with the inputs
(logits, ids, upstream gradient) already allocated, so the gradient of the logits counts for both.

    .venv/bin/python bench/logprob_memory.py                  # vocab 151,936, 4,096 tokens, bf16 logits
    .venv/bin/python bench/logprob_memory.py --tokens 512 --dtype float32

Target: chunked peak extra <= 1/4 of naive at <= 1.3x its time.
Last line: RESULT mem_ratio=<chunked/naive peak extra> time_ratio=<chunked/naive time>.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's rise_nemo (the variants' subprocesses put it first again)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


def _reset_peak() -> None:
    # Writing 5 resets VmHWM to the current RSS (Linux >= 4.0).
    Path("/proc/self/clear_refs").write_text("5")


def run_variant(
    variant: str, tokens: int, vocab: int, dtype: str, chunk: int, reps: int, threads: int
) -> dict:
    """Child process body: build inputs, then time forward+backward ``reps`` times, tracking peak RSS."""
    import torch

    sys.path.insert(0, str(REPO))
    from rise_nemo.core.logprobs import naive_token_logprobs, token_logprobs

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    b, t = 1, tokens
    logits = torch.randn(b, t, vocab, dtype=getattr(torch, dtype)).requires_grad_()
    ids = torch.randint(0, vocab, (b, t))
    upstream = torch.randn(b, t)

    def step() -> None:
        logits.grad = None
        out = (
            token_logprobs(logits, ids, chunk_size=chunk)
            if variant == "chunked"
            else naive_token_logprobs(logits, ids)
        )
        (out * upstream).sum().backward()

    base = _rss_kib("VmRSS")
    _reset_peak()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        logits.grad = None  # the gradient would go to the LM head; drop it between repetitions
    peak = _rss_kib("VmHWM")
    return {"variant": variant, "peak_extra_mib": (peak - base) / 1024, "time_s": min(times), "times": times}


def _spawn(args: argparse.Namespace, variant: str) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--tokens", str(args.tokens), "--vocab", str(args.vocab),
           "--dtype", args.dtype, "--chunk", str(args.chunk), "--reps", str(args.reps), "--threads", str(args.threads)]  # fmt: skip
    res = subprocess.run(
        cmd, capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    if res.returncode != 0:
        raise SystemExit(f"{variant} run failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--chunk", type=int, default=256, help="token positions per chunk")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions per variant (min is reported)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(
            json.dumps(
                run_variant(
                    args.child, args.tokens, args.vocab, args.dtype, args.chunk, args.reps, args.threads
                )
            )
        )
        return

    logits_mib = args.tokens * args.vocab * (2 if args.dtype == "bfloat16" else 4) / 2**20
    print(f"logits [1, {args.tokens}, {args.vocab}] {args.dtype} = {logits_mib:.0f} MiB; chunk {args.chunk}; "
          f"threads {args.threads}; forward+backward, best of {args.reps}", flush=True)  # fmt: skip
    results = {}
    for variant in ("naive", "chunked"):
        print(f"running {variant} ...", flush=True)
        results[variant] = r = _spawn(args, variant)
        print(f"  {variant:8s} peak extra {r['peak_extra_mib']:9.0f} MiB   time {r['time_s']:7.2f} s   "
              f"(runs: {', '.join(f'{x:.2f}' for x in r['times'])})", flush=True)  # fmt: skip
    mem_ratio = results["chunked"]["peak_extra_mib"] / results["naive"]["peak_extra_mib"]
    time_ratio = results["chunked"]["time_s"] / results["naive"]["time_s"]
    ok = mem_ratio <= 0.25 and time_ratio <= 1.3
    print(f"target: mem_ratio <= 0.25 and time_ratio <= 1.3 -> {'met' if ok else 'NOT met'}")
    print(f"RESULT mem_ratio={mem_ratio:.3f} time_ratio={time_ratio:.3f}")


if __name__ == "__main__":
    main()
