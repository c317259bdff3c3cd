"""Dotted keys (``nemo.policy.model_name``) over a plain recipe tree, for code that reads the tree without
the schema (the planner, the nemo backend's ``nemo:`` block): a missing or mistyped key is one error naming
it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RecipeKeyError(KeyError):
    """A recipe key a reader needs is missing or has the wrong type; the message names the dotted key."""

    def __str__(self) -> str:  # KeyError's default repr-quotes the message
        return str(self.args[0])


def get(tree: Mapping[str, Any], dotted: str, default: Any = ..., typ: type | tuple | None = None) -> Any:
    """``tree['a']['b']`` for ``'a.b'``; a missing key without default raises RecipeKeyError naming it."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            if default is ...:
                raise RecipeKeyError(f"recipe key {dotted} is missing")
            return default
        node = node[part]
    if typ is not None and node is not None and not isinstance(node, typ):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise RecipeKeyError(f"recipe key {dotted} must be {names}, got {node!r}")
    if typ in (int, (int, float)) and isinstance(node, bool):
        raise RecipeKeyError(f"recipe key {dotted} must be a number, got {node!r}")
    return node
