"""Judge factory: ``build_judge(judge_cfg) -> Judge`` dispatching on ``judge_cfg.type``.

- ``rule``: ``rise_nemo.judges.rule.RuleJudge`` (machine checks carried by the criteria; embedded default).
- ``http``: ``rise_nemo.judges.http.build_http_judge(judge_cfg)`` (OpenAI-compatible LLM judge), imported
  lazily so the embedded path never needs aiohttp/Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rise_nemo.interfaces import Judge

JUDGE_TYPES = ("rule", "http")


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


def build_judge(judge_cfg: Any) -> Judge:
    kind = _get(judge_cfg, "type")
    if kind == "rule":
        from rise_nemo.judges.rule import RuleJudge

        extra = sorted(k for k in (judge_cfg or {}) if k != "type")
        if extra:
            raise ValueError(f"config block 'judge': type rule takes no other keys, got {extra}")
        return RuleJudge()
    if kind == "http":
        from rise_nemo.judges.http import build_http_judge

        return build_http_judge(judge_cfg)
    raise ValueError(f"config key 'judge.type': unknown judge {kind!r}; expected one of {list(JUDGE_TYPES)}")
