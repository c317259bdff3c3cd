"""Suite-wide test settings: offline, loopback-only, small thread counts (2-core CI machines)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Set before any test module imports transformers / ray.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keeps Ray on 127.0.0.1 (DESIGN.md §5)

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The project's shared data folder: $RISE_SHARED_DIR, else ../shared beside the checkout."""
    return Path(os.environ.get("RISE_SHARED_DIR", REPO_ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def healthbench_path() -> Path:
    path = shared_dir() / "data" / "healthbench_sample.jsonl"
    if not path.exists():
        pytest.fail(f"shared data not found at {path}; set RISE_SHARED_DIR")
    return path
