"""Recipe loading: YAML files with ``defaults:`` inheritance, NeMo-RL-style overrides, schema validation.

- ``defaults:`` (a path or a list of paths, relative to the file that names them) are merged first, in
  order; the file's own keys then override them (mappings merge key by key, anything else replaces).
- Overrides, as on NeMo-RL's command line: ``a.b=1`` sets an existing key (a typo is an error, not a new
  key), ``++a.b=1`` sets or adds, ``+a.b=1`` adds a key that must not exist yet, ``~a.b`` deletes.
  Values are parsed as YAML (``null``, ``[1, 2]``, ``1e-6`` all work). Why not Hydra's override parser (what
  NeMo-RL uses): docs/DESIGN.md §3 "Command-line overrides".
- Validation against ``rise_nemo.config.schema``: unknown keys and wrong types raise ``ConfigError``
  naming the dotted key and the file (or override) that set it. Defaults are filled in, so the result
  holds every key the orchestration reads. Pass-through blocks (``nemo``, ``local``, ``judge``,
  ``data.task``) are kept as given for their owners to validate.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rise_nemo.config.schema import RANGE_CHECKS, RecipeCfg, renamed_key_message
from rise_nemo.methods.registry import DEFAULT_METHOD, METHODS, MethodRecipeError

OVERRIDE_SOURCE = "command-line override"
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_0-9][A-Za-z0-9_\-]*)*$")
# Whole key names (or their last _part): "max_new_tokens" is not a secret, "hf_token" is.
_SECRET_RE = re.compile(r"^(.*[_-])?(api_?key|token|secret|password|passwd|authorization)$", re.IGNORECASE)


class ConfigError(ValueError):
    """A recipe or override is invalid; the message names the key and the file (or override)."""


# ----------------------------------------------------------------------------------------------------------
# Reading files


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: recipe file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")
    return data


def _record(tree: Mapping[str, Any], source: str, prov: dict[str, str], prefix: str = "") -> None:
    """Remember which file set each key (leaf and mapping alike) for error messages."""
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        prov[dotted] = source
        if isinstance(value, Mapping):
            _record(value, source, prov, dotted + ".")


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(dict(out[key]), value)
        else:
            out[key] = _copy(value)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def load_recipe_tree(path: str | Path, prov: dict[str, str] | None = None, _stack: tuple = ()) -> dict:
    """The merged (unvalidated) tree of a recipe and its ``defaults:`` chain."""
    path = Path(path).resolve()
    prov = {} if prov is None else prov
    if path in _stack:
        chain = " -> ".join(str(p) for p in (*_stack, path))
        raise ConfigError(f"{path}: circular defaults: {chain}")
    data = _read_yaml(path)
    defaults = data.pop("defaults", [])
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ConfigError(f"{path}: key 'defaults' must be a path or a list of paths, got {defaults!r}")
    merged: dict[str, Any] = {}
    for rel in defaults:
        parent = (path.parent / rel).resolve()
        if not parent.is_file():
            raise ConfigError(f"{path}: key 'defaults' names {rel!r}, but {parent} does not exist")
        merged = _deep_merge(merged, load_recipe_tree(parent, prov, (*_stack, path)))
    _record(data, str(path), prov)
    return _deep_merge(merged, data)


# ----------------------------------------------------------------------------------------------------------
# Overrides


def _parse_value(text: str) -> Any:
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text
    if isinstance(value, str):  # YAML 1.1 reads "1e-6" as a string; a number is what anyone means
        try:
            return float(value) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value) else value
        except ValueError:
            return value
    return value


def _has_glued_mapping(value: Any) -> bool:
    """True for what YAML makes of Hydra's ``{a:1}``: a key holding a colon with no value."""
    if isinstance(value, Mapping):
        return any((isinstance(k, str) and ":" in k and v is None) or _has_glued_mapping(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_glued_mapping(v) for v in value)
    return False


def _schema_has(dotted: str) -> bool:
    """True when ``dotted`` names a field of the typed schema (present with its default even if unset)."""
    cls: Any = RecipeCfg
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return False
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return False
        cls = hints[part]
    return True


def _lookup(tree: Mapping[str, Any], parts: Sequence[str]) -> tuple[bool, Any]:
    node: Any = tree
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def apply_override(tree: dict[str, Any], override: str, prov: dict[str, str]) -> None:
    """Apply one ``key=value`` / ``++key=value`` / ``+key=value`` / ``~key`` override in place."""
    text = override.strip()
    if text.startswith("~"):
        mode, body = "delete", text[1:]
    elif text.startswith("++"):
        mode, body = "upsert", text[2:]
    elif text.startswith("+"):
        mode, body = "add", text[1:]
    else:
        mode, body = "set", text
    if mode == "delete":
        key, raw = body.split("=", 1)[0], None
    else:
        if "=" not in body:
            raise ConfigError(
                f"{OVERRIDE_SOURCE} {override!r}: expected key=value (or ++key=value to add a key, ~key to delete)"
            )
        key, raw = body.split("=", 1)
    key = key.strip()
    if not _KEY_RE.match(key):
        raise ConfigError(f"{OVERRIDE_SOURCE} {override!r}: {key!r} is not a dotted key like sampling.group_size")
    if (renamed := renamed_key_message(key)) is not None:
        raise ConfigError(f"{OVERRIDE_SOURCE} {override!r}: {renamed}")
    parts = key.split(".")
    exists, _ = _lookup(tree, parts)
    if mode == "set" and not (exists or _schema_has(key)):
        raise ConfigError(
            f"{OVERRIDE_SOURCE} {override!r}: unknown key {key!r} (not in the recipe or the schema); "
            f"use ++{key}=... to add a new key"
        )
    if mode == "add" and exists:
        raise ConfigError(f"{OVERRIDE_SOURCE} {override!r}: key {key!r} already exists; use {key}=... or ++{key}=...")
    if mode == "delete":
        if not exists:
            raise ConfigError(f"{OVERRIDE_SOURCE} {override!r}: cannot delete missing key {key!r}")
        parent = _lookup(tree, parts[:-1])[1]
        del parent[parts[-1]]
        return
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{OVERRIDE_SOURCE} {override!r}: {'.'.join(parts[: i + 1])!r} is not a mapping")
        node = child
    value = _parse_value(raw)
    if _has_glued_mapping(value):
        raise ConfigError(f"{OVERRIDE_SOURCE} {override!r}: write a mapping with a space after each colon, "
                          "e.g. {a: 1} (YAML reads {a:1} as the key 'a:1')")
    node[parts[-1]] = value
    prov[key] = OVERRIDE_SOURCE
    if isinstance(node[parts[-1]], Mapping):
        _record(node[parts[-1]], OVERRIDE_SOURCE, prov, key + ".")


# ----------------------------------------------------------------------------------------------------------
# Validation against the schema


def _where(prov: Mapping[str, str], dotted: str, fallback: str) -> str:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):  # the nearest key (or enclosing block) with a known source
        src = prov.get(".".join(parts[:n]))
        if src:
            return src
    return fallback


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _check_value(tp: Any, value: Any, dotted: str, err) -> Any:
    """Return ``value`` coerced to ``tp`` (int -> float only) or call ``err`` with what was expected."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(arg, value, dotted, _raise_inner)
            except _Mismatch:
                continue
        err(f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            err(f"expected one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            err(f"expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_check_value(item, v, f"{dotted}[{i}]", err) for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            err(f"expected a mapping, got {value!r}")
        return _copy(value)
    if tp is bool:
        if not isinstance(value, bool):
            err(f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            err(f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            err(f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            err(f"expected a string, got {value!r}")
        return value
    raise TypeError(f"schema type {tp!r} of {dotted} is not supported by the validator")


class _Mismatch(Exception):
    pass


def _raise_inner(msg: str) -> None:
    raise _Mismatch(msg)


def _first_leaf(value: Any, dotted: str) -> str:
    """The dotted key of the first leaf under ``value`` (``dotted`` itself for a leaf or an empty mapping)."""
    while isinstance(value, Mapping) and value:
        key, value = next(iter(value.items()))
        dotted = f"{dotted}.{key}"
    return dotted


def _validate_block(cls: Any, tree: Mapping[str, Any], prefix: str, prov, fallback: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in tree:
        if key not in fields:
            dotted = _first_leaf(tree[key], f"{prefix}{key}")
            if (renamed := renamed_key_message(dotted)) is not None:
                raise ConfigError(f"{_where(prov, dotted, fallback)}: {renamed}")
            dotted = f"{prefix}{key}"
            raise ConfigError(
                f"{_where(prov, dotted, fallback)}: unknown key {dotted!r}; "
                f"allowed in {prefix.rstrip('.') or 'the top level'}: {sorted(fields)}"
            )
    out: dict[str, Any] = {}
    defaults = cls()
    for name in fields:
        dotted = f"{prefix}{name}"
        tp = hints[name]
        value = tree[name] if name in tree else getattr(defaults, name)
        if dataclasses.is_dataclass(tp):
            if dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            if not isinstance(value, Mapping):
                raise ConfigError(f"{_where(prov, dotted, fallback)}: key {dotted!r} must be a mapping, got {value!r}")
            out[name] = _validate_block(tp, value, dotted + ".", prov, fallback)
            continue

        def err(msg: str, dotted: str = dotted) -> None:
            raise ConfigError(f"{_where(prov, dotted, fallback)}: key {dotted!r}: {msg}")

        value = _check_value(tp, value, dotted, err)
        check = RANGE_CHECKS.get(dotted)
        if check is not None and value is not None and not check[0](value):
            err(f"must be {check[1]}, got {value!r}")
        out[name] = value
    return out


def validate_tree(tree: Mapping[str, Any], prov: Mapping[str, str] | None = None, source: str = "recipe") -> dict:
    """Validate a merged tree against the schema; returns a plain dict with every default filled in.

    The method's own defaults (rise_nemo.methods, e.g. PPO's KL 0.001) fill keys the recipe leaves out; the
    method then checks what the recipe pairs it with (``Method.check_recipe``: a scorer of another step kind,
    an advantage estimator without the scores it needs), each refusal one line naming the key."""
    prov = prov or {}
    out = _validate_block(RecipeCfg, _with_method_defaults(tree), "", prov, source)
    try:
        METHODS[out["method"]].check_recipe(out)
    except MethodRecipeError as exc:
        raise ConfigError(f"{_where(prov, exc.key, source)}: key {exc.key!r}: {exc}") from None
    return out


def _with_method_defaults(tree: Mapping[str, Any]) -> dict[str, Any]:
    name = tree.get("method", DEFAULT_METHOD)
    method = METHODS.get(name) if isinstance(name, str) else None
    out = _copy(dict(tree))
    for dotted, value in (method.defaults.items() if method is not None else ()):
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            if not isinstance(node.get(part, {}), Mapping):
                break
            node = node.setdefault(part, {})
        else:
            node.setdefault(leaf, value)
    return out


# ----------------------------------------------------------------------------------------------------------
# Public entry points


_ENV_RE = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)")


def _env_sources(tree: Any, out: dict[str, str], prefix: str = "") -> None:
    """dotted key -> the environment variable its ``${oc.env:VAR,...}`` value reads (first one)."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            _env_sources(value, out, f"{prefix}{key}.")
    elif isinstance(tree, str) and (match := _ENV_RE.search(tree)):
        out[prefix.rstrip(".")] = match.group(1)


