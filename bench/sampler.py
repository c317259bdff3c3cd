"""Sampler micro-benchmark: the local generator's inverse-CDF sampler against ``torch.multinomial``, side by side.

One process, one torch thread. For each shape (rows x vocabulary: the embedded task's 128 x 330 and a Qwen-sized
64 x 151,936) the two samplers draw one token per row from the same log-probs (a softmax of random logits at
temperature 1, so the mass is spread as in sampling, not on one token), alternating round by round; each
round's process CPU time is recorded. A check that both draw the same distribution runs first: 200,000 rows of
a fixed 6-token distribution per sampler, every frequency within 5 standard errors of its probability.

Ends with exactly one line
    RESULT small_ratio=<median inverse-CDF / multinomial CPU time, 128 x 330> small_ms=<inverse-CDF ms per draw>
           large_ratio=<same, 64 x 151936> large_ms=<...> rounds=<n> distribution_ok=<0|1>

Usage: python bench/sampler.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPES = {"small": (128, 330), "large": (64, 151_936)}


def _multinomial(logp, rng):
    import torch

    return torch.multinomial(logp.exp(), 1, generator=rng).squeeze(1)


def distribution_ok(samplers: dict) -> bool:
    import torch

    probs = torch.tensor([0.0, 0.5, 0.2, 0.0, 0.3, 0.0], dtype=torch.float64)
    logp = probs.log().float()[None].expand(200_000, -1)
    ok = True
    for name, sample in samplers.items():
        draws = sample(logp, torch.Generator().manual_seed(0))
        freq = torch.bincount(draws, minlength=6).double() / draws.numel()
        within = bool(torch.all((freq - probs).abs() <= 5 * (probs * (1 - probs) / draws.numel()).sqrt()))
        print(f"{name:>11}: frequencies {[round(float(f), 4) for f in freq]} (probabilities "
              f"{probs.tolist()}) {'ok' if within else 'OFF'}")
        ok = ok and within
    return ok


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args(argv)

    import torch

    from rise_nemo.backends.local.generator import inverse_cdf_sample

    torch.set_num_threads(1)
    samplers = {"inverse_cdf": inverse_cdf_sample, "multinomial": _multinomial}
    ok = distribution_ok(samplers)
    fields = {}
    for label, (rows, vocab) in SHAPES.items():
        logp = torch.log_softmax(torch.randn(rows, vocab, generator=torch.Generator().manual_seed(1)) * 2, -1)
        reps = max(1, 2_000_000 // (rows * vocab))  # draws per timed round: rounds of ~equal work across shapes
        times: dict[str, list[float]] = {n: [] for n in samplers}
        for r in range(args.rounds + 1):  # round 0: warm-up, not timed
            for name in samplers if r % 2 == 0 else reversed(list(samplers)):
                rng = torch.Generator().manual_seed(r)
                t0 = time.process_time()
                for _ in range(reps):
                    samplers[name](logp, rng)
                if r:
                    times[name].append((time.process_time() - t0) / reps)
        med = {n: statistics.median(t) for n, t in times.items()}
        ratio = statistics.median(a / b for a, b in zip(times["inverse_cdf"], times["multinomial"]))
        print(f"{label} ({rows} rows x {vocab} tokens): inverse-CDF {med['inverse_cdf'] * 1e3:.3f} ms, "
              f"multinomial {med['multinomial'] * 1e3:.3f} ms per draw of every row; ratio {ratio:.3f}")
        fields[f"{label}_ratio"] = f"{ratio:.3f}"
        fields[f"{label}_ms"] = f"{med['inverse_cdf'] * 1e3:.3f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in fields.items())
          + f" rounds={args.rounds} distribution_ok={int(ok)}")


if __name__ == "__main__":
    main()
