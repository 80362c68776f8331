"""Checking a whole config before anything is built: every problem at once, each with its key."""

from __future__ import annotations

import difflib
import sys
from typing import Any, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from torchtune._errors import ConfigError
from torchtune._scope import out_of_scope_config
from torchtune.config._errors import InstantiationError
from torchtune.config._instantiate import (
    COMPONENT_KEY,
    component_signature,
    import_component,
    signature_problem,
    unexpected_keys,
)
from torchtune.config._source_signature import source_signature
from torchtune.config._types import component_value_problems

# Keys of a component node that the code building it consumes before calling the class, so they are not
# the class's arguments: a low-rank optimizer's param-group options, target patterns and the optimizer of
# the other parameters (torchtune.training.optim._low_rank builds it; it reads this table).
_APOLLO_GROUP_KEYS = ("rank", "proj", "scale_type", "scale", "update_proj_gap", "proj_type")
_GALORE_GROUP_KEYS = ("rank", "update_proj_gap", "scale", "proj_type")
LOW_RANK_GROUP_KEYS: dict[str, tuple[str, ...]] = {
    "apollo_torch.APOLLOAdamW": _APOLLO_GROUP_KEYS,
    "apollo_torch.apollo.AdamW": _APOLLO_GROUP_KEYS,
    "galore_torch.GaLoreAdamW": _GALORE_GROUP_KEYS,
    "galore_torch.adamw.AdamW": _GALORE_GROUP_KEYS,
}
LOW_RANK_OWN_KEYS = ("target_modules", "rest")


def _builder_keys(path: Any) -> tuple[str, ...]:
    keys = LOW_RANK_GROUP_KEYS.get(str(path))
    return keys + LOW_RANK_OWN_KEYS if keys else ()


def _join(prefix: str, key: Any) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def _walk(node: Any, prefix: str, problems: list[str], errors: list[Exception], import_components: bool = True) -> None:
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
            errors.append(ValueError(problems[-1]))
            continue
        if OmegaConf.is_interpolation(node, key):
            try:
                node[key]
            except Exception as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                problems.append(f"{path}: cannot resolve {OmegaConf.to_container(node)[key]!r}: {reason}")
                errors.append(ValueError(problems[-1]))
            continue
        _walk(node[key], path, problems, errors, import_components)
    if isinstance(node, DictConfig) and COMPONENT_KEY in keys:
        _check_component(node, prefix, problems, errors, import_components)


def _check_component(
    node: DictConfig, prefix: str, problems: list[str], errors: list[Exception], import_components: bool = True
) -> None:
    key = _join(prefix, COMPONENT_KEY)
    if OmegaConf.is_interpolation(node, COMPONENT_KEY) or OmegaConf.is_missing(node, COMPONENT_KEY):
        return  # reported (or fine) above
    path = node[COMPONENT_KEY]
    consumed = _builder_keys(path)
    fields = {str(k): None for k in node.keys() if k != COMPONENT_KEY and str(k) not in consumed}
    if not import_components and isinstance(path, str) and path.split(".")[0] not in sys.modules:
        signature = source_signature(path)
        if signature is not None and signature_problem(signature, fields, partial=True) is None:
            return  # the source says the keys fit; a problem is confirmed by importing, below
    try:
        target = import_component(path)
    except ConfigError as exc:
        problems.append(f"{key}: {exc}")
        errors.append(InstantiationError(f"{key}: {exc}"))
        return
    signature = component_signature(target)
    if signature is None:
        return  # no introspectable signature (some builtins): nothing to check
    problem = signature_problem(signature, fields, partial=True)
    if problem:
        problems.append(f"{prefix or '<root>'}: {path}: {problem}")
        errors.append(_signature_error(target, signature, fields))
        return
    plain = {k: v for k, v in _plain_fields(node).items() if k not in consumed}
    for value_problem in component_value_problems(target, prefix, plain):
        problems.append(value_problem)
        errors.append(ValueError(value_problem))


def _signature_error(target: Any, signature: Any, fields: dict) -> TypeError:
    """The TypeError calling ``target`` with ``fields`` raises, named as torchtune's ``ConfigError.errors``
    hold it (``get_dtype got an unexpected keyword argument 'dummy'``)."""
    name = getattr(target, "__name__", type(target).__name__)
    unknown = unexpected_keys(signature, fields)
    if unknown:
        return TypeError(f"{name} got an unexpected keyword argument '{unknown[0]}'")
    try:
        signature.bind_partial(**fields)
    except TypeError as exc:
        return TypeError(f"{name} {exc}")
    return TypeError(f"{name}: its arguments do not fit {sorted(fields)}")


