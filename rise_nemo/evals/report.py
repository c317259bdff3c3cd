"""Several models side by side on the benchmark suites (`rise-nemo report`): one row per model (a run
directory's ``eval/suites/``, or a folder that `rise-nemo score` / `eval --suite` wrote), one column per
suite holding its headline score, with the judge and prompt version of every judged column below."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rise_nemo.errors import UserError

__all__ = ["suite_results_dir", "load_suite_results", "suites_markdown"]


def suite_results_dir(path: str | Path) -> Path | None:
    """Where ``path``'s suite results are: ``<path>/eval/suites`` or ``<path>`` itself; None if neither."""
    path = Path(path)
    for d in (path / "eval" / "suites", path):
        if d.is_dir() and any(_is_result(p) for p in d.glob("*.json")):
            return d
    return None


def _is_result(p: Path) -> bool:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"suite", "n", "score", "headline"} <= set(data)


def load_suite_results(path: str | Path) -> dict[str, dict[str, Any]]:
    """suite name -> saved result (rise_nemo.evals.base.SuiteResult.to_json) of one model's folder."""
    d = suite_results_dir(path)
    if d is None:
        raise UserError(f"{path}: no suite results (no <suite>.json in it or in its eval/suites)")
    out = {}
    for p in sorted(d.glob("*.json")):
        if _is_result(p):
            data = json.loads(p.read_text(encoding="utf-8"))
            out[data["suite"]] = data
    return out


def suites_markdown(folders: list[str | Path]) -> str:
    """The side-by-side table of the folders that have suite results ("" when none has)."""
    models = [(Path(f), load_suite_results(f)) for f in folders if suite_results_dir(f) is not None]
    if not models:
        return ""
    suites = sorted({s for _, r in models for s in r})
    lines = ["## Benchmark suites", "", "| model | " + " | ".join(suites) + " |", "|---|" + "---|" * len(suites)]
    for path, results in models:
        cells = []
        for s in suites:
            r = results.get(s)
            cells.append("-" if r is None else f"{100 * r['score']:.1f} (n={r['n']})")
        lines.append(f"| {path.name or path} | " + " | ".join(cells) + " |")
    lines += ["", "Headline per suite: " + "; ".join(
        f"{s}: {next(r[s]['headline'] for _, r in models if s in r)}" for s in suites) + "."]
    judged = sorted({(s, json.dumps(r[s]["judge"], sort_keys=True)) for _, r in models for s in r if r[s].get("judge")})
    for s, j in judged:
        judge = json.loads(j)
        lines.append(f"- {s}: judge {judge.get('type')} `{judge.get('model')}`, prompt `{judge.get('prompt_version')}`")
    return "\n".join(lines) + "\n"
