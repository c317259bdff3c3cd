"""Small data files shipped inside the package (see README.md here for provenance and licences)."""

from __future__ import annotations

from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parent


def healthbench_sample_path() -> Path:
    """60 HealthBench conversations with rubrics (MIT, (c) 2024 OpenAI): a real file for examples and tests."""
    return SAMPLES_DIR / "healthbench_sample.jsonl"


def apps_solutions_path() -> Path:
    """5 APPS problems in the original layout with human solutions (MIT): the sandbox's real programs."""
    return SAMPLES_DIR / "apps_solutions_5.jsonl"


def apps_mapcoder_path() -> Path:
    """12 APPS problems (4 per difficulty) in MapCoder's layout, no solutions (MIT)."""
    return SAMPLES_DIR / "apps_mapcoder_12.jsonl"
