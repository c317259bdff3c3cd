"""Installable outside the checkout (issue 14, item 12): a missing extra is named; the recipes travel with
the wheel and are found from any directory; the HealthBench sample is package data."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_a_missing_extra_is_named_with_its_pip_command(tmp_path):
    # Simulate `pip install rise_nemo` without [local]: the tokenizers module cannot be imported.
    code = ("import sys; sys.modules['tokenizers'] = None; from rise_nemo.cli import main; "
            f"sys.exit(main(['train', '--config', 'rise_tiny_cpu', '--run-dir', {str(tmp_path / 'run')!r}]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert "the local backend needs the 'local' extra" in res.stderr
    assert "pip install 'rise_nemo[local]'" in res.stderr
    assert not (tmp_path / "run").exists()


def test_recipes_are_found_by_name_from_another_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RISE_NEMO_RECIPES"}
    res = subprocess.run([sys.executable, "-m", "rise_nemo.cli", "plan", "rise_14b"], capture_output=True,
                         text=True, cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "plan: rise_14b" in res.stdout


def test_recipes_dir_finds_an_installed_copy(tmp_path, monkeypatch):
    import rise_nemo.config.recipes as recipes

    installed = tmp_path / "prefix" / "share" / "rise_nemo" / "recipes"
    installed.mkdir(parents=True)
    (installed / "base_local.yaml").write_text("run: {name: x}\n")
    (installed / "mine.yaml").write_text("defaults: base_local.yaml\n")
    monkeypatch.delenv("RISE_NEMO_RECIPES", raising=False)
    monkeypatch.setattr(recipes, "__file__", str(tmp_path / "site" / "rise_nemo" / "config" / "recipes.py"))
    monkeypatch.setattr(recipes.sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.chdir(tmp_path)
    assert recipes.recipes_dir() == installed
    assert recipes.resolve_recipe("mine") == installed / "mine.yaml"


@pytest.mark.slow
def test_the_wheel_carries_recipes_and_the_sample(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    (wheel,) = tmp_path.glob("rise_nemo-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = "rise_nemo-0.1.0.data/data/share/rise_nemo/recipes/"
    for recipe in (REPO / "recipes").rglob("*.yaml"):
        assert data + recipe.relative_to(REPO / "recipes").as_posix() in names, recipe
    assert "rise_nemo/data/samples/healthbench_sample.jsonl" in names
    assert "rise_nemo/data/samples/README.md" in names  # its licence note travels with it
