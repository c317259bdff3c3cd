"""Fixtures for the LLM judge tests: the loopback rule-grader server, HealthBench-based requests (Ray: tests/conftest.py)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from rise_nemo.core.rubric import Criterion, Rubric
from rise_nemo.interfaces import JudgeRequest
from rise_nemo.judges.rule_server import RuleGraderServer


@pytest.fixture
def server():
    """A fault-free rule-grader server on a free loopback port; tests set ``server.grader`` knobs."""
    srv = RuleGraderServer(hang_s=5.0).start()
    yield srv
    srv.stop()


def load_healthbench(path: Path, limit: int | None = None) -> list[tuple[str, list[dict], Rubric]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            crits = tuple(Criterion(c["criterion"], float(c["points"])) for c in row["rubrics"])
            rows.append((row["prompt_id"], row["prompt"], Rubric(crits).validate(row["prompt_id"])))
            if limit is not None and len(rows) >= limit:
                break
    return rows


def synthetic_response(rubric: Rubric, rng: random.Random) -> str:
    """A 'response' containing the key words of a random half of the criteria, so verdicts vary."""
    parts = ["Here is my answer."]
    for c in rubric.criteria:
        if rng.random() < 0.5:
            words = [w for w in re.findall(r"[A-Za-z]+", c.text) if len(w) >= 4]
            quoted = re.findall(r'"([^"]+)"', " ".join(c.text.split()))
            parts.extend(quoted or ([max(words, key=len)] if words else []))
    return " ".join(parts)


@pytest.fixture(scope="session")
def healthbench_requests(healthbench_path) -> list[JudgeRequest]:
    """20 HealthBench conversations (real rubrics, negative points included) x 1 synthetic response."""
    rng = random.Random(0)
    return [
        JudgeRequest(conversation=msgs, response=synthetic_response(rub, rng), rubric=rub, prompt_id=pid)
        for pid, msgs, rub in load_healthbench(healthbench_path, limit=20)
    ]
