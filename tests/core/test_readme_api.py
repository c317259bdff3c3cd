"""The "Python API" example in docs/usage.md runs exactly as written (it reads the HealthBench sample shipped in the package)."""

import re
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]

torch.set_num_threads(1)


def test_readme_python_api_example_runs(healthbench_path):
    text = (REPO_ROOT / "docs" / "usage.md").read_text()
    section = text[text.index("## Python API") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "../" not in code  # nothing outside an installed package or a clone
    scope: dict = {}
    exec(compile(code, "docs/usage.md#python-api", "exec"), scope)
    assert len(scope["prompts"]) == 60 and torch.isfinite(scope["loss"])
    assert set(scope["metrics"]) >= {"loss/pg", "loss/guide", "loss/total"}
