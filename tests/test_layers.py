"""The layer order, declared once in docs/CONTRACTS.md ("Layers"), enforced over every module of rise_nemo, and
no import cycle between the files of rise_nemo (inside a package too).

Imports are read from the source (AST): module-level and function-level (lazy) imports, ``from . import x``,
relative imports and ``importlib.import_module("...")`` with a literal name all count; a cycle closed by a
function-level import is a cycle. The checkers themselves are tested on synthetic package trees written to
tmp_path, and on a copy of rise_nemo with one upward import inserted, so a broken rule cannot pass unnoticed.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = REPO / "docs" / "CONTRACTS.md"
# Third-party stacks the CPU path must never import: only these modules may.
HEAVY = ("nemo_rl", "vllm", "megatron", "ray")
HEAVY_ALLOWED = ("rise_nemo.backends.nemo", "rise_nemo.judges.ray_actor")


def declared_layers(contracts: Path = CONTRACTS) -> list[tuple[str, ...]]:
    """The rows of the "## Layers" table, top layer first: each row's backticked package names."""
    text = contracts.read_text()
    match = re.search(r"^## Layers\n(.*?)(?=^## )", text, re.M | re.S)
    if match is None:
        raise AssertionError(f"{contracts}: no '## Layers' section")
    rows = [line for line in match.group(1).splitlines() if line.startswith("| `")]
    layers = [tuple(re.findall(r"`([\w.]+)`", row.split("|")[1])) for row in rows]
    if not layers or not all(layers):
        raise AssertionError(f"{contracts}: the Layers table has no package rows")
    return layers


def package_modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Every module of ``package`` under ``root``: dotted name -> (file, is a package __init__)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def imports_of(name: str, path: Path, is_pkg: bool, known: set[str]) -> list[tuple[int, str, str]]:
    """(line, imported module, imported name or "") for every import in the file, at any depth."""
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out: list[tuple[int, str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.append((node.lineno, sub, "") if sub in known else (node.lineno, module, alias.name))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in ("import_module",
                                                                                          "__import__")):
            out.append((node.lineno, node.args[0].value, ""))
    return out


def unit_of(module: str, units: list[str], package: str) -> str | None:
    """The declared package a module belongs to: the longest declared prefix (the root package itself
    stands for its own ``__init__`` only, so a new top-level module must be declared)."""
    best = None
    for unit in units:
        if module == unit or (unit != package and module.startswith(unit + ".")):
            if best is None or len(unit) > len(best):
                best = unit
    return best


def _private(module: str, name: str) -> bool:
    parts = [*module.split("."), name] if name else module.split(".")
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def layer_violations(root: Path, package: str, layers: list[tuple[str, ...]],
                     heavy_allowed: tuple[str, ...] = HEAVY_ALLOWED) -> list[str]:
    """Every breach of the layer rules in ``root/package``, one line each naming the file and line."""
    level = {unit: i for i, row in enumerate(layers) for unit in row}  # 0 = top
    units = list(level)
    modules = package_modules(root, package)
    found = [f"the Layers table names {unit}, which is no module of {package}" for unit in units
             if not any(unit_of(m, [unit], package) for m in modules)]
    for name, (path, is_pkg) in modules.items():
        where = str(path.relative_to(root))
        mine = unit_of(name, units, package)
        if mine is None:
            found.append(f"{where}: {name} is in no row of the Layers table")
            continue
        for line, target, imported in imports_of(name, path, is_pkg, set(modules)):
            top = target.split(".")[0]
            if top in HEAVY and not any(name == a or name.startswith(a + ".") for a in heavy_allowed):
                found.append(f"{where}:{line}: imports {target} (only {', '.join(heavy_allowed)} may)")
            if top != package:
                continue
            theirs = unit_of(target, units, package)
            if theirs is None or theirs == mine:
                continue  # an undeclared target is reported as a module of its own
            if level[theirs] < level[mine]:
                found.append(f"{where}:{line}: {mine} imports {target}, a layer above it")
            elif level[theirs] == level[mine]:
                found.append(f"{where}:{line}: {mine} imports {target}, a package of the same layer")
            if _private(target, imported):
                what = f"{target}.{imported}" if imported else target
                found.append(f"{where}:{line}: {mine} imports the private {what} of {theirs}")
    return list(dict.fromkeys(found))  # ``from m import a, b`` is one finding


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """Every import cycle between the modules of ``root/package`` (strongly connected components of the
    file-level import graph, each sorted; a module importing itself counts), smallest name first."""
    modules = package_modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_pkg) in modules.items():
        for _, target, _ in imports_of(name, path, is_pkg, set(modules)):
            if target in modules:
                graph[name].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


# -- the real package ----------------------------------------------------------------------------------------

def test_every_module_of_rise_nemo_keeps_the_declared_layers():
    assert layer_violations(REPO, "rise_nemo", declared_layers()) == []


# The nemo backend's package root and two of its modules import each other inside functions (the module reads
# plain_recipe / resume_paths from the package root, which builds the critic and the reward model): pinned here
# so that it cannot grow, until those helpers move out of the package root.
NEMO_BACKEND_CYCLE = ["rise_nemo.backends.nemo", "rise_nemo.backends.nemo.critic", "rise_nemo.backends.nemo.reward_model"]


