"""Finding and loading YAML configs: built-in names or paths, typed YAML, clear syntax errors."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Iterable, Optional

import yaml
from omegaconf import DictConfig, OmegaConf

from torchtune import _recipe_registry as registry
from torchtune._errors import ConfigError


class _TuneYamlLoader(yaml.SafeLoader):
    """SafeLoader that reads ``2e-5`` as a float and refuses duplicate keys.

    YAML 1.1 (PyYAML) only calls a number with an exponent a float when it has a dot (``2.0e-5``), so a
    learning rate written ``2e-5`` would silently become a string. A duplicate key is almost always
    a copy-paste mistake whose first value would otherwise be dropped without a word.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key: SafeLoader reports it below
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
# Replace SafeLoader's float resolver with one that also accepts 1e-5 (no dot).
_TuneYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _first in "-+0123456789.":
    _TuneYamlLoader.yaml_implicit_resolvers.setdefault(_first, []).append(("tag:yaml.org,2002:float", _FLOAT))


def parse_yaml_value(text: str) -> Any:
    """Type one ``key=value`` value as YAML would: ints, floats (``2e-5``), bools, ``null``, lists, dicts.

    An empty value is the empty string; text YAML cannot parse (``a: b: c``) is kept as a string.
    """
    if text == "":
        return ""
    try:
        return yaml.load(text, Loader=_TuneYamlLoader)
    except yaml.YAMLError:
        return text


def _yaml_error_message(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "unknown line"
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if context else problem
    return f"Config file {path} is not valid YAML: {where}: {detail}. Fix the YAML at that line."


def load_yaml_file(path: Path) -> DictConfig:
    """Read one YAML config file into a DictConfig; a syntax error names the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc.strerror or exc}.") from exc
    try:
        data = yaml.load(text, Loader=_TuneYamlLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error_message(path, exc)) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {path} must be a YAML mapping of keys to values at the top level, "
            f"but it holds a {type(data).__name__}."
        )
    try:
        return OmegaConf.create(data)
    except Exception as exc:  # omegaconf rejects e.g. non-string keys
        raise ConfigError(f"Config file {path} cannot be loaded: {exc}") from exc


def builtin_config_names() -> list[str]:
    """Names of every built-in config, as ``tune ls`` shows them."""
    return [c.name for r in registry.get_all_recipes() for c in r.configs]


def _looks_like_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or name.startswith((".", "/", "~"))


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
                "missing from this installation; reinstall torchtune or pass a path to a YAML file."
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
    from torchtune.config._overrides import apply_overrides

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
