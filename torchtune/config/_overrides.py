"""Command-line overrides of a loaded config: torchtune's grammar, plus ``+key=value``.

Applied left to right:

* ``key=value``      set ``key``, or add it when the config has no such key (as torchtune's command line
                     does); ``key`` is a dotted path (``optimizer.lr``, list items by index:
                     ``layers.0.dim``) and ``value`` is typed as YAML (``2e-5`` is a float, ``null``,
                     ``true``, ``[1, 2]``, ``{a: 1}``); ``None`` is null and a number written with leading
                     zeros stays text (``max_filename=00030``), as torchtune reads them.
* ``key=pkg.mod.Cls`` on a node that has ``_component_`` swaps the component and keeps its other fields.
* ``~key``           delete a key.
* ``+key=value``     add a key that is not in the config (an error if it is: then ``key=value`` sets it).

A misspelled key is not caught here (``key=value`` may add any key): the recipe's key check and the
component signature check (``config.validate``) name it and suggest the key meant.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterator, Optional, Sequence

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from torchtune._errors import ConfigError, OverrideError
from torchtune.config._instantiate import COMPONENT_KEY

_LEADING_ZEROS = re.compile(r"[+-]?0[0-9_]+")


def parse_override_value(text: str) -> Any:
    """Type one ``key=value`` value as OmegaConf's command line does (``OmegaConf.from_dotlist``).

    That is OmegaConf's YAML reading: ints, floats (``2e-5``), bools, ``null``, lists, dicts, ``${...}``
    kept as an interpolation. An empty value (``key=``) is the empty string, where OmegaConf would read
    null (``key=null`` says null); text YAML cannot parse (``a: b: c``) stays a string. As on torchtune's
    command line, ``None`` is null and an integer written with leading zeros (``00030``) stays text.
    """
    if text == "":
        return ""
    if text == "None" or _LEADING_ZEROS.fullmatch(text):
        # torchtune's command line reads None as null and keeps 00030 as text (YAML would read octal 24)
        return None if text == "None" else text
    try:
        parsed = OmegaConf.from_dotlist([f"value={text}"])
    except yaml.YAMLError as exc:
        if str(getattr(exc, "problem", "")).startswith("found duplicate key"):
            raise  # {a: 1, a: 2} parses, but one of its values would be dropped
        return text
    return OmegaConf.to_container(parsed)["value"]


def iter_key_paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key path in ``node`` (sections and leaves), without resolving interpolations."""
    if isinstance(node, DictConfig):
        items = [(str(k), _raw_child(node, k)) for k in node.keys()]
    elif isinstance(node, ListConfig):
        items = [(str(i), _raw_child(node, i)) for i in range(len(node))]
    else:
        return
    for key, child in items:
        path = f"{prefix}.{key}" if prefix else key
        yield path
        yield from iter_key_paths(child, path)


def _raw_child(container: Any, key: Any) -> Any:
    """A child value without resolving ``${...}`` or failing on ``???`` (those count as leaves)."""
    if OmegaConf.is_missing(container, key) or OmegaConf.is_interpolation(container, key):
        return None
    return container[key]


def suggest_keys(cfg: DictConfig, key: str, n: int = 3) -> list[str]:
    """Existing key paths close to ``key``: similar spellings, or the same last part elsewhere."""
    paths = list(iter_key_paths(cfg))
    # Prefer spellings at the same depth: `optimizer.lrr` -> `optimizer.lr`, not `optimizer`.
    depth = key.count(".")
    close = difflib.get_close_matches(key, [p for p in paths if p.count(".") == depth], n=n, cutoff=0.6)
    close = close or difflib.get_close_matches(key, paths, n=n, cutoff=0.6)
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [p for p in paths if p.rsplit(".", 1)[-1] == leaf and p not in close]
    return (close + same_leaf)[:n]


def _unknown_key(cfg: DictConfig, key: str, override: str, source: Optional[str], why: str) -> ConfigError:
    close = suggest_keys(cfg, key)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    where = f" ({source})" if source else ""
    return ConfigError(
        f"Override '{override}': {why}{where}.{hint} Keys are dotted paths into the YAML (e.g. optimizer.lr)."
    )


