"""Building objects from ``_component_`` nodes: the one way a string becomes a Python object."""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from typing import Any, Callable, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from torchtune._distribution import install_hint
from torchtune._errors import ConfigError
from torchtune._quiet import quiet_import

# The key whose value names the object a config node builds; the one place it is spelled.
COMPONENT_KEY = "_component_"


def import_component(path: str, key: Optional[str] = None) -> Any:
    """Import the dotted ``path`` (``torch.optim.AdamW``): the longest importable module, then attributes.

    ``key`` (the config key holding the path) is named in the error when the import fails.
    """
    where = f"'{key}' = " if key else ""
    if not isinstance(path, str) or not path.strip() or any(not p.isidentifier() for p in path.split(".")):
        raise ConfigError(
            f"{where}{path!r} is not a dotted Python path; _component_ must name an importable object "
            "such as torch.optim.AdamW."
        )
    parts = path.split(".")
    module = None
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            with quiet_import(name):  # torchao's "Failed to load" lines of CUDA kernels it does not need
                module = importlib.import_module(name)
            break
        except ModuleNotFoundError as exc:
            # Only "this very module does not exist" means: try a shorter prefix. A module that exists but
            # fails to import something else (a missing optional dependency) is reported as such.
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise ConfigError(
                    f"Cannot import {where}'{path}': module '{name}' needs '{exc.name}', which is not "
                    f"installed. Install it ({install_hint(exc.name)}) or choose another component."
                ) from exc
            if i == 1:
                raise ConfigError(
                    f"Cannot import {where}'{path}': there is no module named '{exc.name}'. Check the spelling, "
                    f"or install the package that provides it ({install_hint(exc.name)})."
                ) from exc
        except ImportError as exc:
            raise ConfigError(f"Cannot import {where}'{path}': importing '{name}' failed: {exc}") from exc
    obj: Any = module
    for j, attr in enumerate(parts[i:], start=i):
        if not hasattr(obj, attr):
            owner = ".".join(parts[:j])
            close = difflib.get_close_matches(attr, [a for a in dir(obj) if not a.startswith("_")], n=3)
            hint = f" Did you mean {' or '.join(f'{owner}.{c}' for c in close)}?" if close else ""
            raise ConfigError(f"Cannot import {where}'{path}': '{owner}' has no attribute '{attr}'.{hint}")
        obj = getattr(obj, attr)
    return obj


def _inspect_signature(target: Callable) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):  # some builtins have no signature; let the call itself decide
        return None


_cached_signature = functools.lru_cache(maxsize=512)(_inspect_signature)


def component_signature(target: Callable) -> Optional[inspect.Signature]:
    """``inspect.signature(target)``, or None where it has none; computed once per callable.

    The same component is checked by ``validate`` and again by ``instantiate``, and the optimizer node
    of the optimizer-in-backward recipe is built once per parameter (291 times for Llama2-7B). A
    callable that cannot be a cache key (an instance with ``__eq__`` but no ``__hash__``) is inspected
    every time instead.
    """
    try:
        return _cached_signature(target)
    except TypeError:  # unhashable: the cache cannot key it
        return _inspect_signature(target)


def unexpected_keys(signature: inspect.Signature, fields: dict) -> list[str]:
    """The keys of ``fields`` that no keyword parameter of ``signature`` takes (none with ``**kwargs``)."""
    params = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    keyword_ok = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return [k for k in fields if k not in keyword_ok]


def signature_problem(
    signature: inspect.Signature, fields: dict, args: tuple = (), partial: bool = False
) -> Optional[str]:
    """Why ``fields`` (and ``args``) cannot be passed to a callable with ``signature``, or None.

    Unknown keys are named first, with the closest accepted names: that is the usual typo.
    """
    params = signature.parameters
    accepted = [
        n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and not n.startswith("_")
    ]
    keyword_ok = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = unexpected_keys(signature, fields)
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, keyword_ok, n=1)
            hints.append(f"'{k}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        return (
            f"got an unexpected keyword argument {', '.join(hints)}"
            f"{'' if len(unknown) == 1 else ' (unexpected keys)'}; it accepts: {', '.join(accepted)}"
        )
    try:
        (signature.bind_partial if partial else signature.bind)(*args, **fields)
    except TypeError as exc:
        return f"{exc}; it accepts: {', '.join(accepted)}"
    return None


