"""torchtune's config helpers at their path (``torchtune.config._utils``), on this package's config code:
merging the YAML with command-line overrides, removing a key, importing a component, logging a config."""

from __future__ import annotations

import logging
from argparse import Namespace
from typing import Any, Dict, List, Optional, Union

from omegaconf import DictConfig, OmegaConf

from torchtune._errors import ConfigError, OverrideError
from torchtune.config._errors import InstantiationError
from torchtune.config._instantiate import COMPONENT_KEY, import_component
from torchtune.config._overrides import apply_overrides


def get_logger(level: Optional[str] = None) -> logging.Logger:
    """``torchtune.utils.get_logger``, imported on first use (importing ``torchtune.config`` loads no torch)."""
    from torchtune.utils._logging import get_logger as utils_get_logger

    return utils_get_logger(level)


def log_config(recipe_name: str, cfg: DictConfig) -> None:
    """Log the resolved config, keys sorted, on rank 0 only."""
    from torchtune.utils._logging import log_rank_zero

    text = OmegaConf.to_yaml(cfg, resolve=True, sort_keys=True)
    log_rank_zero(logger=get_logger("DEBUG"), msg=f"Running {recipe_name} with resolved config:\n\n{text}")


def _has_component(node: Union[Dict[str, Any], DictConfig, Any]) -> bool:
    """True for a mapping with a ``_component_`` key."""
    return (OmegaConf.is_dict(node) or isinstance(node, dict)) and COMPONENT_KEY in node


def _get_component_from_path(path: str) -> Any:
    """The object a dotted path names (``import_component``), with torchtune's errors: ValueError for a
    relative path, InstantiationError for one that does not import."""
    if path == "":
        raise ValueError("Empty path")
    if any(part == "" for part in path.split(".")):
        raise ValueError(f"Error loading '{path}': invalid dotstring.\nRelative imports are not supported.")
    try:
        return import_component(path)
    except ConfigError as exc:
        raise InstantiationError(f"Error loading '{path}': {exc}") from exc


def _merge_yaml_and_cli_args(yaml_args: Namespace, cli_args: List[str], source: Optional[str] = None) -> DictConfig:
    """The config of ``TuneRecipeArgumentParser.parse_known_args``'s two results: its YAML keys with the
    ``key=value`` / ``~key`` / ``+key=value`` overrides applied in order (``config._overrides``)."""
    cfg = OmegaConf.create(vars(yaml_args))
    return apply_overrides(cfg, list(cli_args), source=source)


def _remove_key_by_dotpath(nested_dict: Dict[str, Any], dotpath: str) -> None:
    """torchtune's ``~key`` on a plain dict: delete ``dotpath``, and a parent mapping it leaves empty.

    A component node cannot be removed this way (ValueError); a missing key raises KeyError and a path
    through a value TypeError, as indexing does.
    """
    first, _, rest = dotpath.partition(".")
    if rest:
        _remove_key_by_dotpath(nested_dict[first], rest)
        if nested_dict[first]:
            return
    if _has_component(nested_dict[first]):
        raise OverrideError(f"Removing components from CLI is not supported: ~{dotpath}")
    del nested_dict[first]


__all__ = [
    "InstantiationError",
    "_get_component_from_path",
    "_has_component",
    "_merge_yaml_and_cli_args",
    "_remove_key_by_dotpath",
    "log_config",
]
