"""Recipe configuration: OmegaConf YAML with ``defaults:`` inheritance, overrides and a typed schema.

``load_config(path, overrides)`` is the one entry point; see ``loader`` for the rules and ``schema`` for
every key, its type and default.
"""

from rise_nemo.config.loader import (
    ConfigError,
    apply_override,
    config_from_dict,
    load_config,
    load_recipe_tree,
    redact_secrets,
    to_yaml,
    validate_tree,
)
from rise_nemo.config.schema import BACKENDS, RecipeCfg

__all__ = [
    "BACKENDS",
    "ConfigError",
    "RecipeCfg",
    "apply_override",
    "config_from_dict",
    "load_config",
    "load_recipe_tree",
    "redact_secrets",
    "to_yaml",
    "validate_tree",
]
