"""Where the shipped recipes are, so `rise-nemo plan rise_14b` works outside the checkout too.

Search order for ``recipes_dir()``: ``$RISE_NEMO_RECIPES``; the source checkout's ``recipes/`` (editable
installs, ``make``); the copy a wheel installs as ``<prefix>/share/rise_nemo/recipes`` (pyproject's
``data-files``; the prefix is the venv, the system or ``pip install --user``'s base).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from pathlib import Path

from rise_nemo.errors import UserError

RECIPES_ENV = "RISE_NEMO_RECIPES"
_MARKER = "base_local.yaml"  # present in every copy of the recipes folder


def _candidates() -> list[Path]:
    out = []
    env = os.environ.get(RECIPES_ENV)
    if env:
        out.append(Path(env).expanduser())
    out.append(Path(__file__).resolve().parents[2] / "recipes")  # a source checkout
    prefixes = [sys.prefix, sysconfig.get_path("data"), getattr(site, "USER_BASE", None)]
    out += [Path(p) / "share" / "rise_nemo" / "recipes" for p in prefixes if p]
    return out


def recipes_dir() -> Path:
    """The recipes folder (see the module docstring); ``UserError`` naming every place tried."""
    tried = _candidates()
    for path in tried:
        if (path / _MARKER).is_file():
            return path
    raise UserError(f"no recipes folder found (tried {', '.join(map(str, tried))}); set ${RECIPES_ENV}")


def resolve_recipe(recipe: str | Path, what: str = "recipe") -> Path:
    """A recipe (or a pipeline file: ``what``) given as a path, or as a name (``rise_14b`` /
    ``rise_14b.yaml``) under ./recipes or ``recipes_dir()``."""
    path = Path(recipe)
    if path.is_file():
        return path
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory, not a YAML file")
    if path.is_absolute() or len(path.parts) > 1 and (path.parent.is_dir() or path.suffix):
        raise UserError(f"{what} file not found: {path}")
    bases = [Path.cwd() / "recipes"]
    try:
        bases.append(recipes_dir())
    except UserError:
        pass
    for base in bases:
        for candidate in (base / path, base / f"{path}.yaml"):
            if candidate.is_file():
                return candidate
    raise UserError(f"{what} {str(recipe)!r} not found: neither a file nor a name under "
                    f"{' or '.join(str(b) for b in bases)}")
