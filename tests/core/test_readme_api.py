"""The README's "Python API" example runs as written (against the shared HealthBench sample)."""

import re
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]

torch.set_num_threads(1)


def test_readme_python_api_example_runs(healthbench_path):
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Python API") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace('"../shared/data/healthbench_sample.jsonl"', repr(str(healthbench_path)))
    scope: dict = {}
    exec(compile(code, "README.md#python-api", "exec"), scope)
    assert len(scope["prompts"]) == 60 and torch.isfinite(scope["loss"])
    assert set(scope["metrics"]) >= {"loss/pg", "loss/guide", "loss/total"}
