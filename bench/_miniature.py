"""What the decisive miniatures share (bench/embedded_rrl.py, bench/embedded_exprl.py, bench/embedded_methods.py):
a seed's own problems, per-problem scoring on an evaluation stream, process CPU time, and the comparison
fields of a RESULT line (rise_nemo.core.comparison).

Every comparison is paired by seed: both arms of a seed start from the same warm start, train on the seed's
own problems and are evaluated on the seed's own held-out problems with the same sampling seed, so the
intervals of rise_nemo.core.comparison resample seeds, then problems within a seed.
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from typing import Any


def cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children: the budget a bench states (on a
    shared machine wall time counts other jobs too)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def seed_problems(task: Any, seed: int, train_levels: Sequence[int], train_per_level: int, heldout_level: int,
                  heldout_count: int) -> tuple[list, list]:
    """(training problems, held-out problems) of ``seed``: ``train_per_level`` fresh problems per training level
    and ``heldout_count`` fresh problems of ``heldout_level``, each from the seed's own stream
    (rise_nemo.data.chain_task.fresh_problems; held-out ones only where the warm start cannot have met them)."""
    from rise_nemo.data.chain_task import fresh_problems, problem_chain

    heldout = fresh_problems(task, f"heldout-s{seed}", heldout_level, heldout_count, heldout=True)
    keys = {problem_chain(p).key for p in heldout}
    train = [p for level in train_levels
             for p in fresh_problems(task, f"train-s{seed}", level, train_per_level, exclude=keys)]
    return train, heldout


def sample_texts(cfg: Any, generator: Any, problems: Sequence[Any], n: int, step: int = 0,
                 prefixes: Sequence[Sequence[int]] | None = None) -> list[list[str]]:
    """``n`` responses per problem on the evaluation stream of ``step`` (the trainer's evaluation sampling
    parameters; global RNG states untouched), continuing ``prefixes`` (token ids) when given."""
    from rise_nemo.steps.rollouts import eval_sampling_params, preserved_rng

    with preserved_rng():
        groups = generator.generate([list(p.messages) for p in problems], n, eval_sampling_params(cfg, step),
                                    prefixes=None if prefixes is None else [list(x) for x in prefixes])
    return [[r.response_text for r in g] for g in groups]


def score_texts(problems: Sequence[Any], groups: Sequence[Sequence[str]]) -> list[dict[str, int]]:
    """Per problem: the number of responses, of right answers (the task's verifier) and of exact solutions
    (every step right, rise_nemo.data.chain_task.exact_solution)."""
    from rise_nemo.data.chain_task import RuleArithmeticVerifier, exact_solution

    out = []
    for p, texts in zip(problems, groups):
        answer = RuleArithmeticVerifier().verify([p] * len(texts), list(texts))
        out.append({"n": len(texts), "answer": sum(bool(v) for v in answer),
                    "exact": sum(exact_solution(p, t) for t in texts)})
    return out


def score_samples(cfg: Any, generator: Any, problems: Sequence[Any], n: int, step: int = 0,
                  prefixes: Sequence[Sequence[int]] | None = None) -> list[dict[str, int]]:
    """``score_texts`` of ``sample_texts``."""
    return score_texts(problems, sample_texts(cfg, generator, problems, n, step, prefixes))


def counts(per_seed: Sequence[Sequence[dict[str, int]]], key: str) -> list[list[int]]:
    """[seeds][problems] of one field of ``score_samples`` results."""
    return [[p[key] for p in problems] for problems in per_seed]


def rate(per_seed: Sequence[Sequence[dict[str, int]]], key: str) -> float:
    """A field's pooled rate over every seed and problem."""
    hits = sum(p[key] for problems in per_seed for p in problems)
    total = sum(p["n"] for problems in per_seed for p in problems)
    return hits / total if total else float("nan")


def any_correct(per_seed: Sequence[Sequence[dict[str, int]]], key: str) -> list[list[int]]:
    """[seeds][problems] 0/1: whether any of a problem's samples is correct (pass@n with n = its samples)."""
    return [[int(p[key] > 0) for p in problems] for problems in per_seed]


def resumable(directory: str | None, name: str, spec: dict, compute) -> dict:
    """``compute()`` (a JSON-able dict of one seed's measurements) with its CPU time as ``cpu_s``; with a
    ``directory`` (--resume-dir) it is saved there as ``name``.json, and a saved result of the same ``spec``
    (everything the measurements depend on) is returned instead, marked ``reused``: an interrupted bench
    restarts where it stopped."""
    import json
    import time
    from pathlib import Path

    path = Path(directory) / f"{name}.json" if directory else None
    if path is not None and path.exists():
        saved = json.loads(path.read_text())
        if saved.get("spec") == spec:
            return {**saved["result"], "reused": True}
    c = cpu_seconds()
    result = {**compute(), "cpu_s": 0.0, "measured_at": time.time()}
    result["cpu_s"] = cpu_seconds() - c
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"spec": spec, "result": result}))
    return result


def run_workers(script: str, argv: list[str], seeds: list[int], workers: int, extra: list[str]) -> None:
    """Measure ``seeds`` in ``workers`` subprocesses of ``script`` (``--workers`` of the benches): each runs the
    bench's own command line with its share of the seeds, ``--measure-only`` and ``extra`` (the flags that make it
    save each seed's measurements: ``--resume-dir D`` / ``--resume``), trains and prints no RESULT line; the
    caller then reads its seeds back from those files. The children's CPU time counts in the caller's ``cpu_seconds`` once they are waited
    for (a seed's saved ``measured_at`` tells a caller which seeds an earlier invocation measured). Raises if a
    worker fails."""
    import subprocess
    import sys

    drop = {"--workers", "--seeds"}
    rest, skip = [], False
    for tok in argv:
        if tok in drop:
            skip = True
            continue
        if skip and (tok.startswith("-") or "=" in tok):
            skip = False
        if not skip:
            rest.append(tok)
    chunks = [seeds[i::workers] for i in range(workers) if seeds[i::workers]]
    procs = [subprocess.Popen([sys.executable, script, *rest, "--seeds", *map(str, chunk), "--workers", "1",
                               "--measure-only", *extra]) for chunk in chunks]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"--workers: a worker failed (exit codes {codes}); its seeds' logs are above")
