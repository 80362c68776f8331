"""Config values checked against type hints, and the value checks a component declares for its arguments.

``validate`` runs both on every ``_component_`` node before anything is built, so a value a user can
type wrong (``loss.num_output_chunks=0``, ``model.num_layers=abc``) is one message naming the key from
``tune validate`` and ``tune run`` alike, instead of a traceback minutes later, after the weights load.

Two sources of checks:

* the callable's type hints: a plain value (``int``, ``float``, ``bool``, ``str``, a path, a list, a
  ``Literal`` or an ``Optional``/``Union`` of those) must fit; a hint naming anything else (a module, a
  tokenizer, ``Any``) is not checked, since the config cannot spell such a value anyway;
* the component's own ``check_config_args(key, fields)`` (see ``CHECK_ATTR``): ranges and relations
  between arguments, without building anything. A class defines it as a static or class method; a
  function gets it with ``@checked_by(fn)``.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import os
import typing
from pathlib import PurePath
from typing import Any, Callable, Mapping, Optional

from torchtune._errors import ConfigError, TuneError

__all__ = ["CHECK_ATTR", "check_type", "checked_by", "component_value_problems", "type_problem", "whole_number"]

# The attribute of a component holding its value checks: ``check_config_args(key, fields)``, where ``key``
# is the config node's dotted key (named in the messages) and ``fields`` its plain values (the keys the
# config sets, resolved; nested components left out). It raises ConfigError naming ``key.argument``.
CHECK_ATTR = "check_config_args"

_NONE = type(None)


def checked_by(check: Callable[[str, Mapping[str, Any]], None]) -> Callable[[Callable], Callable]:
    """Decorate a component function with its value checks (``CHECK_ATTR``); the function is unchanged."""

    def decorate(fn: Callable) -> Callable:
        setattr(fn, CHECK_ATTR, check)
        return fn

    return decorate


def whole_number(key: str, value: Any, minimum: int = 1, allow_none: bool = False, why: str = "") -> None:
    """Raise ConfigError unless ``value`` is an int >= ``minimum`` (or None when ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or null" if allow_none else ""
        raise ConfigError(
            f"{key} must be a whole number of at least {minimum}{why}{extra}, got {value!r}. "
            f"Set {key}={minimum} or more."
        )


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if hint is _NONE or hint is None:
        return "null"
    if origin is typing.Union:
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin is not None:
        return {list: "a list", tuple: "a list", dict: "a mapping"}.get(origin, str(hint))
    if isinstance(hint, type) and issubclass(hint, PurePath):
        return "a path"
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}
    return names.get(hint, {list: "a list", tuple: "a list", dict: "a mapping"}.get(hint, str(hint)))


def _fits(value: Any, hint: Any) -> Optional[bool]:
    """Whether ``value`` (as a config spells it) fits ``hint``; None when the hint is not one to check."""
    if hint is Any or hint is inspect.Parameter.empty:
        return None
    if hint is None or hint is _NONE:
        return value is None
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        results = [_fits(value, a) for a in typing.get_args(hint)]
        if any(r is True for r in results):
            return True
        return None if any(r is None for r in results) else False
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    base = origin or hint
    if base in (list, tuple, collections.abc.Sequence, collections.abc.Iterable):
        return isinstance(value, (list, tuple))
    if base in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if not isinstance(base, type):
        return None
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base is str:
        return isinstance(value, str)
    if issubclass(base, PurePath) or base is os.PathLike:
        return isinstance(value, (str, PurePath))
    return None  # a class the config cannot spell (a module, a tokenizer): not checked here


def type_problem(key: str, value: Any, hint: Any) -> Optional[str]:
    """Why ``value`` does not fit the type hint ``hint``, naming ``key``; None when it fits or cannot be told."""
    if _fits(value, hint) is not False:
        return None
    return f"{key}={value!r} is not {_describe(hint)}; set {key} to {_describe(hint)}"


def check_type(key: str, value: Any, hint: Any) -> None:
    """Raise ConfigError when ``value`` does not fit the type hint ``hint``."""
    problem = type_problem(key, value, hint)
    if problem:
        raise ConfigError(problem + ".")


@functools.lru_cache(maxsize=256)
def _hints(target: Callable) -> Mapping[str, Any]:
    """The evaluated type hints of ``target``'s parameters ({} where they cannot be evaluated)."""
    fn = target.__init__ if isinstance(target, type) else target
    try:
        return typing.get_type_hints(fn)
    except Exception:  # a hint naming something imported only for type checkers: check no types
        return {}


def component_value_problems(target: Callable, key: str, fields: Mapping[str, Any]) -> list[str]:
    """Problems of the plain ``fields`` of the node at ``key`` that builds ``target``: type hints first,
    then the component's own ``check_config_args`` (only when every type fits, so it sees sane values)."""
    try:
        hints = _hints(target)
    except TypeError:  # unhashable callable
        hints = {}
    where = f"{key}." if key else ""
    problems = [
        p
        for name, value in fields.items()
        if name in hints
        for p in [type_problem(where + name, value, hints[name])]
        if p
    ]
    if problems:
        return problems
    check = getattr(target, CHECK_ATTR, None)
    if callable(check):
        try:
            check(key, dict(fields))
        except TuneError as exc:
            problems.append(str(exc))
    return problems