def node_key(node: Any) -> Optional[str]:
    """The dotted key of a config node inside its root config (None for a root or a plain dict)."""
    try:
        key = node._get_full_key(None)  # omegaconf keeps the parent chain of every node
    except Exception:
        return None
    return key or None


def _to_python(node: Any, key: Optional[str]) -> Any:
    """Resolve ``${...}`` interpolations and turn omegaconf containers into dicts and lists."""
    if isinstance(node, (DictConfig, ListConfig)):
        try:
            return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
        except Exception as exc:  # InterpolationResolutionError, MissingMandatoryValue, ...
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"Cannot resolve config node '{key or '<root>'}': {reason}") from exc
    if isinstance(node, dict):
        return {k: _to_python(v, f"{key}.{k}" if key else str(k)) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_to_python(v, f"{key}.{i}" if key else str(i)) for i, v in enumerate(node)]
    return node


def _build(value: Any, key: str) -> Any:
    """Build every ``_component_`` mapping inside ``value``, innermost first."""
    if isinstance(value, dict):
        if COMPONENT_KEY in value:
            return _call(value, key, (), {})
        return {k: _build(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_build(v, f"{key}.{i}" if key else str(i)) for i, v in enumerate(value)]
    return value


def _call(fields: dict, key: str, args: tuple, kwargs: dict) -> Any:
    fields = dict(fields)
    path = fields.pop(COMPONENT_KEY)
    target = import_component(path, f"{key}.{COMPONENT_KEY}" if key else COMPONENT_KEY)
    built = {k: _build(v, f"{key}.{k}" if key else str(k)) for k, v in fields.items()}
    built.update(kwargs)  # the caller's kwargs win over the config's fields
    if not callable(target):
        raise ConfigError(f"'{key or '<root>'}._component_' = '{path}' is not callable.")
    signature = component_signature(target)
    if signature is not None:
        problem = signature_problem(signature, built, args)
        if problem:
            raise ConfigError(
                f"Cannot build '{key or '<root>'}' ({path}): {problem}. Fix the keys of that config node."
            )
    return target(*args, **built)


def instantiate(node: Any, *args: Any, **kwargs: Any) -> Any:
    """Build the object a ``_component_`` node describes.

    ``node['_component_']`` is imported (``torch.optim.AdamW``) and called with ``*args`` and the node's
    other fields merged with ``kwargs`` (``kwargs`` win). Nested ``_component_`` nodes are built first,
    ``${...}`` interpolations are resolved, and plain nested mappings/lists arrive as dicts/lists.
    ``None`` gives ``None`` (an optional component switched off in YAML).
    """
    if node is None:
        return None
    key = node_key(node)
    if not isinstance(node, (DictConfig, dict)):
        raise ConfigError(
            f"instantiate() needs a config mapping with a _component_ key, but '{key or '<node>'}' is "
            f"{type(node).__name__} {node!r}."
        )
    fields = _to_python(node, key)
    if COMPONENT_KEY not in fields:
        raise ConfigError(
            f"Config node '{key or '<root>'}' has no _component_ key, so there is nothing to instantiate; "
            f"add e.g. '_component_: torch.optim.AdamW' to it in the YAML, or "
            f"+{key or 'NODE'}._component_=torch.optim.AdamW on the command line (its keys are: "
            f"{', '.join(map(str, fields))})."
        )
    return _call(fields, key or "", args, kwargs)


def _create_component(target: Callable, args: tuple, kwargs: dict) -> Any:
    """torchtune's name for calling a component: ``target(*args, **kwargs)``."""
    return target(*args, **kwargs)


def _instantiate_node(node: Any, *args: Any) -> Any:
    """torchtune's name for ``instantiate`` of a node that must be a component (InstantiationError if not)."""
    if not ((OmegaConf.is_dict(node) or isinstance(node, dict)) and COMPONENT_KEY in node):
        from torchtune.config._errors import InstantiationError

        raise InstantiationError(
            f"Cannot instantiate specified object {node!r}: it is not a mapping with a {COMPONENT_KEY} key "
            "naming a dotted path (e.g. torch.optim.AdamW)."
        )
    return instantiate(node, *args)
