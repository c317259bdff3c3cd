"""Judge counters as flat metrics (no network imports, so the embedded path can use it with RuleJudge)."""

from __future__ import annotations

from rise_nemo.interfaces import JudgeStats


def stats_to_metrics(stats: JudgeStats, prefix: str = "judge/") -> dict[str, float]:
    """``{"judge/calls": ..., "judge/cache_hits": ..., "judge/unknown_verdicts": ..., "judge/failures": ...,
    "judge/<extra key>": ...}`` — cumulative counters, for one line of metrics.jsonl."""
    out = {
        f"{prefix}calls": float(stats.calls),
        f"{prefix}cache_hits": float(stats.cache_hits),
        f"{prefix}unknown_verdicts": float(stats.unknown_verdicts),
        f"{prefix}failures": float(stats.failures),
    }
    out.update({f"{prefix}{k}": float(v) for k, v in stats.extra.items()})
    return out
