"""What every evaluation suite shares: items, the responses file, result files and the ``SCORE`` line.

A suite (one module of rise_nemo.evals, registered by name in ``rise_nemo.evals.SUITES``) turns a data file
in its benchmark's public format into ``EvalItem`` rows (index = 0-based row of the data file, the prompt
the model answers, the reference) and scores sampled responses::

    items = suite.load(path)                              # or suite.load(None): the shipped fixture rows
    samples = read_responses(responses_path, len(items))  # {index: [response, ...]}
    result = suite.score(items, samples, ctx)             # a SuiteResult

The responses file is JSONL, one row per sample: ``{"index": <0-based row of the data file>, "response":
"<text>"}``; several rows with one index are several samples of that problem. Every bad line is one
``UserError`` naming ``file:line`` and the key. Problems without any response are an error (naming them),
unless ``partial`` is set: then only the answered problems are scored and the result says how many
were left out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rise_nemo.core.metrics import pass_at_k
from rise_nemo.core.rubric import RubricError
from rise_nemo.data.loaders import iter_jsonl, iter_parquet
from rise_nemo.errors import UserError

__all__ = ["EvalItem", "ScoreContext", "SuiteResult", "Suite", "read_responses", "score_line",
           "write_result", "read_jsonl_rows", "load_rows", "packaged_data", "pass_table", "PairwiseSuite"]

PACKAGE_DATA = Path(__file__).parent / "data"


def packaged_data(name: str) -> Path:
    """A fixture file shipped in rise_nemo/evals/data (licences in its README.md)."""
    return PACKAGE_DATA / name


@dataclass(frozen=True)
class EvalItem:
    index: int  # 0-based row of the data file
    item_id: str
    messages: tuple[dict[str, str], ...]  # the prompt the model answers (chat messages)
    reference: Any  # the suite's reference (answer, letter, rubric, checklist, tests, ...)
    group: str | None = None  # breakdown key (difficulty, subject, level, domain)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ScoreContext:
    """What scoring may need besides items and responses."""

    judge: Any = None  # rise_nemo.evals.judge.EvalJudge for judged suites
    baseline: Mapping[int, list[str]] | None = None  # pairwise suites: the other model's responses
    seed: int = 0  # option shuffling and bootstrap
    bootstrap: int = 1000  # bootstrap resamples
    progress: Callable[[str], None] | None = None  # one line per unit of long work


@dataclass
class SuiteResult:
    suite: str
    n: int  # problems scored
    score: float  # the headline metric, in [0, 1]
    headline: str  # what ``score`` is (e.g. "pass@1", "clipped mean", "win rate")
    metrics: dict[str, Any] = field(default_factory=dict)  # the suite's other scalar figures
    breakdown: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> figures
    judge: dict[str, Any] | None = None  # {"type", "model", "prompt_version"} for judged suites
    per_item: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # data path, responses path, samples, seed, ...

    def to_json(self) -> dict[str, Any]:
        return {"suite": self.suite, "n": self.n, "score": self.score, "headline": self.headline,
                "metrics": self.metrics, "breakdown": self.breakdown, "judge": self.judge, "info": self.info,
                "per_item": self.per_item}

    def to_markdown(self) -> str:
        lines = [f"# {self.suite}", "", f"**{self.headline}: {_fmt(self.score)}** over {self.n} problems", ""]
        if self.judge:
            lines += [f"judge: {self.judge.get('type')} model `{self.judge.get('model')}`, prompt "
                      f"`{self.judge.get('prompt_version')}`", ""]
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in self.metrics.items()]
        if self.breakdown:
            cols = sorted({c for row in self.breakdown.values() for c in row})
            lines += ["", "| group | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
            for name, row in self.breakdown.items():
                lines.append(f"| {name} | " + " | ".join(_fmt(row.get(c)) for c in cols) + " |")
        return "\n".join(lines) + "\n"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    return str(v)


class Suite:
    """Base of the suites: ``name``, ``headline``, ``source`` (docs/evals.md), ``default_data`` (a packaged
    fixture), ``judged``; subclasses implement ``parse_row``, ``score`` and ``reference_response``."""

    name = ""
    headline = ""
    source = ""
    default_data: str | None = None
    judged = False
    needs_baseline = False
    seed = 0  # row-level randomness in prompts (multiple-choice option order); set before load()

    def check(self, judge_urls: Sequence[str] | None) -> None:
        """What scoring needs besides the judge (an extra, the code sandbox), checked before any response is
        generated or read: a one-line UserError (``judge_urls``: --judge-url, None = the rule judge)."""
        return None

    def load(self, path: str | Path | None) -> list[EvalItem]:
        if path is None:
            if self.default_data is None:
                raise UserError(f"suite {self.name}: no data ships with the package; give --data PATH")
            path = packaged_data(self.default_data)
        return [self.parse_row(row, where, i) for i, (where, row) in enumerate(load_rows(path))]

    def parse_row(self, row: Mapping[str, Any], where: str, index: int) -> EvalItem:
        raise NotImplementedError

    def score(self, items: Sequence[EvalItem], samples: Mapping[int, list[str]], ctx: ScoreContext) -> SuiteResult:
        raise NotImplementedError

    def reference_response(self, item: EvalItem) -> str:
        """A response that is exactly right (tests: scoring it must give the suite's maximum)."""
        raise NotImplementedError

    def read_baseline(self, path: str, items: Sequence[EvalItem], partial: bool) -> dict[int, list[str]]:
        """Pairwise suites: ``--baseline FILE`` (a responses JSONL)."""
        return read_responses(path, len(items), partial=partial, what="baseline responses")

    def default_baseline(self, items: Sequence[EvalItem]) -> dict[int, list[str]] | None:
        """Pairwise suites: the baseline answers the data file itself carries (None: --baseline needed)."""
        return None


def _ks(n_min: int) -> list[int]:
    ks, k = [], 1
    while k <= n_min:
        ks.append(k)
        k *= 2
    if ks and ks[-1] != n_min:
        ks.append(n_min)
    return ks


def pass_table(counts: Sequence[tuple[int, int]]) -> dict[str, float]:
    """(n_i samples, c_i correct) per problem -> ``avg@k`` (k = the samples per problem when all equal) and ``pass@k``."""
    n_min = min(n for n, _ in counts)
    out: dict[str, float] = {}
    for k in _ks(n_min):
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
    return out


class PairwiseSuite(Suite):
    """A suite judged by comparing each response with a baseline's (rise_nemo.evals.judge.judge_pairs)."""

    judged = True
    needs_baseline = True


# ---------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------


def read_jsonl_rows(path: Path) -> list[tuple[str, Any]]:
    """(``file:line``, parsed JSON) per non-empty line (rise_nemo.data.loaders.iter_jsonl); a line that cannot
    be used is a UserError naming file:line."""
    try:
        rows = []
        for lineno, row in iter_jsonl(path):
            if isinstance(row, RubricError):
                raise UserError(str(row))
            rows.append((f"{path}:{lineno}", row))
        return rows
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None


def load_rows(path: str | Path) -> list[tuple[str, Mapping[str, Any]]]:
    """The rows of a data file (JSONL, JSON list, CSV or parquet) as (``file:line``, dict)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: data file not found")
    if path.suffix == ".csv":
        import csv

        with path.open(newline="", encoding="utf-8") as fh:
            rows = [(f"{path}:{i + 2}", dict(r)) for i, r in enumerate(csv.DictReader(fh))]
    elif path.suffix == ".parquet":
        rows = []
        for rowno, row in iter_parquet(path):
            if isinstance(row, RubricError):
                raise UserError(str(row))
            rows.append((f"{path}:{rowno}", row))
    elif path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not a JSON file ({exc})") from None
        if not isinstance(data, list):
            raise UserError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
        rows = [(f"{path}:row {i}", r) for i, r in enumerate(data)]
    else:
        rows = read_jsonl_rows(path)
    for where, row in rows:
        if not isinstance(row, Mapping):
            raise UserError(f"{where}: expected a JSON object per row, got {type(row).__name__}")
    if not rows:
        raise UserError(f"{path}: no rows (the file is empty)")
    return rows


def require(row: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...] = str) -> Any:
    """``row[key]`` of type ``kind`` or a UserError naming file:line and the key."""
    if key not in row or row[key] is None:
        raise UserError(f"{where}: key {key!r}: missing")
    value = row[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise UserError(f"{where}: key {key!r}: expected {want}, got {type(value).__name__}")
    if isinstance(value, str) and not value.strip():
        raise UserError(f"{where}: key {key!r}: empty")
    return value


def read_responses(path: str | Path, n_items: int, *, partial: bool = False,
                   what: str = "responses") -> dict[int, list[str]]:
    """``{index: [response, ...]}`` from a responses JSONL (module docstring); every problem must have at
    least one response unless ``partial``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: {what} file not found")
    out: dict[int, list[str]] = {}
    for where, row in read_jsonl_rows(path):
        if not isinstance(row, Mapping):
            raise UserError(f"{where}: expected a JSON object {{\"index\": N, \"response\": TEXT}}, "
                            f"got {type(row).__name__}")
        index = require(row, "index", where, int)
        if not 0 <= index < n_items:
            raise UserError(f"{where}: key 'index': {index} is out of range (the data has {n_items} rows, "
                            f"0..{n_items - 1})")
        if "response" not in row or row["response"] is None:
            raise UserError(f"{where}: key 'response': missing")
        if not isinstance(row["response"], str):
            raise UserError(f"{where}: key 'response': expected text, got {type(row['response']).__name__}")
        out.setdefault(index, []).append(row["response"])
    if not out:
        raise UserError(f"{path}: no {what} (the file is empty)")
    missing = [i for i in range(n_items) if i not in out]
    if missing and not partial:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise UserError(f"{path}: {len(missing)} of {n_items} problems have no {what[:-1]} (index {shown}); "
                        "answer them all, or pass --partial to score only the answered ones")
    return out


def score_line(result: SuiteResult) -> str:
    """``SCORE suite=<name> n=<problems> score=<headline> key=value ...`` (the scalar figures)."""
    parts = [f"SCORE suite={result.suite}", f"n={result.n}", f"score={result.score:.4f}"]
    for k, v in result.metrics.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        parts.append(f"{k}={v}" if isinstance(v, int) else f"{k}={v:.4f}")
    if result.judge:
        parts.append(f"judge={result.judge.get('model')}")
        parts.append(f"judge_prompt={result.judge.get('prompt_version')}")
    return " ".join(parts)


def write_result(result: SuiteResult, out_dir: str | Path) -> tuple[Path, Path]:
    """``<out_dir>/<suite>.json`` and ``<out_dir>/<suite>.md`` (written atomically)."""
    import os

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for suffix, text in ((".json", json.dumps(result.to_json(), indent=1, ensure_ascii=False)),
                         (".md", result.to_markdown())):
        path = out / f"{result.suite}{suffix}"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        paths.append(path)
    return paths[0], paths[1]
