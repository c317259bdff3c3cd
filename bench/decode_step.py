"""Decode micro-benchmark: the local generator's lean decode step against the HF forward step, in isolation.

One process, one torch thread, the model bench/trl_parity.py starts from (the embedded persistent task's
warm-started tiny Qwen3, built and cached as a local run builds it): a batch of ``--rows`` rows (its first 8
prompts x rows/8 samples, left-padded) decoded for up to ``--tokens`` new tokens at temperature 1, top-p 1, a
fixed sampling seed (rows stop at EOS as in training).
The two modes (``local.decode=hf`` / ``lean``) alternate round by round on the same engine, so both see the
same machine load; each round's process CPU time (time.process_time) is recorded. Every round checks that
both modes give the same samples and log-probs (the script fails otherwise).

Ends with exactly one line
    RESULT decode_cpu_ratio=<median lean/hf CPU time per round> lean_s=<median> hf_s=<median> rounds=<n>

Usage: python bench/decode_step.py [--rounds 15] [--rows 64] [--tokens 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--out", default="/tmp/rise_bench_decode_step")
    args = p.parse_args(argv)

    import torch

    from bench.trl_parity import config
    from rise_nemo.interfaces import SamplingParams
    from rise_nemo.loop.run import build_trainer

    torch.set_num_threads(1)
    tr = build_trainer(config(argparse.Namespace(overrides=[f"++local.generation_batch_size={args.rows}"]),
                              Path(args.out)))
    gen, eng = tr.generator, tr.policy.engine
    if not eng.lean_decode:
        raise SystemExit(f"decode_step: lean decode unsupported here ({eng.lean_unsupported})")
    prompts = [list(p.messages) for p in tr.sampler.prompts[:8]]
    per_prompt = max(1, args.rows // len(prompts))
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0, top_p=1.0, seed=1)
    times: dict[str, list[float]] = {"hf": [], "lean": []}
    for r in range(args.rounds + 1):  # round 0: warm-up, not timed
        outs = {}
        for mode in ("hf", "lean") if r % 2 == 0 else ("lean", "hf"):
            eng.lean_decode = mode == "lean"
            t0 = time.process_time()
            out = gen.generate(prompts, per_prompt, params)
            dt = time.process_time() - t0
            outs[mode] = [[(x.response_token_ids, x.sampling_logprobs) for x in g] for g in out]
            if r:
                times[mode].append(dt)
        if outs["hf"] != outs["lean"]:
            raise SystemExit(f"decode_step: round {r}: lean and hf samples differ")
        if r:
            print(f"round {r}: hf {times['hf'][-1]:.3f}s lean {times['lean'][-1]:.3f}s CPU", flush=True)
    lean, hf = statistics.median(times["lean"]), statistics.median(times["hf"])
    print(f"RESULT decode_cpu_ratio={lean / hf:.3f} lean_s={lean:.3f} hf_s={hf:.3f} rounds={args.rounds}")


if __name__ == "__main__":
    main()
