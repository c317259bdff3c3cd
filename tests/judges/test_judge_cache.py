"""Verdict cache keys and the on-disk store."""

from __future__ import annotations

from rise_nemo.core.rubric import Criterion
from rise_nemo.judges.cache import VerdictCache, verdict_key

CONV = [{"role": "user", "content": "hi"}]
C = Criterion("Is polite", 2.0)


def test_key_changes_with_every_component():
    base = verdict_key("m", "v1", CONV, "resp", C)
    assert base == verdict_key("m", "v1", [{"role": "user", "content": "hi"}], "resp", Criterion("Is polite", 2))
    variants = [
        verdict_key("m2", "v1", CONV, "resp", C),
        verdict_key("m", "v2", CONV, "resp", C),
        verdict_key("m", "v1", [{"role": "user", "content": "hi!"}], "resp", C),
        verdict_key("m", "v1", [{"role": "system", "content": "hi"}], "resp", C),
        verdict_key("m", "v1", CONV, "resp ", C),
        verdict_key("m", "v1", CONV, "resp", Criterion("Is polite.", 2.0)),
        verdict_key("m", "v1", CONV, "resp", Criterion("Is polite", -2.0)),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_sqlite_store_survives_reopen(tmp_path):
    path = tmp_path / "sub" / "verdicts.sqlite"
    cache = VerdictCache(path)
    cache.put_many({"a": True, "b": False})
    assert cache.get("a") is True and cache.get("b") is False and cache.get("c") is None
    cache.close()
    again = VerdictCache(path)
    assert len(again) == 2 and again.get("a") is True and again.get("b") is False
    again.close()


def test_memory_only_cache():
    cache = VerdictCache()
    cache.put_many([("k", True)])
    assert cache.get("k") is True and cache.path is None


def test_stats_to_metrics_flattens_extra():
    from rise_nemo.interfaces import JudgeStats
    from rise_nemo.judges.stats import stats_to_metrics

    m = stats_to_metrics(JudgeStats(calls=3, cache_hits=2, unknown_verdicts=1, failures=4, extra={"retries": 5}))
    assert m == {"judge/calls": 3.0, "judge/cache_hits": 2.0, "judge/unknown_verdicts": 1.0,
                 "judge/failures": 4.0, "judge/retries": 5.0}
