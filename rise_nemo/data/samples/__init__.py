"""Small data files shipped inside the package (see README.md here for provenance and licences)."""

from __future__ import annotations

from pathlib import Path

SAMPLES_DIR = Path(__file__).resolve().parent


def healthbench_sample_path() -> Path:
    """60 HealthBench conversations with rubrics (MIT, (c) 2024 OpenAI): a real file for examples and tests."""
    return SAMPLES_DIR / "healthbench_sample.jsonl"
