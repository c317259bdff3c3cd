"""Installable outside the checkout: a missing extra is named; the recipes travel with
the wheel and are found from any directory; the HealthBench sample is package data.

Each extra's commands run as a fresh install with only that extra would: in a subprocess
whose ``sitecustomize`` makes every installed distribution outside the dependency closure of
``rise_nemo[<extras>]`` unimportable (``sys.modules[name] = None``: ``import`` raises ModuleNotFoundError and
``importlib.util.find_spec`` answers None, as for a package that is not there). The closure is computed
from the installed metadata (``Requires-Dist`` with extra markers), not from a hand-written list, so a new
dependency of an extra is allowed and a module no extra provides is blocked. This is cheaper than building
a venv per extra (each would install torch); what it cannot catch is a dependency that is declared nowhere
but happens to be installed by another extra's packages.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib import metadata
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
    # `license = { text = ... }` made setuptools warn six times at every install
    assert [x for x in (res.stdout + res.stderr).splitlines() if "license" in x.lower()] == []
    (wheel,) = tmp_path.glob("rise_nemo-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = "rise_nemo-0.1.0.data/data/share/rise_nemo/recipes/"
    for recipe in (REPO / "recipes").rglob("*.yaml"):
        assert data + recipe.relative_to(REPO / "recipes").as_posix() in names, recipe
    assert "rise_nemo/data/samples/healthbench_sample.jsonl" in names
    assert "rise_nemo/data/samples/README.md" in names  # its licence note travels with it
    for name in ("README.md", "healthbench_grader.txt", "writingbench_prompt.txt", "arena_hard_v0.1_8.jsonl"):
        assert f"rise_nemo/evals/data/{name}" in names  # the suites' fixtures, prompts and licence notes


# -- each extra alone ----------------------------------------------------------------------------------------

def _closure(extras: tuple[str, ...]) -> set[str]:
    """Canonical names of the distributions ``pip install 'rise_nemo[extras]'`` installs (as installed here)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, frozenset[str]] = {}
    todo = [("rise_nemo", frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        if key in seen and wanted <= seen[key]:
            continue
        seen[key] = seen.get(key, frozenset()) | wanted
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in seen[key] or {""}):
                if canonicalize_name(req.name) != "rise-nemo" or req.extras - seen[key]:
                    todo.append((req.name, frozenset(req.extras)))
    return set(seen)


def _top_level_modules(dist: metadata.Distribution) -> set[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return set(text.split())
    names = set()
    for f in dist.files or []:
        first = f.parts[0] if f.parts else ""
        if not first or first.endswith((".dist-info", ".data", ".pth")) or first in ("..", "__pycache__"):
            continue
        if len(f.parts) > 1:
            names.add(first)
        elif first.endswith((".py", ".so")):
            names.add(first.split(".")[0])
    return names


def _only_extras_env(tmp_path: Path, extras: tuple[str, ...]) -> dict[str, str]:
    """Environment of a subprocess that sees only ``rise_nemo[extras]`` (module docstring)."""
    from packaging.utils import canonicalize_name

    allowed = _closure(extras)
    keep: set[str] = set(sys.stdlib_module_names) | {"rise_nemo", "sitecustomize"}
    blocked: set[str] = set()
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"] or "")
        (keep if name in allowed else blocked).update(_top_level_modules(dist))
    blocked -= keep
    assert "torch" in keep and "torch" not in blocked  # a core dependency
    site = tmp_path / f"only_{'_'.join(extras) or 'core'}"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        f"for _name in {sorted(blocked)!r}:\n"
        "    sys.modules[_name] = None  # not installed with these extras\n")
    return {**os.environ, "PYTHONPATH": str(site), "RISE_NEMO_CACHE": str(tmp_path / "cache")}


def _cli(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rise_nemo.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=900)


def _one_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if not x.startswith("[rise-nemo]")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


TINY_CPU = ["train.steps=1", "train.progress=false", "eval.every=0", "eval.at_start=false", "eval.samples_per_prompt=2",
            "++data.warm_start.steps=3", "++data.warm_start.eval_samples=1", "++data.task.train_per_topic=1",
            "++data.task.heldout_per_topic=1", "sampling.prompts_per_step=2", "sampling.group_size=2", "sampling.max_new_tokens=8",
            "local.num_threads=1"]


def test_the_isolation_blocks_what_an_extra_does_not_install(tmp_path):
    env = _only_extras_env(tmp_path, ("local", "report"))
    probe = ("import importlib.util as u; "
             "print([m for m in ('aiohttp', 'ray', 'pyarrow', 'math_verify', 'pytest') if u.find_spec(m)]); "
             "import transformers, matplotlib, torch; print('ok')")
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.split() == ["[]", "ok"], res.stdout + res.stderr


@pytest.mark.slow
def test_each_extra_runs_its_commands_or_names_the_missing_one(tmp_path):
    """`pip install '.[local,report]'`, then train rise_tiny_cpu and report from another directory: no aiohttp,
    Ray or pyarrow needed. With fewer extras, each command that needs one says which, in one line."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    run = work / "run"
    local_report = _only_extras_env(tmp_path, ("local", "report"))
    res = _cli(local_report, work, "train", "--config", "rise_tiny_cpu", "--run-dir", str(run), *TINY_CPU)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000001"
    res = _cli(local_report, work, "report", str(run))
    assert res.returncode == 0 and (run / "report" / "report.md").is_file(), res.stderr[-3000:]

    local = _only_extras_env(tmp_path, ("local",))
    line = _one_line(_cli(local, work, "report", str(run), "--out", str(work / "r")).stderr)
    assert "needs the 'report' extra" in line and "pip install 'rise_nemo[report]'" in line, line
    line = _one_line(_cli(local, work, "train", "--config", "rise_tiny_cpu", "--run-dir", str(work / "http"),
                          "judge.type=http", *TINY_CPU).stderr)
    assert "needs the 'judge' extra" in line and "pip install 'rise_nemo[judge]'" in line, line
    parquet = work / "train.parquet"
    parquet.write_bytes(b"PAR1")
    line = _one_line(_cli(local, work, "train", "--config", "rise_tiny_cpu", "--run-dir", str(work / "pq"),
                          "data.source=jsonl", f"data.train_path={parquet}", f"data.eval_path={parquet}").stderr)
    assert "pyarrow" in line and "rise_nemo[data]" in line, line
    gsm8k = REPO / "tests" / "data" / "fixtures" / "gsm8k_test_first8.jsonl"
    line = _one_line(_cli(local, work, "train", "--config", "grpo_chain_tiny_cpu", "--run-dir", str(work / "math"),
                          "data.source=jsonl", "data.format=gsm8k", f"data.train_path={gsm8k}").stderr)
    assert "needs the 'math' extra" in line and "pip install 'rise_nemo[math]'" in line, line

    core = _only_extras_env(tmp_path, ())
    res = _cli(core, work, "plan", "rise_14b")
    assert res.returncode == 0 and "plan: rise_14b" in res.stdout, res.stderr
    line = _one_line(_cli(core, work, "train", "--config", "rise_tiny_cpu", "--run-dir", str(work / "core")).stderr)
    assert "needs the 'local' extra" in line, line
    for name in ("http", "pq", "math", "core"):
        assert not (work / name).exists()


# -- make install takes the CPU build of torch ---------------------------------------------------------------

def _fake_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv whose pip records its arguments (one line per call) and fails any call that uses --index-url
    while FAKE_INDEX_DOWN=1 (PyTorch's index unreachable)."""
    venv, log = tmp_path / "venv", tmp_path / "pip_calls.log"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (venv / "bin" / "pip").write_text(
        f'#!/bin/bash\necho "$*" >> {log}\n'
        'if [[ ${FAKE_INDEX_DOWN:-0} == 1 && " $* " == *" --index-url "* ]]; then exit 1; fi\n')
    for tool in ("python", "pip"):
        (venv / "bin" / tool).chmod(0o755)
    return venv, log


@pytest.mark.parametrize("index_down", [False, True])
def test_make_install_takes_torch_from_the_cpu_index_and_falls_back_when_it_is_down(tmp_path, index_down):
    venv, log = _fake_venv(tmp_path)
    env = {**os.environ, "FAKE_INDEX_DOWN": "1" if index_down else "0"}
    res = subprocess.run(["make", "-s", "install", f"VENV={venv}"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    torch_calls = [c for c in log.read_text().splitlines() if "torch==2.13.0" in c]
    assert "--index-url https://download.pytorch.org/whl/cpu" in torch_calls[0], torch_calls
    if index_down:
        assert len(torch_calls) == 2 and "--index-url" not in torch_calls[1], torch_calls
        assert "not installable from https://download.pytorch.org/whl/cpu" in res.stderr, res.stderr
    else:
        assert len(torch_calls) == 1 and "trying the default index" not in res.stderr
    assert (venv / "bin" / ".installed").exists()
