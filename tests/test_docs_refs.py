"""The repository stands alone and its documentation holds together: every section of docs/DESIGN.md and
heading of docs/CONTRACTS.md cited in tracked code, docs, recipes, the Makefile, slurm/ and bench/ exists; no
tracked file points at a path outside the repository; every Markdown link between README.md and docs/*.md
reaches an existing file and heading, and every `docs/<page>.md "<heading>"` citation an existing heading; the
README is a front door (at most 250 lines) whose recipe index names every recipe and every Slurm script."""

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


# The allowed exceptions: CI's entry point points $NEMO_RL_DIR at the NeMo-RL copy beside the checkout, and
# $NEMO_AUTOMODEL_DIR at the copy of the Automodel commit NeMo-RL pins.
CI_THIRD_PARTY_COPIES = {(".ci/run", "nemo_rl_copy=.." + "/shared/third_party/nemo-rl-v0.7.0"),
                         (".ci/run", "automodel_copy=.." + "/shared/third_party/automodel-24b47e85")}


def test_no_tracked_file_points_outside_the_repository():
    offenders = []
    for path in tracked_text_files():
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if (str(path.relative_to(REPO)), line.strip()) in CI_THIRD_PARTY_COPIES:
                continue
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:100]}")
    assert not offenders, "\n".join(offenders)


# A tracker label ("issue 24") means nothing to a user who cannot see the tracker: cite the paper, section
# or docs/ page instead.
TRACKER_LABEL = re.compile(r"\b[Ii]ssue[ -]?#?[0-9]+\b")


def test_no_tracker_labels_in_code_or_docs():
    offenders = [f"{path.relative_to(REPO)}:{lineno}: {line.strip()[:100]}"
                 for path in tracked_text_files()
                 for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 if TRACKER_LABEL.search(line)]
    assert not offenders, "\n".join(offenders)


README_MAX_LINES = 250
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
DOC_HEADING_CITATION = re.compile(r'docs/([A-Za-z0-9_]+\.md)"?\s+\(?"([^"]+)"')
DOC_PAGE = re.compile(r"\bdocs/([A-Za-z0-9_]+\.md)\b")


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation other than '-' and '_' dropped, spaces
    to '-' (backticks, dots, slashes, parentheses and '>' vanish; a space next to them stays)."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            base = github_anchor(line.lstrip("#"))
            name, n = base, 0
            while name in found:  # GitHub numbers repeated headings: x, x-1, x-2
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def markdown_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_readme_is_a_front_door_of_at_most_250_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES}); move detail to docs/"


def test_every_markdown_link_between_the_docs_resolves():
    broken = []
    for page in markdown_pages():
        for lineno, line in enumerate(page.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
                    continue
                file_part, _, anchor = target.partition("#")
                dest = (page.parent / file_part).resolve() if file_part else page
                where = f"{page.relative_to(REPO)}:{lineno}: ({target})"
                if not dest.exists():
                    broken.append(f"{where} no such file")
                elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                    broken.append(f"{where} no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def test_docs_pages_and_headings_cited_in_the_repository_exist():
    """`docs/usage.md` in a comment must exist; `docs/methods.md "RISE-RL options beyond the paper"` must name a
    heading of that page (as the docs/DESIGN.md §N and CONTRACTS.md checks above do for those two files)."""
    missing = []
    for path in tracked_text_files():
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for page in DOC_PAGE.findall(line):
                if not (REPO / "docs" / page).exists():
                    missing.append(f"{path.relative_to(REPO)}:{lineno}: docs/{page} does not exist")
            for page, heading in DOC_HEADING_CITATION.findall(line):
                doc = REPO / "docs" / page
                if doc.exists() and not any(h.startswith(heading) for h in headings(doc)):
                    missing.append(f"{path.relative_to(REPO)}:{lineno}: docs/{page} has no heading {heading!r}")
    assert not missing, "\n".join(missing)


def recipe_index() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Recipe index")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def slurm_entry_points() -> tuple[list[str], set[str]]:
    """Every slurm/**/*.sh a user submits or runs, and the helpers the scripts hand over to (`exec bash
    .../launch.sh`, `source ...`), which are not entry points of their own."""
    scripts = sorted(str(p.relative_to(REPO)) for p in (REPO / "slurm").rglob("*.sh"))
    helpers = set()
    for script in scripts:
        for name in re.findall(r'(?:exec bash|source|\.)\s+"?[^"\s]*/([A-Za-z0-9_.]+\.sh)"?', (REPO / script).read_text()):
            helpers |= {s for s in scripts if s.endswith("/" + name)}
    return [s for s in scripts if s not in helpers], helpers


def test_readme_recipe_index_names_every_recipe_and_every_slurm_script():
    index = recipe_index()
    recipes = sorted(str(p.relative_to(REPO / "recipes")) for p in (REPO / "recipes").rglob("*.yaml"))
    assert len(recipes) >= 30, recipes
    missing = [r for r in recipes if f"`{r}`" not in index]
    scripts, helpers = slurm_entry_points()
    assert helpers == {"slurm/launch.sh"}, helpers  # the one launcher every sbatch script execs
    assert len(scripts) >= 13, scripts
    missing += [s for s in scripts if f"`{s}`" not in index]
    assert not missing, f"not named in README.md's recipe index: {missing}"
    # one row per recipe: a recipe named twice in the first column would hide which row is right
    first_column = re.findall(r"^\| ([^|]+) \|", index, re.M)
    named = [r for cell in first_column for r in re.findall(r"`([^`]+\.yaml)`", cell)]
    assert len(named) == len(set(named)), sorted(n for n in named if named.count(n) > 1)