def test_no_import_cycle_between_the_files_of_rise_nemo():
    assert import_cycles(REPO, "rise_nemo") == [NEMO_BACKEND_CYCLE]


def test_the_declared_order_is_one_table_covering_every_top_level_package():
    layers = declared_layers()
    assert layers[0] == ("rise_nemo.cli",) and "rise_nemo.core" in layers[-2]
    declared = [unit for row in layers for unit in row]
    assert len(declared) == len(set(declared))
    top_level = {f"rise_nemo.{p.stem}" for p in (REPO / "rise_nemo").iterdir()
                 if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert top_level <= set(declared), sorted(top_level - set(declared))


def test_an_upward_import_inserted_into_a_copy_of_rise_nemo_fails(tmp_path):
    shutil.copytree(REPO / "rise_nemo", tmp_path / "rise_nemo", ignore=shutil.ignore_patterns("__pycache__"))
    losses = tmp_path / "rise_nemo" / "core" / "losses.py"
    losses.write_text(losses.read_text() + "\n\ndef _lazy():\n    from ..loop import trainer\n")
    found = layer_violations(tmp_path, "rise_nemo", declared_layers())
    assert len(found) == 1 and "rise_nemo.core imports rise_nemo.loop.trainer, a layer above" in found[0]


# -- the checker on synthetic trees --------------------------------------------------------------------------

LAYERS = [("pkg.high",), ("pkg.left", "pkg.right"), ("pkg.low", "pkg")]


@pytest.fixture
def tree(tmp_path):
    files = {
        "pkg/__init__.py": "VERSION = 1\n",
        "pkg/low/__init__.py": "",
        "pkg/low/base.py": "def _secret():\n    return 1\n\ndef shared():\n    return 2\n",
        "pkg/left/__init__.py": "from pkg.low.base import shared\n",
        "pkg/right/__init__.py": "from ..low import base\n",
        "pkg/high/__init__.py": "",
        "pkg/high/top.py": "import pkg.left\nfrom pkg import VERSION\n\ndef run():\n    from pkg.right import base\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def check(tree, layers=LAYERS):
    return layer_violations(tree, "pkg", layers, heavy_allowed=("pkg.high",))


def test_a_clean_tree_passes(tree):
    assert check(tree) == []


@pytest.mark.parametrize("rel, code, expected", [
    ("pkg/low/base.py", "\ndef lazy():\n    from pkg.high import top\n", "pkg.low imports pkg.high.top, a layer above"),
    ("pkg/low/base.py", "\nfrom ..left import shared\n", "pkg.low imports pkg.left, a layer above"),
    ("pkg/left/__init__.py", "from .. import right\n", "pkg.left imports pkg.right, a package of the same layer"),
    ("pkg/left/__init__.py", "from pkg.right import base\n", "pkg.left imports pkg.right, a package of the same layer"),
    ("pkg/high/top.py", "from pkg.low.base import _secret\n", "imports the private pkg.low.base._secret of pkg.low"),
    ("pkg/left/__init__.py", "import importlib\nM = importlib.import_module('pkg.high.top')\n",
     "pkg.left imports pkg.high.top, a layer above"),
    ("pkg/low/base.py", "\ndef remote():\n    import ray\n", "imports ray (only pkg.high may)"),
])
def test_each_breach_is_named_with_its_file_and_line(tree, rel, code, expected):
    path = tree / rel
    path.write_text(path.read_text() + code)
    found = check(tree)
    assert len(found) == 1 and found[0].startswith(f"{rel}:") and expected in found[0], found


def test_a_cycle_closed_by_a_function_level_import_is_found(tree):
    assert import_cycles(tree, "pkg") == []
    (tree / "pkg" / "low" / "other.py").write_text("from pkg.low import base\n")
    base = tree / "pkg" / "low" / "base.py"
    base.write_text(base.read_text() + "\ndef lazy():\n    from . import other\n")
    assert import_cycles(tree, "pkg") == [["pkg.low.base", "pkg.low.other"]]
    (tree / "pkg" / "left" / "__init__.py").write_text("import pkg.left\n")
    assert import_cycles(tree, "pkg") == [["pkg.left"], ["pkg.low.base", "pkg.low.other"]]


def test_an_undeclared_module_and_a_stale_row_are_named(tree):
    (tree / "pkg" / "extra.py").write_text("")
    assert check(tree) == ["pkg/extra.py: pkg.extra is in no row of the Layers table"]
    (tree / "pkg" / "extra.py").unlink()
    assert check(tree, [*LAYERS, ("pkg.gone",)]) == ["the Layers table names pkg.gone, which is no module of pkg"]


def test_the_table_is_read_from_the_contracts_page(tmp_path):
    page = tmp_path / "CONTRACTS.md"
    page.write_text("# x\n\n## Layers\n\ntext\n\n| packages | why |\n| --- | --- |\n| `pkg.high` | a |\n"
                    "| `pkg.left`, `pkg.right` | b |\n| `pkg.low`, `pkg` | c |\n\n## Next\n")
    assert declared_layers(page) == LAYERS
    page.write_text("# x\n\n## Other\n")
    with pytest.raises(AssertionError, match="no '## Layers' section"):
        declared_layers(page)
