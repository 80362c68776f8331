"""Checking a whole config before anything is built: every problem at once, each with its key."""

from __future__ import annotations

import inspect
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from torchtune._errors import ConfigError
from torchtune.config._instantiate import import_component, signature_problem

_COMPONENT = "_component_"


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _walk(node: Any, prefix: str, problems: list[str]) -> None:
    if isinstance(node, DictConfig):
        keys = list(node.keys())
    elif isinstance(node, ListConfig):
        keys = list(range(len(node)))
    else:
        return
    for key in keys:
        path = _join(prefix, key)
        if OmegaConf.is_missing(node, key):
            problems.append(f"{path}: has no value (???); set it, e.g. {path}=VALUE")
            continue
        if OmegaConf.is_interpolation(node, key):
            try:
                node[key]
            except Exception as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                problems.append(f"{path}: cannot resolve {OmegaConf.to_container(node)[key]!r}: {reason}")
            continue
        _walk(node[key], path, problems)
    if isinstance(node, DictConfig) and _COMPONENT in keys:
        _check_component(node, prefix, problems)


def _check_component(node: DictConfig, prefix: str, problems: list[str]) -> None:
    key = _join(prefix, _COMPONENT)
    if OmegaConf.is_interpolation(node, _COMPONENT) or OmegaConf.is_missing(node, _COMPONENT):
        return  # reported (or fine) above
    path = node[_COMPONENT]
    try:
        target = import_component(path)
    except ConfigError as exc:
        problems.append(f"{key}: {exc}")
        return
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # no introspectable signature (some builtins): nothing to check
    fields = {str(k): None for k in node.keys() if k != _COMPONENT}
    problem = signature_problem(signature, fields, partial=True)
    if problem:
        problems.append(f"{prefix or '<root>'}: {path}: {problem}")


def validate(cfg: Any) -> None:
    """Check ``cfg`` without building anything; raise one ConfigError listing every problem.

    Checked: every ``_component_`` imports, its sibling keys bind to the callable's signature
    (``inspect.signature(...).bind_partial``; ``**kwargs`` accepts anything), every ``${...}`` resolves
    and no value is left as ``???``.
    """
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    if not isinstance(cfg, (DictConfig, ListConfig)):
        raise ConfigError(f"validate() needs a config mapping, got {type(cfg).__name__}.")
    problems: list[str] = []
    _walk(cfg, "", problems)
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        plural = "s" if len(problems) > 1 else ""
        raise ConfigError(f"The config has {len(problems)} problem{plural}:\n\n{listing}")