def _locate(cfg: DictConfig, key: str, override: str, source: Optional[str], create: bool = False):
    """Return (container, last part) for dotted ``key``; missing parent mappings are added when ``create``."""
    parts = key.split(".")
    if not key or any(p == "" for p in parts):
        raise OverrideError(f"Override '{override}': '{key}' is not a valid dotted key (e.g. optimizer.lr).")
    node: Any = cfg
    walked: list[str] = []
    for part in parts[:-1]:
        walked.append(part)
        child = _child(node, part)
        if child is _ABSENT:
            if not create or isinstance(node, ListConfig):
                raise _unknown_key(
                    cfg, key, override, source, f"key '{key}' is not in the config (it has no '{'.'.join(walked)}')"
                )
            node[part] = {}
            child = node[part]
        if not isinstance(child, (DictConfig, ListConfig)):
            raise ConfigError(
                f"Override '{override}': '{'.'.join(walked)}' is a value ({child!r}), not a section, so "
                f"it has no key '{parts[len(walked)]}'. Set it directly with {'.'.join(walked)}=VALUE."
            )
        node = child
    return node, parts[-1]


class _Absent:
    pass


_ABSENT = _Absent()


def _child(node: Any, part: str) -> Any:
    if isinstance(node, DictConfig):
        return _raw_child(node, part) if part in node.keys() else _ABSENT
    if isinstance(node, ListConfig) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
        return _raw_child(node, int(part))
    return _ABSENT


def _index(node: Any, part: str) -> Any:
    return int(part) if isinstance(node, ListConfig) else part


def apply_override(cfg: DictConfig, override: str, source: Optional[str] = None) -> None:
    """Apply one override (see the module docstring) to ``cfg`` in place."""
    if override.startswith("~"):
        key = override[1:]
        if "=" in key:
            raise OverrideError(
                f"Override '{override}': '~key' deletes a key and takes no value; write '~{key.split('=')[0]}'."
            )
        container, last = _locate(cfg, key, override, source)
        if _child(container, last) is _ABSENT:
            raise _unknown_key(cfg, key, override, source, f"key '{key}' is not in the config")
        del container[_index(container, last)]
        return

    if "=" not in override:
        raise OverrideError(
            f"Command-line overrides must be in the form of key=value (or ~key to delete a key), got '{override}'; "
            "e.g. batch_size=4 or optimizer.lr=2e-5."
        )
    key, text = override.split("=", 1)
    key = key.strip()
    try:
        value = parse_override_value(text)
    except (OmegaConfBaseException, yaml.YAMLError) as exc:  # a duplicate key, a value type such as !!set
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"Override '{override}' cannot be applied: {problem}.") from exc
    adding = key.startswith("+")
    if adding:
        key = key[1:]
    container, last = _locate(cfg, key, override, source, create=True)
    current = _child(container, last)
    if current is _ABSENT:
        if isinstance(container, ListConfig):
            raise _unknown_key(
                cfg, key, override, source, f"the list at '{key.rsplit('.', 1)[0]}' has no item {last} to set"
            )
        _assign(container, last, value, override)
        return
    if adding:
        # torchtune's command line would add a key literally named '+{key}'; here '+' means "add", and the
        # key is already there: say which spelling sets it.
        raise ConfigError(
            f"Override '{override}': key '{key}' already exists, and '+{key}=' only adds a key that is not in "
            f"the config. To change its value write '{key}={text}'."
        )
    if isinstance(current, DictConfig) and value is not None and not isinstance(value, dict):
        if COMPONENT_KEY in current.keys() and not isinstance(value, list):
            # Swap the component, keep its other fields (torchtune's `optimizer=torch.optim.SGD`).
            current[COMPONENT_KEY] = value
            return
        fields = ", ".join(str(k) for k in current.keys())
        raise ConfigError(
            f"Override '{override}': '{key}' is a section (keys: {fields}), not a single value. Set one of "
            f"its keys ({key}.KEY=VALUE), replace it with a mapping ({key}={{a: 1}}), or set it to null."
        )
    _assign(container, _index(container, last), value, override)


def _assign(container: Any, key: Any, value: Any, override: str) -> None:
    try:
        container[key] = value
    except Exception as exc:  # omegaconf validation (e.g. unsupported value types)
        raise ConfigError(f"Override '{override}' cannot be applied: {exc}") from exc


def apply_overrides(cfg: DictConfig, overrides: Sequence[str], source: Optional[str] = None) -> DictConfig:
    """Apply ``overrides`` in order to ``cfg`` (in place) and return it; ``source`` names the file in errors."""
    for override in overrides:
        apply_override(cfg, override, source)
    return cfg
