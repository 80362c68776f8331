"""Low-rank optimizers (APOLLO, APOLLO-Mini, GaLore) from their own packages, one instance per parameter.

The ``optimizer`` node names the low-rank class and carries three kinds of keys:

- the class's constructor arguments (``lr``, ``weight_decay``, ``betas``, ...);
- its parameter-group options, given to the target parameters' group only (``rank``, ``proj``,
  ``scale_type``, ``scale``, ``update_proj_gap``, ``proj_type``: the keys apollo-torch and galore-torch
  read from a param group; ``LOW_RANK_OPTIMIZERS`` lists them per class);
- ``target_modules`` (which matrices get the low-rank update: regexes matched against the module path
  or its last part, like transformers' ``optim_target_modules``; the attention and MLP projections by
  default) and ``rest`` (the ``_component_`` node of the optimizer every other parameter gets:
  embeddings, output, norms).

Each parameter gets its own optimizer object (one per decoder layer part with
``optimizer_in_bwd_group: layer``), held by name in an ``OptimInBackwardWrapper`` in both modes, so the
state is saved and restored by parameter name either way (``StepAfterBackward`` steps them after
backward when ``optimizer_in_bwd: False``).

State dicts: the packages keep a projector object in each parameter's state. Recipe states are loaded
with ``weights_only=True``, which refuses Python objects, so ``state_dict`` writes the projector as a
plain dict of its attributes (tensors, numbers, strings) and ``load_state_dict`` rebuilds it, for the
projector classes in ``_PROJECTORS`` only. Loading also keeps each state tensor's own dtype: torch's
``load_state_dict`` would cast it to the parameter's (an fp32 moment of a bf16 weight stepped with
stochastic rounding would lose bits, and the resume would not be exact).

LOMO and AdaLomo (``lomo-optim``) fuse the update into their own backward (``optimizer.fused_backward``
over the whole model) and do not run under per-parameter hooks: they are refused with what to use.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.optim import Optimizer

from torchtune._errors import ConfigError
from torchtune.config._instantiate import COMPONENT_KEY
from torchtune.config._validate import LOW_RANK_GROUP_KEYS
from torchtune.utils._checkpointing._checkpoint_utils import OptimInBackwardWrapper

__all__ = [
    "DEFAULT_TARGET_MODULES",
    "LOW_RANK_OPTIMIZERS",
    "StepAfterBackward",
    "build_low_rank_optimizers",
    "check_low_rank_optimizer",
    "is_low_rank",
    "low_rank_targets",
]

# component -> (pip extra, the param-group keys the class reads for a low-rank parameter); the keys are
# config's table, which tells the config validator that these are not the class's arguments
LOW_RANK_OPTIMIZERS: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    component: (component.split("_torch", 1)[0], keys) for component, keys in LOW_RANK_GROUP_KEYS.items()
}
# Named here so that the error says why and what to use instead, rather than a TypeError from the class.
_REFUSED = {
    "lomo_optim.": (
        "LOMO and AdaLomo update the weights inside their own fused backward (optimizer.fused_backward(loss, lr) "
        "over the whole model, with their own gradient hooks), which cannot run beside this recipe's per-parameter "
        "optimizer hooks or its loss and stochastic rounding"
    ),
    "galore_torch.GaLoreAdamW8bit": (
        "GaLoreAdamW8bit calls torch.cuda.synchronize() for every parameter inside step() (it fails on a CPU build) "
        "and its bitsandbytes load_state_dict bypasses the state hooks a name-keyed resume needs; it is not "
        "supported yet"
    ),
    "galore_torch.adamw8bit.": "the same as galore_torch.GaLoreAdamW8bit",
    "apollo_torch.QAPOLLOAdamW": "the quantized-weight APOLLO variant keeps int8 weights this recipe does not hold",
}
_INSTEAD = (
    "Use apollo_torch.APOLLOAdamW (rank: 1, scale_type: tensor, scale: 128 is APOLLO-Mini), galore_torch.GaLoreAdamW, "
    "or an 8-bit AdamW (bitsandbytes.optim.AdamW8bit, torchao.optim.AdamW8bit)"
)
# Default targets: the attention and MLP projections of every decoder here (torchtune.modules names).
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "output_proj", "w1", "w2", "w3")
# Projector classes whose attributes state_dict writes out and load_state_dict rebuilds.
_PROJECTORS = (
    "apollo_torch.random_projector.GradientProjector",
    "apollo_torch.svd_projector.GaLoreProjector",
    "galore_torch.galore_projector.GaLoreProjector",
)
_PROJECTOR_CLASS_KEY = "__projector__"


# The memory estimator's stand-in (it measures the real class's state on small tensors): its node names the
# real class as optimizer_component and is split like that class's node.
LAYOUT_COMPONENT = "torchtune.training.estimate._memory_estimator.LowRankLayoutOptimizer"


def _component(cfg_optimizer: Any) -> str:
    if cfg_optimizer is None or not hasattr(cfg_optimizer, "get"):
        return ""
    component = str(cfg_optimizer.get(COMPONENT_KEY, ""))
    return str(cfg_optimizer.get("optimizer_component", "")) if component == LAYOUT_COMPONENT else component


def is_low_rank(cfg_optimizer: Any) -> bool:
    """True if the optimizer node names a low-rank optimizer this module builds."""
    return _component(cfg_optimizer) in LOW_RANK_OPTIMIZERS


def _refusal(component: str) -> Optional[str]:
    for prefix, why in _REFUSED.items():
        if component == prefix or (prefix.endswith(".") and component.startswith(prefix)):
            return why
    return None


def _require_package(component: str) -> None:
    extra = LOW_RANK_OPTIMIZERS[component][0]
    module = component.split(".", 1)[0]
    try:
        # found, not imported: apollo_torch imports transformers (seconds), and tune validate imports nothing heavy
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as exc:
        found, why = False, str(exc)
    else:
        why = f"no module named {module!r}"
    if not found:
        raise ConfigError(
            f"optimizer._component_={component} needs the {module} package, which is not installed ({why}). "
            f"Install it with pip install 'plaintune[{extra}]' (or pip install -e '.[{extra}]' in a checkout), "
            "or choose another optimizer, e.g. optimizer._component_=bitsandbytes.optim.AdamW8bit."
        )


def _as_container(node: Any) -> Dict[str, Any]:
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return dict(node)


def split_optimizer_node(cfg_optimizer: Any) -> Tuple[Dict[str, Any], Dict[str, Any], List[str], Dict[str, Any]]:
    """``(constructor node, group options, target patterns, rest node)`` of a low-rank optimizer node.

    Raises:
        ConfigError: a bad ``target_modules`` or ``rest``, or a missing ``rank``.
    """
    node = _as_container(cfg_optimizer)
    component = _component(node)
    group_keys = LOW_RANK_OPTIMIZERS[component][1]
    group = {k: node.pop(k) for k in group_keys if k in node}
    targets = node.pop("target_modules", None)
    rest = node.pop("rest", None)
    if targets is None:
        targets = list(DEFAULT_TARGET_MODULES)
    if isinstance(targets, str) or not isinstance(targets, (list, tuple)) or not targets:
        raise ConfigError(
            f"optimizer.target_modules={targets!r} must be a non-empty list of module-name patterns (regexes matched "
            "against a module's path or its last part), e.g. [q_proj, k_proj, v_proj, output_proj, w1, w2, w3]."
        )
    for pattern in targets:
        try:
            re.compile(str(pattern))
        except re.error as exc:
            raise ConfigError(f"optimizer.target_modules has {pattern!r}, which is not a regex ({exc}).") from exc
    rank = group.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(
            f"optimizer.rank={rank!r}: {component} needs the rank of its low-rank state as a positive integer, "
            "e.g. optimizer.rank=1 (APOLLO-Mini) or optimizer.rank=256."
        )
    if rest is None or not isinstance(rest, dict) or COMPONENT_KEY not in rest:
        raise ConfigError(
            f"optimizer.rest={rest!r}: a low-rank optimizer ({component}) updates only the matrices of "
            "optimizer.target_modules; optimizer.rest names the optimizer of every other parameter (embeddings, "
            "output, norms), e.g. optimizer.rest={_component_: bitsandbytes.optim.AdamW8bit, lr: 2e-5, "
            "weight_decay: 0.0}."
        )
    if is_low_rank(rest) or _refusal(rest[COMPONENT_KEY]):
        raise ConfigError(
            f"optimizer.rest._component_={rest[COMPONENT_KEY]} is a low-rank optimizer: the rest (embeddings, output, "
            "norms) needs a full-rank one, e.g. bitsandbytes.optim.AdamW8bit or torch.optim.AdamW."
        )
    return node, group, [str(t) for t in targets], rest


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def low_rank_targets(model: nn.Module, patterns: Sequence[str]) -> List[str]:
    """Names of the trainable matrices (2-D weights) of modules matching any of ``patterns`` (a regex
    matching the module's path, or its last part), in ``named_parameters`` order.

    Raises:
        ConfigError: a pattern matches no trainable matrix.
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    matched: List[str] = []
    unused = []
    for pattern in patterns:
        regex = re.compile(pattern)
        hits = [
            n
            for n, p in params
            if p.dim() == 2
            and (regex.fullmatch(_module_of(n)) or regex.fullmatch(_module_of(n).rsplit(".", 1)[-1]))
            and not isinstance(_submodule(model, _module_of(n)), nn.Embedding)
        ]
        if not hits:
            unused.append(pattern)
        matched += [n for n in hits if n not in matched]
    if unused:
        examples = sorted({_module_of(n).rsplit(".", 1)[-1] for n, p in params if p.dim() == 2})
        raise ConfigError(
            f"optimizer.target_modules has {unused}, which match no trainable matrix of {type(model).__name__}. "
            f"Its matrices' module names end in {examples}; patterns are regexes matched against a module's whole "
            "path (layers.0.attn.q_proj) or its last part (q_proj). Fix or remove the pattern."
        )
    order = {n: i for i, (n, _) in enumerate(params)}
    return sorted(matched, key=order.__getitem__)


def _submodule(model: nn.Module, path: str) -> nn.Module:
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        return model


def _check_ranks(model: nn.Module, targets: Sequence[str], rank: int, component: str) -> None:
    params = dict(model.named_parameters())
    too_small = [(n, tuple(params[n].shape)) for n in targets if rank > min(params[n].shape)]
    if too_small:
        name, shape = too_small[0]
        raise ConfigError(
            f"optimizer.rank={rank} is larger than the smaller side of {len(too_small)} target matrices of "
            f"{type(model).__name__}, e.g. {name} {list(shape)}: {component} projects each gradient to rank x "
            f"its longer side, so the rank can be at most {min(shape)} there. Lower optimizer.rank, or leave such "
            "matrices out of optimizer.target_modules."
        )


def check_low_rank_optimizer(cfg: Any, model: Optional[nn.Module] = None) -> None:
    """Checks of a low-rank ``optimizer`` node before any weight loads: the package is installed, the
    keys are valid, every target pattern matches a matrix and the rank fits each one. The model is built
    on the meta device from ``cfg.model`` (no memory, no weights) unless given. LOMO/AdaLomo and the
    variants that cannot run under per-parameter hooks are refused.

    Raises:
        ConfigError: naming the key and what to change.
    """
    component = _component(cfg.optimizer)
    why = _refusal(component)
    if why is not None:
        raise ConfigError(f"optimizer._component_={component} cannot be used here: {why}. {_INSTEAD}.")
    if component not in LOW_RANK_OPTIMIZERS:
        return
    _require_package(component)
    _, group, patterns, rest = split_optimizer_node(cfg.optimizer)
    if model is None:
        from torchtune import config

        with torch.device("meta"):
            model = config.instantiate(cfg.model)
    targets = low_rank_targets(model, patterns)
    _check_ranks(model, targets, int(group["rank"]), component)


# --- building -------------------------------------------------------------------------------------


def build_low_rank_optimizers(
    cfg_optimizer: Any,
    model: nn.Module,
    groups: Sequence[Sequence[str]],
    *,
    rest_kwargs: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Optimizer]:
    """``{parameter name: optimizer}``: one low-rank optimizer per group's target matrices, one ``rest``
    optimizer per group's other parameters (``groups``: the names each in-backward optimizer holds).

    ``rest_kwargs`` are extra constructor arguments of the rest optimizer (torchao's
    ``bf16_stochastic_round``).
    """
    from torchtune import config

    component = _component(cfg_optimizer)
    _require_package(component)
    ctor, group_opts, patterns, rest = split_optimizer_node(cfg_optimizer)
    targets = low_rank_targets(model, patterns)
    _check_ranks(model, targets, int(group_opts["rank"]), component)
    if component.startswith("galore_torch.") and "no_deprecation_warning" not in ctor:
        ctor["no_deprecation_warning"] = True  # its FutureWarning is about transformers' copy, not this class
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    target_index = {n: i + 1 for i, n in enumerate(targets)}  # APOLLO seeds its projections 1, 2, ... in order
    optim_map: Dict[str, Optimizer] = {}
    for names in groups:
        low = [n for n in names if n in target_index]
        other = [n for n in names if n not in target_index]
        if low:
            node = OmegaConf.create(ctor)
            opt = config.instantiate(node, [{"params": [params[n] for n in low], **group_opts}])
            if "seed" in opt.state[params[low[0]]]:
                for n in low:
                    opt.state[params[n]]["seed"] = target_index[n]
            _add_state_hooks(opt)
            optim_map.update({n: opt for n in low})
        if other:
            opt = config.instantiate(OmegaConf.create(rest), [params[n] for n in other], **dict(rest_kwargs or {}))
            optim_map.update({n: opt for n in other})
    return optim_map


class StepAfterBackward(OptimInBackwardWrapper):
    """Per-parameter optimizers stepped after backward (``optimizer_in_bwd: False``), keyed by name like
    the in-backward ones, so gradient accumulation and clipping work and a checkpoint resumes in either
    mode. ``step()`` steps every inner optimizer; ``zero_grad()`` frees the gradients."""

    def __init__(self, optim_map: Mapping[str, Optimizer]) -> None:
        super().__init__(optim_map)
        self._by_param = {
            id(p): opt for opt, _ in self._members.values() for group in opt.param_groups for p in group["params"]
        }

    def optimizer_of(self, param: torch.Tensor) -> Optimizer:
        return self._by_param[id(param)]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for opt, _ in self._members.values():
            opt.step()
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt, _ in self._members.values():
            opt.zero_grad(set_to_none=set_to_none)


# --- state dicts that weights_only loading accepts, restored without casts ----------------------------


def _qualname(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _encode(value: Any) -> Any:
    if _qualname(value) in _PROJECTORS:
        return {_PROJECTOR_CLASS_KEY: _qualname(value), **{k: _encode(v) for k, v in vars(value).items()}}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, copy=True)  # a copy: never train in a memory-mapped checkpoint's pages
    if isinstance(value, list):
        return [_decode(v, device) for v in value]
    if isinstance(value, Mapping) and _PROJECTOR_CLASS_KEY in value:
        path = value[_PROJECTOR_CLASS_KEY]
        if path not in _PROJECTORS:
            raise ValueError(f"optimizer state names projector class {path!r}, which is not one of {_PROJECTORS}")
        module, _, name = path.rpartition(".")
        obj = object.__new__(getattr(importlib.import_module(module), name))
        obj.__dict__.update({k: _decode(v, device) for k, v in value.items() if k != _PROJECTOR_CLASS_KEY})
        return obj
    if isinstance(value, Mapping):
        return {k: _decode(v, device) for k, v in value.items()}
    return value


def _state_dict_post_hook(optimizer: Optimizer, state_dict: Dict[str, Any]) -> Dict[str, Any]:
    # torch's state_dict hands out the live per-parameter dicts: copy before replacing the projector
    state_dict["state"] = {pid: {k: _encode(v) for k, v in state.items()} for pid, state in state_dict["state"].items()}
    return state_dict


def _load_pre_hook(optimizer: Optimizer, state_dict: Dict[str, Any]) -> Dict[str, Any]:
    # The state goes around torch's loading (which casts tensors to the parameter's dtype, nested ones too)
    # and is put back by the post hook with each tensor's own dtype.
    optimizer._tune_pending_state = (state_dict["state"], state_dict["param_groups"])  # type: ignore[attr-defined]
    return {**state_dict, "state": {}}


def _load_post_hook(optimizer: Optimizer) -> None:
    saved, groups = optimizer.__dict__.pop("_tune_pending_state")
    ids = [pid for group in groups for pid in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for pid, param in zip(ids, params):
        if pid in saved:
            optimizer.state[param] = _decode(dict(saved[pid]), param.device)


def _add_state_hooks(optimizer: Optimizer) -> None:
    optimizer.register_state_dict_post_hook(_state_dict_post_hook)
    optimizer.register_load_state_dict_pre_hook(_load_pre_hook)
    optimizer.register_load_state_dict_post_hook(_load_post_hook)