def load_config(path: str | Path, overrides: Sequence[str] = (), env_sources: dict[str, str] | None = None
                ) -> DictConfig:
    """Load, merge, override, resolve and validate a recipe; returns a read-only DictConfig.
    ``env_sources``, when given, is filled with dotted key -> environment variable for values set by
    ``${oc.env:...}`` (so an error about a path can name the variable that set it)."""
    prov: dict[str, str] = {}
    tree = load_recipe_tree(path, prov)
    for override in overrides:
        apply_override(tree, override, prov)
    if env_sources is not None:
        _env_sources(tree, env_sources)
    try:  # resolve ${...} interpolations before type checks
        resolved = OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except Exception as exc:  # omegaconf raises several types; all mean a bad interpolation
        raise ConfigError(f"{path}: cannot resolve interpolation: {exc}") from exc
    cfg = OmegaConf.create(validate_tree(resolved, prov, str(path)))
    OmegaConf.set_readonly(cfg, True)
    return cfg


def config_from_dict(tree: Mapping[str, Any], overrides: Sequence[str] = ()) -> DictConfig:
    """Validate an in-memory tree (tests, the demo); same rules as ``load_config``."""
    prov: dict[str, str] = {}
    tree = _copy(dict(tree))
    _record(tree, "<dict>", prov)
    for override in overrides:
        apply_override(tree, override, prov)
    cfg = OmegaConf.create(validate_tree(tree, prov, "<dict>"))
    OmegaConf.set_readonly(cfg, True)
    return cfg


def redact_secrets(tree: Any) -> Any:
    """Copy of a config tree with secret-looking keys (api_key, token, password, ...) replaced."""
    if isinstance(tree, DictConfig):
        tree = OmegaConf.to_container(tree, resolve=True)
    if isinstance(tree, Mapping):
        return {
            k: ("***redacted***" if _SECRET_RE.search(str(k)) and v not in (None, "") else redact_secrets(v))
            for k, v in tree.items()
        }
    if isinstance(tree, list):
        return [redact_secrets(v) for v in tree]
    return tree


def to_yaml(cfg: DictConfig | Mapping[str, Any]) -> str:
    """The resolved config as YAML, secrets redacted (what the run directory's config.yaml holds)."""
    return yaml.safe_dump(redact_secrets(cfg), sort_keys=False)
