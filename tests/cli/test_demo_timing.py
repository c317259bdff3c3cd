"""The demo's per-method time is the training run only: the warm start, which only
the first method pays for when the cache is cold, must not be charged to it."""

from __future__ import annotations

import json
import re
import time

import rise_nemo.loop.run as run_module
import rise_nemo.reports.report as report
from rise_nemo.cli import main


class _FakeTrainer:
    stopped_by = None

    def __init__(self, cfg):
        self.run_dir = __import__("pathlib").Path(cfg.run.dir)

    def run(self):
        (self.run_dir / "eval").mkdir(parents=True, exist_ok=True)
        for step in (0, 2):
            (self.run_dir / "eval" / f"step_{step:06d}.json").write_text(json.dumps(
                {"step": step, "reward_mean": 0.5, "persistent_coverage": 0.1, "negative_rate": 0.0}))
        return 0


def test_demo_time_column_excludes_the_warm_start(monkeypatch, tmp_path, capsys):
    def slow_build(cfg, **kw):
        time.sleep(1.5)  # stands for a cold warm start inside build_trainer
        return _FakeTrainer(cfg)

    monkeypatch.setattr(run_module, "build_trainer", slow_build)
    monkeypatch.setattr(report, "make_report", lambda runs, out: out / "report.md")
    assert main(["demo", "--steps", "2", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "run s" in out
    for method in ("rubric_rl", "rise"):
        row = re.search(rf"^{method}\s+.*\s(\d+)$", out, re.M)
        assert row is not None and int(row[1]) == 0, out
