"""Verdict cache: identical (judge model, prompt template, conversation, response, criterion) -> no call.

Re-judging identical triples happens on evaluation re-runs, resumes and duplicate samples; the cache
makes them free. Entries live in memory; with a ``path`` they are also written to a SQLite file that
survives restarts (one row per verdict, committed after every batch). Unknown verdicts are never cached:
they are retried the next time.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from rise_nemo.core.rubric import Conversation, Criterion


def request_digest(model: str, template_version: str, conversation: Conversation, response: str) -> str:
    """sha256 over everything a request's verdicts share (computed once per response, not per criterion)."""
    payload = [model, template_version, [[m.get("role"), m.get("content")] for m in conversation], response]
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def criterion_key(digest: str, criterion: Criterion) -> str:
    # The points are part of the key: their sign changes the prompt's semantics note.
    blob = json.dumps([digest, criterion.text, float(criterion.weight)], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def verdict_key(
    model: str, template_version: str, conversation: Conversation, response: str, criterion: Criterion
) -> str:
    """The cache key: a hash of (judge model, prompt template version, conversation, response, criterion)."""
    return criterion_key(request_digest(model, template_version, conversation, response), criterion)


class VerdictCache:
    """Thread-safe key -> bool store, in memory, optionally backed by SQLite at ``path``."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._mem: dict[str, bool] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self.path = Path(path) if path else None
        if self.path is not None:
            self._open(self.path)

    def _open(self, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(str(path), check_same_thread=False)
            db.execute("CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, met INTEGER NOT NULL)")
            db.commit()
            rows = db.execute("SELECT key, met FROM verdicts").fetchall()
        except sqlite3.Error as exc:
            raise ValueError(f"judge.cache.path={path}: cannot open the verdict cache ({exc})") from exc
        self._db = db
        self._mem.update((k, bool(m)) for k, m in rows)

    def __len__(self) -> int:
        return len(self._mem)

    def get(self, key: str) -> bool | None:
        with self._lock:
            return self._mem.get(key)

    def put_many(self, items: Mapping[str, bool] | Iterable[tuple[str, bool]]) -> None:
        pairs = list(items.items() if isinstance(items, Mapping) else items)
        if not pairs:
            return
        with self._lock:
            self._mem.update(pairs)
            if self._db is not None:
                self._db.executemany(
                    "INSERT OR REPLACE INTO verdicts (key, met) VALUES (?, ?)", [(k, int(v)) for k, v in pairs]
                )
                self._db.commit()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
