"""The repository stands alone: every section of docs/DESIGN.md and heading of
docs/CONTRACTS.md cited in tracked code, docs, recipes, the Makefile, slurm/ and bench/ exists, and no
tracked file points at a path outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".cfg", ".ini", ""}
SECTION_REF = re.compile(r"DESIGN\.md\s+§\s*([0-9]+[a-z]?)")
CONTRACTS_REF = re.compile(r'CONTRACTS\.md"?\s*(?:\(?"([^"]+)")?')
# Paths outside the checkout: the sibling shared folder, absolute workstation paths.
OUTSIDE = re.compile(r"\.\./" + "shared|/" + "work/|RISE_" + "SHARED_DIR")


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = [REPO / line for line in out.splitlines()]
    return [p for p in files if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "Makefile")
            and p != Path(__file__).resolve()]  # this file spells the patterns out


def headings(path: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]


def test_design_sections_cited_in_the_repository_exist():
    design = REPO / "docs" / "DESIGN.md"
    sections = {m[1] for h in headings(design) if (m := re.match(r"([0-9]+[a-z]?)\.\s", h))}
    assert {"1", "2", "2b", "2c", "3", "4", "5", "7"} <= sections, sections
    missing = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if "DESIGN.md" in line and "docs/DESIGN.md" not in line and path.name != "DESIGN.md":
                missing.append(f"{path.relative_to(REPO)}:{lineno}: cite it as docs/DESIGN.md")
            for sec in SECTION_REF.findall(line):
                if sec not in sections:
                    missing.append(f"{path.relative_to(REPO)}:{lineno}: DESIGN.md §{sec} does not exist")
    assert not missing, "\n".join(missing)


def test_contracts_headings_cited_in_the_repository_exist():
    contracts = REPO / "docs" / "CONTRACTS.md"
    names = headings(contracts)
    missing = []
    for path in tracked_text_files():
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for heading in CONTRACTS_REF.findall(line):
                if heading and not any(h.startswith(heading) for h in names):
                    missing.append(f"{path.relative_to(REPO)}:{lineno}: CONTRACTS.md has no heading {heading!r}")
    assert not missing, "\n".join(missing)


# The one allowed exception: CI's entry point points $NEMO_RL_DIR at the NeMo-RL copy beside the checkout.
CI_NEMO_RL_COPY = (".ci/run", "nemo_rl_copy=.." + "/shared/third_party/nemo-rl-v0.7.0")


def test_no_tracked_file_points_outside_the_repository():
    offenders = []
    for path in tracked_text_files():
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if (str(path.relative_to(REPO)), line.strip()) == CI_NEMO_RL_COPY:
                continue
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)
