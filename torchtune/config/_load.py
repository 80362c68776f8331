"""Finding and loading YAML configs: built-in names or paths, read by OmegaConf, clear syntax errors."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Iterable, Optional, Union

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchtune import _recipe_registry as registry
from torchtune._assets import register_resolver
from torchtune._errors import ConfigError
from torchtune.config._overrides import apply_overrides


def _yaml_error_message(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown line"
    problem = getattr(exc, "problem", None) or str(exc)
    duplicate = re.fullmatch(r"found duplicate key (.+)", problem)
    if duplicate:  # OmegaConf's loader refuses it; its text names the key without quotes
        return (
            f"Config file {path} has a duplicate key '{duplicate.group(1)}' at {where}: a key may appear once "
            "per mapping (the later value would silently replace the earlier one). Remove or rename one of them."
        )
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if context else problem
    return f"Config file {path} is not valid YAML: {where}: {detail}. Fix the YAML at that line."


def _not_a_mapping(path: Path, what: str) -> ConfigError:
    return ConfigError(
        f"Config file {path} must be a YAML mapping of keys to values at the top level, but it holds {what}."
    )


def load_yaml_file(path: Union[str, Path]) -> DictConfig:
    """Read one YAML config file into a DictConfig with ``OmegaConf.load``, as torchtune does.

    OmegaConf's loader reads ``2e-5`` as a float (PyYAML alone keeps it a string), leaves dates as text and
    refuses a duplicate key (it compares string keys, which is what config keys are; two ``1:`` keys
    would pass, the later one winning). A syntax error names the file, line and column; a file that
    does not exist gets ``resolve_config_path``'s message (the built-in configs, the closest names).
    """
    register_resolver()  # ${asset:...}: resolved when a value is read, so before any config exists
    try:
        cfg = OmegaConf.load(str(path))
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_message(Path(path), exc)) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"Cannot read config file {path}: it is not UTF-8 text ({exc.reason}).") from exc
    except FileNotFoundError as exc:
        resolve_config_path(str(path))  # raises the message that lists the built-in configs
        raise ConfigError(f"Cannot read config file {path}: {exc.strerror or exc}.") from exc
    except OSError as exc:
        if exc.errno is not None:  # a folder, no permission
            raise ConfigError(f"Cannot read config file {path}: {exc.strerror or exc}.") from exc
        raise _not_a_mapping(Path(path), "a single value") from exc  # OmegaConf refuses a number or a bool
    except OmegaConfBaseException as exc:  # e.g. a value type OmegaConf cannot hold (!!set)
        key = f" (key '{exc.full_key}')" if getattr(exc, "full_key", None) else ""
        raise ConfigError(f"Config file {path} cannot be loaded{key}: {str(exc).splitlines()[0]}.") from exc
    if not isinstance(cfg, DictConfig):
        raise _not_a_mapping(Path(path), "a list")
    if len(cfg) == 1 and OmegaConf.to_container(cfg)[next(iter(cfg.keys()))] is None:
        if _top_level_is_a_string(Path(path).read_text(encoding="utf-8")):
            raise _not_a_mapping(Path(path), f"the single value {next(iter(cfg.keys()))!r}")
    return cfg


def _top_level_is_a_string(text: str) -> bool:
    # OmegaConf.load turns a file holding only a string ("hello") into {"hello": None}, the same
    # config as the mapping "hello:". Only the YAML node tree tells them apart, and OmegaConf has no
    # switch to refuse it: this is the one piece of YAML reading kept here (the tree is composed, no
    # value is built, and only for a config of a single key).
    return isinstance(yaml.compose(text, Loader=yaml.SafeLoader), yaml.ScalarNode)


def builtin_config_names() -> list[str]:
    """Names of every built-in config, as ``tune ls`` shows them."""
    return [c.name for r in registry.get_all_recipes() for c in r.configs]


def _looks_like_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or name.startswith((".", "/", "~"))


def config_file(name_or_path: str) -> Path:
    """The YAML file ``--config`` names, as torchtune's ``tune run`` finds it: a built-in config's file, else
    the path as given (whether it exists is for the loader to say)."""
    builtin = registry.get_config(str(name_or_path))
    if builtin is not None and not Path(str(name_or_path)).expanduser().is_file():
        return builtin.path
    return Path(str(name_or_path)).expanduser()


def resolve_config_path(name_or_path: str) -> Path:
    """Turn ``--config``'s value into the YAML file to load.

    An existing file wins; otherwise the name is looked up among the built-in configs
    (``llama2/7B_full_low_memory`` -> ``<recipes package>/configs/llama2/7B_full_low_memory.yaml``).
    """
    name = str(name_or_path)
    candidate = Path(name).expanduser()
    if candidate.is_file():
        return candidate.resolve()
    builtin = registry.get_config(name)
    if builtin is not None:
        if not builtin.path.is_file():
            raise ConfigError(
                f"The built-in config '{builtin.name}' is registered but its file {builtin.path} is "
                "missing from this installation; reinstall plaintune or pass a path to a YAML file."
            )
        return builtin.path
    # Unregistered YAMLs shipped under recipes/configs resolve by the same naming convention.
    shipped = registry.builtin_recipes_dir() / "configs" / f"{name}.yaml"
    if not _looks_like_path(name) and shipped.is_file():
        return shipped
    names = builtin_config_names()
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    if candidate.exists():
        what = f"'{name}' is a folder, not a YAML file."
    elif _looks_like_path(name) or "\\" in name:
        what = f"Config file '{name}' does not exist."
    else:
        what = f"'{name}' is neither a config file nor a built-in config."
    raise ConfigError(
        f"{what}{hint} Built-in configs (see `tune ls`): {', '.join(names)}. To use your own config, "
        "pass the path to a YAML file, e.g. --config ./my_config.yaml (start from a copy: "
        "`tune cp llama2/tiny_full ./my_config.yaml`)."
    )


def load_config(name_or_path: str, overrides: Iterable[str] = ()) -> DictConfig:
    """Load a built-in config or YAML file and apply ``key=value`` / ``~key`` / ``+key=value`` overrides."""
    path = resolve_config_path(name_or_path)
    cfg = load_yaml_file(path)
    return apply_overrides(cfg, list(overrides), source=str(path))


def missing_config_message(recipe_name: Optional[str] = None) -> str:
    """The paragraph shown when ``--config`` was not given."""
    recipe = registry.get_recipe(recipe_name) if recipe_name else None
    names = [c.name for c in recipe.configs] if recipe else builtin_config_names()
    which = f"for {recipe.name}" if recipe else "(see `tune ls`)"
    example = names[0] if names else "path/to/config.yaml"
    return (
        f"No config given: pass --config NAME_OR_PATH. Built-in configs {which}: {', '.join(names)}. "
        f"Or pass the path to your own YAML file, e.g. --config ./my_config.yaml. Example: --config {example}"
    )
