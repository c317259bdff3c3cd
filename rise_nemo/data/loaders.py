"""Rubric dataset loaders: one entry point, ``load_rubric_prompts``, for four row formats.

Formats (``fmt``; "auto" detects the format of every record from its keys):
  healthbench  ``prompt`` [messages], ``rubrics`` [{criterion, points, tags}], optional ``prompt_id``
               (rise_nemo/data/samples/healthbench_sample.jsonl)
  rubrichub    RubricHub / verl rows: ``prompt`` [messages] + ``Rubrics`` or ``reward_model.rubrics``
               [{criterion, points, tags}] (``reward_model`` may be a JSON string), JSONL or parquet
  rar          Rubrics-as-Rewards rows: ``question`` (str), ``rubric`` [{description, title, weight}],
               optional ``reference_answer``
  rise         our own JSONL: ``prompt_id``, ``messages``, ``rubric`` [{criterion, points, tags,
               check: {kind, value}}], optional ``reference`` and ``meta``

Files: ``.parquet`` (needs pyarrow: ``pip install rise_nemo[data]``) or JSON Lines (anything else).
Record positions are 1-based: the line number in a JSONL file, the row number in a parquet file; every
error names ``file:line`` and the offending key. Bad records raise ``RubricError``; with
``skip_invalid=True`` they are skipped and returned, with the reason, in ``LoadedPrompts.skipped``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric, RubricError, RubricPrompt

__all__ = ["load_rubric_prompts", "LoadedPrompts", "Skipped", "FORMATS", "parse_record", "read_records", "iter_jsonl",
           "iter_parquet"]

log = logging.getLogger(__name__)

FORMATS = ("auto", "healthbench", "rubrichub", "rar", "rise")
_ROLES = ("system", "user", "assistant")


class Skipped(NamedTuple):
    where: str  # "file:line"
    reason: str


class LoadedPrompts(NamedTuple):
    prompts: list[RubricPrompt]
    skipped: list[Skipped]


# -- reading rows ----------------------------------------------------------------------------------------


def _decode_json(text: str) -> Any:
    """``json.loads`` whose every failure is a ValueError with a one-line reason (no file position).

    Besides malformed JSON: nesting too deep for the parser (RecursionError) and text that is not valid
    Unicode (a lone UTF-16 surrogate such as ``"\\ud800"`` decodes to a str that cannot be encoded later,
    in the judge request or the tokenizer, far from the file).
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        # exc.msg may itself end in "at" ("Unterminated string starting at"): say the position separately.
        raise ValueError(f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone UTF-16 surrogate ({ascii(exc.object[exc.start:exc.end])}), "
                         "which is not valid Unicode text") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None
    return obj


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any | RubricError]]:
    """(line number, parsed object or the RubricError describing why the line cannot be used); blank lines
    skipped. Lines end at "\\n" only (some benchmark prompts hold U+2028 / U+2029). The one JSONL reader of
    the project (the evals read through it too: rise_nemo.evals.base.read_jsonl_rows)."""
    with path.open("rb") as fh:  # bytes: one undecodable line must not end the whole file
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield lineno, RubricError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at "
                                          f"column {exc.start + 1})")
                continue
            if not line.strip():
                continue
            try:
                yield lineno, _decode_json(line.rstrip("\r\n"))
            except ValueError as exc:
                yield lineno, RubricError(f"{path}:{lineno}: {exc}")


def iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    """(row number, row dict); an unreadable file or row batch (empty, truncated, not parquet) is yielded
    once as a RubricError at the first row it covers, and reading stops there."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # optional dependency
        raise RubricError(f"{path}: reading parquet needs pyarrow (pip install 'rise_nemo[data]')") from exc
    rowno = 0
    try:
        # Row batches keep a large dataset from being converted to Python objects all at once.
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                rowno += 1
                yield rowno, row
    except (pa.ArrowException, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        yield rowno + 1, RubricError(f"{path}:{rowno + 1}: unreadable parquet from this row on "
                                     f"(empty or truncated file?): {reason}")


# -- field parsing ---------------------------------------------------------------------------------------


def _err(where: str, key: str, msg: str) -> RubricError:
    return RubricError(f"{where}: key {key!r}: {msg}")


def _parse_messages(raw: Any, where: str, key: str) -> tuple[dict[str, str], ...]:
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list | tuple) or not raw:
        raise _err(where, key, f"expected a non-empty list of chat messages, got {type(raw).__name__}")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping):
            raise _err(where, f"{key}[{i}]", f"expected a message object, got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise _err(where, f"{key}[{i}].role", f"expected one of {_ROLES}, got {role!r}")
        if not isinstance(content, str):
            raise _err(where, f"{key}[{i}].content", f"expected a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise _err(where, key, f"the last message must be the user's, got {out[-1]['role']!r}")
    return tuple(out)


def _parse_tags(raw: Any, where: str, key: str) -> tuple[str, ...]:
    """Tags as strings; a dict {axis: accuracy} becomes ("axis:accuracy",) like the HealthBench sample."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, Mapping):
        return tuple(f"{k}:{v}" for k, v in raw.items() if v is not None)
    if isinstance(raw, list | tuple):
        return tuple(str(t) for t in raw)
    raise _err(where, key, f"expected a list of tags, got {type(raw).__name__}")


