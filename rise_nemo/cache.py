"""The one on-disk cache location of rise_nemo (warm-started weights and any later derived artefacts).

``cache_dir()`` is ``$RISE_NEMO_CACHE`` when set, else ``$XDG_CACHE_HOME/rise_nemo``, else
``~/.cache/rise_nemo`` — never relative to the current directory, so a run started from another directory
reuses what an earlier run cached. Each user of the cache takes its own sub-folder
(``cache_dir("warm_start")``).
"""

from __future__ import annotations

import os
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
