"""Every Slurm script the README shows honours `--dry-run` exactly as RISE_DRY_RUN=1 does.

Slurm's client commands on PATH are fakes that record every call: a dry run must call none of them (a real
`sbatch` on a login node would submit multi-node jobs). Only bash and the checkout are needed, no Slurm.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.relative_to(REPO).as_posix() for p in
                 [*REPO.glob("slurm/*.sh"), *REPO.glob("slurm/pipelines/*.sh")] if p.name != "launch.sh")
SLURM_TOOLS = ("sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel", "salloc")


@pytest.fixture()
def fake_slurm(tmp_path):
    """A bin/ of fake Slurm commands; each appends its name and arguments to calls.log (sbatch answers a job id)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in SLURM_TOOLS:
        path = bin_dir / tool
        path.write_text(f'#!/bin/bash\necho "{tool} $*" >> {log}\n'
                        + ('echo 4242\n' if tool == "sbatch" else "exit 1\n"))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir, log


def run_script(script: str, args: list[str], extra_env: dict[str, str], fake_slurm, tmp_path):
    bin_dir, _ = fake_slurm
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RISE_", "SBATCH_", "EXPRL_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", EXPRL_PIPELINE_DIR=str(tmp_path / "pipeline"),
               RISE_RUN_DIR=str(tmp_path / "run"), **extra_env)
    return subprocess.run(["bash", str(REPO / script), *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)


def normalised(text: str) -> str:
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", text)


def test_every_script_the_readme_shows_is_covered():
    shown = set(re.findall(r"slurm/(?:pipelines/)?[a-z0-9_]+\.sh", (REPO / "README.md").read_text()))
    shown.discard("slurm/launch.sh")
    assert shown and shown <= set(SCRIPTS), shown - set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_flag_submits_nothing_and_matches_the_environment_switch(script, fake_slurm, tmp_path):
    _, log = fake_slurm
    flag = run_script(script, ["--dry-run"], {}, fake_slurm, tmp_path)
    assert flag.returncode == 0, flag.stdout + flag.stderr
    assert not log.exists(), f"{script} --dry-run called Slurm: {log.read_text()}"
    env = run_script(script, [], {"RISE_DRY_RUN": "1"}, fake_slurm, tmp_path)
    assert env.returncode == 0, env.stdout + env.stderr
    assert not log.exists(), f"RISE_DRY_RUN=1 {script} called Slurm: {log.read_text()}"
    assert normalised(flag.stdout) == normalised(env.stdout)
    assert ("sbatch --parsable" in flag.stdout if "pipelines/" in script
            else "dry run: nothing was started" in flag.stdout), flag.stdout
    assert not (tmp_path / "pipeline").exists() and not (tmp_path / "run").exists()


def test_pipeline_without_dry_run_submits_through_sbatch(fake_slurm, tmp_path):
    """The control: the fake sbatch does record a real submission (so the dry-run checks above can fail)."""
    _, log = fake_slurm
    res = run_script("slurm/pipelines/exprl_qwen3_4b.sh", [], {}, fake_slurm, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all(c.startswith("sbatch ") for c in calls), calls
    assert "--dependency=afterok:4242" in calls[1]


def test_pipeline_rejects_an_unknown_argument_before_submitting(fake_slurm, tmp_path):
    _, log = fake_slurm
    res = run_script("slurm/pipelines/exprl_qwen3_4b.sh", ["--dryrun"], {}, fake_slurm, tmp_path)
    assert res.returncode == 2 and "unknown argument '--dryrun'" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not log.exists()