def _parse_points(raw: Any, where: str, key: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise _err(where, key, f"points must be a number, got {raw!r}")
    try:
        value = float(raw)  # a JSON integer may be too large for a float (OverflowError)
    except OverflowError:
        raise _err(where, key, f"points must be finite, got an integer of {len(str(abs(raw)))} digits") from None
    if not math.isfinite(value):
        raise _err(where, key, f"points must be finite, got {raw!r}")
    return value


def _parse_check(raw: Any, where: str, key: str) -> MachineCheck | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or "kind" not in raw or "value" not in raw:
        raise _err(where, key, "expected {kind, value}")
    try:
        return MachineCheck(raw["kind"], str(raw["value"]))
    except RubricError as exc:
        raise _err(where, key, str(exc)) from None


def _parse_criteria(
    raw: Any,
    where: str,
    key: str,
    text_key: str,
    points_key: str,
    tags_key: str,
    check_key: str | None = None,
) -> Rubric:
    if not isinstance(raw, list | tuple) or not raw:
        raise _err(where, key, "expected a non-empty list of criteria")
    criteria = []
    for k, c in enumerate(raw):
        ck = f"{key}[{k}]"
        if not isinstance(c, Mapping):
            raise _err(where, ck, f"expected a criterion object, got {type(c).__name__}")
        text = c.get(text_key)
        if not isinstance(text, str) or not text.strip():
            raise _err(where, f"{ck}.{text_key}", "criterion text is missing or empty")
        if points_key not in c:
            raise _err(where, f"{ck}.{points_key}", "missing")
        points = _parse_points(c[points_key], where, f"{ck}.{points_key}")
        tags = _parse_tags(c.get(tags_key), where, f"{ck}.{tags_key}")
        check = _parse_check(c.get(check_key), where, f"{ck}.{check_key}") if check_key else None
        criteria.append(Criterion(text.strip(), points, tags, check))
    rubric = Rubric(tuple(criteria))
    if rubric.positive_total <= 0:
        raise _err(where, key, "no criterion has positive points (eq. 3 undefined)")
    return rubric.validate(f"{where}: key {key!r}")


def _require(row: Mapping, key: str, where: str) -> Any:
    if key not in row or row[key] is None:
        raise _err(where, key, "missing")
    return row[key]


def _require_text(row: Mapping, key: str, where: str) -> str:
    value = _require(row, key, where)
    if not isinstance(value, str) or not value.strip():
        raise _err(where, key, f"expected a non-empty string, got {value!r}"[:200])
    return value


def _prompt_id(row: Mapping, keys: tuple[str, ...], default: str) -> str:
    for k in keys:
        v = row.get(k)
        if v is not None and str(v) != "":
            return str(v)
    return default


# -- per-format records ----------------------------------------------------------------------------------


def _healthbench(row: Mapping, where: str, default_id: str) -> RubricPrompt:
    messages = _parse_messages(_require(row, "prompt", where), where, "prompt")
    rubric = _parse_criteria(_require(row, "rubrics", where), where, "rubrics", "criterion", "points", "tags")
    pid = _prompt_id(row, ("prompt_id", "id"), default_id)
    return RubricPrompt(pid, messages, rubric, source=where, meta={"format": "healthbench"})


def _rubrichub_rubrics(row: Mapping, where: str) -> tuple[Any, str]:
    if row.get("Rubrics") is not None:
        return row["Rubrics"], "Rubrics"
    rm = row.get("reward_model")
    if isinstance(rm, str):
        try:
            rm = _decode_json(rm)
        except ValueError as exc:
            raise _err(where, "reward_model", f"is a string but not usable JSON ({exc})") from None
    if isinstance(rm, Mapping) and rm.get("rubrics") is not None:
        rubrics = rm["rubrics"]
        if isinstance(rubrics, str):
            try:
                rubrics = _decode_json(rubrics)
            except ValueError as exc:
                raise _err(where, "reward_model.rubrics", f"is a string but not usable JSON ({exc})") from None
        return rubrics, "reward_model.rubrics"
    raise _err(where, "Rubrics", "missing (neither 'Rubrics' nor 'reward_model.rubrics' is present)")


def _rubrichub(row: Mapping, where: str, default_id: str) -> RubricPrompt:
    messages = _parse_messages(_require(row, "prompt", where), where, "prompt")
    raw, key = _rubrichub_rubrics(row, where)
    rubric = _parse_criteria(raw, where, key, "criterion", "points", "tags")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    pid = _prompt_id(row, ("prompt_id", "id", "uid"), "")
    if not pid and extra.get("index") is not None:
        pid = f"{row.get('data_source') or 'rubrichub'}-{extra['index']}"
    meta = {"format": "rubrichub", "data_source": row.get("data_source")}
    return RubricPrompt(pid or default_id, messages, rubric, source=where, meta=meta)


def _rar(row: Mapping, where: str, default_id: str) -> RubricPrompt:
    question = _require(row, "question", where)
    if not isinstance(question, str) or not question.strip():
        raise _err(where, "question", "expected a non-empty string")
    rubric = _parse_criteria(
        _require(row, "rubric", where), where, "rubric", "description", "weight", "title"
    )
    # RaR titles ("Essential Criteria: ...") are kept as a "title:..." tag.
    rubric = Rubric(
        tuple(Criterion(c.text, c.weight, tuple(f"title:{t}" for t in c.tags)) for c in rubric.criteria)
    )
    ref = row.get("reference_answer")
    pid = _prompt_id(row, ("prompt_id", "id", "question_id"), default_id)
    return RubricPrompt(
        pid,
        ({"role": "user", "content": question},),
        rubric,
        reference=ref if isinstance(ref, str) else None,
        source=where,
        meta={"format": "rar"},
    )


def _rise(row: Mapping, where: str, default_id: str) -> RubricPrompt:
    pid = _require(row, "prompt_id", where)
    if not isinstance(pid, str | int) or str(pid) == "":
        raise _err(where, "prompt_id", f"expected a non-empty string, got {pid!r}")
    messages = _parse_messages(_require(row, "messages", where), where, "messages")
    rubric = _parse_criteria(
        _require(row, "rubric", where), where, "rubric", "criterion", "points", "tags", "check"
    )
    ref = row.get("reference")
    if ref is not None and not isinstance(ref, str):
        raise _err(where, "reference", f"expected a string, got {type(ref).__name__}")
    meta = row.get("meta") or {}
    if not isinstance(meta, Mapping):
        raise _err(where, "meta", f"expected an object, got {type(meta).__name__}")
    return RubricPrompt(
        str(pid), messages, rubric, reference=ref, source=where, meta={"format": "rise", **meta}
    )


_PARSERS = {"healthbench": _healthbench, "rubrichub": _rubrichub, "rar": _rar, "rise": _rise}


def detect_format(row: Mapping, where: str) -> str:
    """Which format a record is in, from its keys (see the module docstring)."""
    if "rubrics" in row and "prompt" in row:
        return "healthbench"
    if "prompt" in row and ("Rubrics" in row or "reward_model" in row):
        return "rubrichub"
    if "question" in row and "rubric" in row:
        return "rar"
    if "messages" in row and "rubric" in row:
        return "rise"
    raise RubricError(
        f"{where}: cannot tell the record's format from its keys {sorted(row)[:12]}; expected "
        "healthbench (prompt, rubrics), rubrichub (prompt, Rubrics | reward_model.rubrics), "
        "rar (question, rubric) or rise (prompt_id, messages, rubric)"
    )


def parse_record(row: Any, where: str, fmt: str = "auto", default_id: str = "") -> RubricPrompt:
    """One record -> RubricPrompt, or RubricError naming ``where`` and the key."""
    if not isinstance(row, Mapping):
        raise RubricError(f"{where}: expected a JSON object per record, got {type(row).__name__}")
    kind = detect_format(row, where) if fmt == "auto" else fmt
    return _PARSERS[kind](row, where, default_id or where)


def read_records(
    path: str | Path, parse: Callable[[Any, str, str], Any], skip_invalid: bool, what: str
) -> tuple[list[Any], list[Skipped]]:
    """The loading loop every dataset loader shares: JSONL or parquet rows -> ``parse(row, where, default_id)``.

    ``where`` is ``file:line``; ``default_id`` is ``<file stem>-<line>`` for rows without an id. Parsed items
    must carry a ``prompt_id``, unique in the file. A bad row raises its RubricError, or with
    ``skip_invalid`` is skipped and listed (file:line, reason) in the second return value.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} data file not found: {path}")
    rows = iter_parquet(path) if path.suffix == ".parquet" else iter_jsonl(path)
    items: list[Any] = []
    skipped: list[Skipped] = []
    seen: dict[str, str] = {}
    for lineno, row in rows:
        where = f"{path}:{lineno}"
        try:
            if isinstance(row, RubricError):
                raise row
            item = parse(row, where, f"{path.stem}-{lineno}")
            if item.prompt_id in seen:
                raise _err(
                    where,
                    "prompt_id",
                    f"duplicate id {item.prompt_id!r} (first at {seen[item.prompt_id]})",
                )
        except RubricError as exc:
            if not skip_invalid:
                raise
            skipped.append(Skipped(where, str(exc)))
            continue
        seen[item.prompt_id] = where
        items.append(item)
    if not items and not skipped:
        raise RubricError(f"{path}: no records (the file is empty)")
    if skipped:
        log.warning("%s: skipped %d invalid record(s); first: %s", path, len(skipped), skipped[0].reason)
    log.info("loaded %d %s from %s", len(items), what, path)
    return items, skipped


def load_rubric_prompts(path: str | Path, fmt: str = "auto", skip_invalid: bool = False) -> LoadedPrompts:
    """Load rubric-annotated prompts from a JSONL or parquet file.

    Returns ``LoadedPrompts(prompts, skipped)``; ``skipped`` lists (file:line, reason) of the bad records
    when ``skip_invalid`` is true (otherwise the first bad record raises RubricError). Prompt ids must be
    unique in a file; records without an id get ``<file stem>-<line>``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")

    def parse(row: Any, where: str, default_id: str) -> RubricPrompt:
        return parse_record(row, where, fmt, default_id=default_id)

    prompts, skipped = read_records(path, parse, skip_invalid, "rubric prompts")
    return LoadedPrompts(prompts, skipped)
