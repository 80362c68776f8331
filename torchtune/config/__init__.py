"""YAML configs: load a built-in config or a file, override it from the command line, check it, build
objects from its ``_component_`` nodes.

    @config.parse
    def recipe_main(cfg: DictConfig) -> None: ...
    optimizer = config.instantiate(cfg.optimizer, model.parameters())
"""

from torchtune._errors import ConfigError
from torchtune.config._instantiate import COMPONENT_KEY, import_component, instantiate
from torchtune.config._load import load_config, resolve_config_path
from torchtune.config._overrides import apply_overrides
from torchtune.config._parse import parse
from torchtune.config._validate import check_recipe_keys, validate

__all__ = [
    "COMPONENT_KEY",
    "ConfigError",
    "apply_overrides",
    "check_recipe_keys",
    "import_component",
    "instantiate",
    "load_config",
    "parse",
    "resolve_config_path",
    "validate",
]
