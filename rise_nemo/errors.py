"""User errors: what the CLI prints as one line (exit code 2) instead of a traceback.

``UserError`` is for anything the user can fix by changing a file, a key, an option or the environment:
a bad data file, a judge that cannot be reached, a run directory that is a file, a missing extra. Config
errors (``rise_nemo.config.ConfigError``) and data errors (``rise_nemo.core.rubric.RubricError``) are
caught the same way by ``rise_nemo.cli``.
"""

from __future__ import annotations

import importlib
from pathlib import Path


class UserError(ValueError):
    """A problem the user fixes (file, key, option, environment); the message is one line naming it."""


def require_extra(extra: str, *modules: str, what: str = "") -> None:
    """Import ``modules`` or raise ``UserError`` naming the pip extra that provides them.

    ``pip install rise_nemo`` alone installs only the core; the embedded backend, the LLM judge, plots
    and parquet loading each need an extra (``pip install 'rise_nemo[local]'`` etc.)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            needs = f"{what} needs" if what else "this needs"
            raise UserError(
                f"{needs} the '{extra}' extra (missing Python module {name!r}: {exc}); "
                f"install it with: pip install 'rise_nemo[{extra}]'"
            ) from None


def check_output_path(path: str | Path, option: str, *, directory: bool) -> Path:
    """Refuse (``UserError``) an output path that cannot be written, before any work starts: a file where a
    folder is wanted (``directory``) or a folder where a file is wanted, or a file on the way to it."""
    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        wanted = "a folder" if directory else f"a file path (e.g. {path / 'result.json'})"
        found = "a directory" if path.is_dir() else "a file"
        raise UserError(f"{option} {path}: is {found}; give {wanted}")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{option} {path}: {parent} is a file, not a directory")
            break
    return path