def _plain_fields(node: DictConfig) -> dict:
    """The node's values as the component receives them, less nested components (built objects by then)
    and values that do not resolve (reported already)."""
    fields = {}
    for key in node.keys():
        if key == COMPONENT_KEY or OmegaConf.is_missing(node, key):
            continue
        try:
            value = node[key]
            if isinstance(value, DictConfig) and COMPONENT_KEY in value:
                continue
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
        except Exception:  # an interpolation that does not resolve: reported by _walk
            continue
        fields[str(key)] = value
    return fields


def validate(cfg: Any, import_components: bool = True) -> None:
    """Check ``cfg`` without building anything; raise one ConfigError listing every problem.

    A config for work outside this library's scope (a torchtune LoRA, QAT, distillation, DPO or PPO config) is
    refused first, in one paragraph naming the component or key, before any component is imported.

    Checked: every ``_component_`` imports, its sibling keys bind to the callable's signature
    (``inspect.signature(...).bind_partial``; ``**kwargs`` accepts anything), every ``${...}`` resolves
    and no value is left as ``???``. With ``import_components=False`` (``tune validate``) a component
    whose package is not imported yet is first checked against its source (``_source_signature``),
    which takes milliseconds where importing bitsandbytes takes seconds; it is imported only when the
    source does not settle it.
    """
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    if not isinstance(cfg, (DictConfig, ListConfig)):
        raise ConfigError(f"validate() needs a config mapping, got {type(cfg).__name__}.")
    scope = out_of_scope_config(cfg)  # a torchtune LoRA/QAT/KD/DPO/PPO config: one paragraph, nothing imported
    if scope is not None:
        raise ConfigError(scope)
    problems: list[str] = []
    errors: list[Exception] = []  # one per problem, as torchtune's ConfigError.errors holds them
    _walk(cfg, "", problems, errors, import_components)
    if len(problems) == 1:
        raise ConfigError(problems[0] if problems[0].endswith(".") else problems[0] + ".", errors=errors)
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"The config has {len(problems)} problems:\n\n{listing}", errors=errors)


def check_recipe_keys(cfg: Any, recipe_keys: Sequence[str], recipe_name: str, shipped_config: str) -> None:
    """Refuse top-level keys a recipe does not read (typos) and keys it reads but the config lacks.

    Args:
        cfg: the loaded config.
        recipe_keys: every top-level key the recipe reads.
        recipe_name: named in the error.
        shipped_config: a built-in config that has every key, named in the error for ``tune cp``.

    Raises:
        ConfigError: listing each unknown key (with the closest known ones) and each missing key.
    """
    keys = set(cfg.keys())
    problems = []
    for key in sorted(keys - set(recipe_keys)):
        close = difflib.get_close_matches(key, recipe_keys, n=2)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        problems.append(f"unknown key '{key}'{hint}")
    missing = [k for k in recipe_keys if k not in keys]
    if missing:
        problems.append("missing key(s) " + ", ".join(missing))
    if problems:
        add = ""
        if missing:
            shown = " ".join(f"+{key}={_shipped_value(shipped_config, key)}" for key in missing)
            add = (
                f" Add the missing keys to the YAML, or on the command line with a + (a key the config does not "
                f"have is added only with one): {shown} (the values of {shipped_config})."
            )
        raise ConfigError(
            f"The config does not fit the {recipe_name} recipe: "
            + "; ".join(problems)
            + f". docs/recipe.md lists every key this recipe reads, and its shipped config spells each one out "
            f"(tune cp {shipped_config} .)."
            + (" Remove or fix the unknown keys." if keys - set(recipe_keys) else "")
            + add
        )


def _shipped_value(shipped_config: str, key: str) -> str:
    """``key``'s value in the shipped config, as an override writes it (``VALUE`` when it cannot be read)."""
    try:
        from omegaconf import OmegaConf

        from torchtune.config._load import resolve_config_path

        value = OmegaConf.to_container(OmegaConf.load(resolve_config_path(shipped_config)), resolve=False).get(key)
    except Exception:  # noqa: BLE001 - only a hint: the message stands without it
        return "VALUE"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        import json

        return "'" + json.dumps(value).replace('"', "") + "'"
    return str(value)
