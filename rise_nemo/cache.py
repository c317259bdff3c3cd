"""The one on-disk cache location of rise_nemo (warm-started weights and any later derived artefacts).

``cache_dir()`` is ``$RISE_NEMO_CACHE`` when set, else ``$XDG_CACHE_HOME/rise_nemo``, else
``~/.cache/rise_nemo`` — never relative to the current directory, so a run started from another directory
reuses what an earlier run cached. Each user of the cache takes its own sub-folder
(``cache_dir("warm_start")``); ``cache_lock`` serialises the building of one entry between processes.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV = "RISE_NEMO_CACHE"


def cache_dir(*parts: str) -> Path:
    """The cache root (or a sub-folder of it), absolute; not created here."""
    root = os.environ.get(CACHE_ENV)
    if root:
        base = Path(root).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "rise_nemo"
    return base.resolve().joinpath(*parts)


@contextmanager
def cache_lock(entry: Path | None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<entry>.lock`` (next to it) while a cache entry is checked and built, so
    that two commands started together build it once: the second waits (saying so on stderr), then finds the
    entry the first wrote. The kernel drops the lock when its holder dies, so a killed build never blocks the next one.
    ``None`` (caching off) locks nothing."""
    if entry is None:
        yield
        return
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(f".{entry.name}.lock"), "a") as fh:  # hidden: listings of entries skip it
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print(f"[rise-nemo] waiting for another process that is building the cache entry {entry}",
                  file=sys.stderr, flush=True)
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
