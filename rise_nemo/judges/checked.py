"""A judge built for a run or an evaluation with every check first: the block, the 'judge' extra an LLM judge
needs, its API key variable and (bounded) probes of its URLs, each failure one line naming the key, before
any model or actor starts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rise_nemo.errors import UserError, require_extra
from rise_nemo.judges import build_judge
from rise_nemo.judges.reference import build_reference_judge


def build_checked_judge(judge_cfg: Any, probe: bool = True, reference: bool = False) -> Any:
    """``build_judge`` of a recipe's ``judge:`` block with its config errors as one-line ``UserError``s; HTTP
    judges are probed. ``reference``: ExpRL's reference judge (rise_nemo.judges.reference) from the same block."""
    kind = judge_cfg.get("type") if isinstance(judge_cfg, Mapping) else None
    judge_errors: tuple[type[Exception], ...] = (ValueError,)
    if kind == "http":  # only the LLM judge needs the 'judge' extra (aiohttp): the rule judge runs without it
        require_extra("judge", "aiohttp", what="the LLM judge (judge.type: http)")
        if judge_cfg.get("ray_actor"):
            require_extra("judge", "ray", what="the judge's Ray actor (judge.ray_actor: true)")
        from rise_nemo.judges.client import JudgeError

        judge_errors += (JudgeError,)
    try:
        if kind == "http":  # validate the block and the key's variable, then probe, before any actor starts
            from rise_nemo.judges.http import HttpJudgeConfig

            HttpJudgeConfig.from_mapping(judge_cfg).api_key()
            if probe:
                from rise_nemo.judges.probe import probe_judge_urls

                probe_judge_urls(judge_cfg)
        return build_reference_judge(judge_cfg) if reference else build_judge(judge_cfg)
    except judge_errors as exc:
        if isinstance(exc, UserError):
            raise
        message = str(exc)
        raise UserError(message if "judge" in message else f"config block 'judge': {message}") from None
