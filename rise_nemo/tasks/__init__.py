"""Embedded tasks generated in code with a seed (CPU stand-ins for real data sets).

``rise_nemo.tasks.reasoning``: chained modular arithmetic, the CPU stand-in for math reasoning used by the
reasoning methods (PPO, sparse GRPO, RRL, ExpRL; docs/DESIGN.md §7).
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "RISE_NEMO_CACHE"


def cache_root() -> Path:
    """Where warm starts are cached: ``$RISE_NEMO_CACHE`` or ``~/.cache/rise_nemo``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rise_nemo"
