"""Checks of config values that recipes share: each names the key to change."""

from __future__ import annotations

import importlib.util
from typing import Any, Optional, Union

from omegaconf import DictConfig, ListConfig

from torchtune._errors import ConfigError
from torchtune.config._types import check_type

__all__ = [
    "IN_BWD_GROUPS",
    "RECIPE_VALUE_TYPES",
    "check_liger",
    "check_optimizer_settings",
    "check_value_types",
    "positive_int",
]

# The type of each plain top-level key the recipes read (those with their own range checks, such as
# batch_size, are checked where the range is). A wrong one fails here, at start-up and in `tune validate`,
# instead of where the value is first used (a seed of "abc" in torch.manual_seed, after the model is built).
RECIPE_VALUE_TYPES = {
    "output_dir": str,
    "seed": Optional[int],
    "shuffle": bool,
    "resume_from_checkpoint": bool,
    "optimizer_in_bwd": bool,
    "optimizer_on_cpu": bool,
    "compile": bool,
    "liger_kernels": bool,
    "bf16_stochastic_rounding": bool,
    "enable_activation_checkpointing": bool,
    "enable_activation_offloading": bool,
    "activation_offloading_use_streams": bool,
    "log_peak_memory_stats": bool,
    "fsdp_cpu_offload": bool,
    "fsdp_reshard_after_forward": bool,
    "async_checkpoint": bool,
    "log_level": Optional[str],
    "eval_every_n_steps": Optional[int],
    "results_file": Optional[str],  # null: eval_results.json next to the checkpoint scored
    "prompt": Optional[Union[str, int, float]],  # null: format_prompt says it is empty
    "instruction_template": Optional[str],
}

# optimizer_in_bwd_group: how many parameters one in-backward optimizer steps together
IN_BWD_GROUPS = ("param", "layer")


def positive_int(cfg: Any, key: str, allow_none: bool = False) -> Optional[int]:
    """``cfg[key]`` as a whole number >= 1 (or ``None`` when ``allow_none``).

    Raises:
        ConfigError: naming the key and the value found.
    """
    value = cfg[key]
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or null" if allow_none else ""
        raise ConfigError(f"{key} must be a whole number of at least 1{extra}, got {value!r}. Set {key}=1 or more.")
    return value


def check_value_types(cfg: Any) -> None:
    """Each key of ``RECIPE_VALUE_TYPES`` that ``cfg`` has must have that type.

    Raises:
        ConfigError: naming the key, the value found and the type to set.
    """
    for key, hint in RECIPE_VALUE_TYPES.items():
        if key in cfg:
            check_type(key, cfg[key], hint)


def check_optimizer_settings(cfg: Any) -> None:
    """The optimizer keys that conflict: gradient accumulation and clipping need gradients that
    optimizer in backward frees as soon as they exist; the LR must be a non-negative number.

    Raises:
        ConfigError: naming the conflicting keys and the settings that work.
    """
    in_bwd = bool(cfg.optimizer_in_bwd)
    # a recipe that has the key requires it (check_recipe_keys); one without it steps per parameter
    group = cfg.optimizer_in_bwd_group if "optimizer_in_bwd_group" in cfg else "param"
    if group not in IN_BWD_GROUPS:
        raise ConfigError(
            f"optimizer_in_bwd_group={group!r} is not a grouping: use 'param' (one optimizer per parameter, each "
            "gradient freed as soon as it is complete) or 'layer' (one optimizer per decoder layer, stepped by one "
            "foreach/fused call when the layer's last gradient arrives)."
        )
    if bool(cfg.get("optimizer_on_cpu", False)) and not (in_bwd and group == "param"):
        raise ConfigError(
            "optimizer_on_cpu=True steps each parameter on the host as soon as its gradient has been copied there: "
            f"it needs optimizer_in_bwd=True and optimizer_in_bwd_group=param (got optimizer_in_bwd={in_bwd}, "
            f"optimizer_in_bwd_group={group}). Set those, or optimizer_on_cpu=False."
        )
    accumulation = positive_int(cfg, "gradient_accumulation_steps")
    if in_bwd and accumulation > 1:
        raise ConfigError(
            f"gradient_accumulation_steps={accumulation} cannot be used with optimizer_in_bwd=True: each "
            "gradient is consumed by its optimizer and freed during backward, so there is nothing left to "
            "accumulate. Set gradient_accumulation_steps=1 (raise batch_size instead), or set optimizer_in_bwd=False."
        )
    clip = cfg.clip_grad_norm
    if clip is not None:
        if in_bwd:
            raise ConfigError(
                f"clip_grad_norm={clip} cannot be used with optimizer_in_bwd=True: each parameter is updated as "
                "soon as its gradient exists, before the global norm is known. Set clip_grad_norm=null, or set "
                "optimizer_in_bwd=False."
            )
        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip <= 0:
            raise ConfigError(f"clip_grad_norm must be a positive number or null, got {clip!r}.")
    from torchtune.training.optim._low_rank import check_low_rank_optimizer

    check_low_rank_optimizer(cfg)  # package, keys, target patterns and ranks, on a meta-device model
    node = cfg.optimizer if isinstance(cfg.optimizer, DictConfig) else {}
    lr = node.get("lr")
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0):
        raise ConfigError(f"optimizer.lr must be a non-negative number, got {lr!r}. Set e.g. optimizer.lr=2e-5.")
    # Checked here, not from the optimizer's signature: an optimizer package (bitsandbytes) is imported only
    # when the optimizer is built, and every optimizer reads these the same way.
    for key, low in (("weight_decay", 0.0), ("eps", 0.0), ("momentum", 0.0)):
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < low):
            raise ConfigError(
                f"optimizer.{key} must be a number >= {low:g}, got {value!r}. Set e.g. optimizer.{key}=0.0."
            )
    betas = node.get("betas")
    if betas is not None and not (
        isinstance(betas, (ListConfig, list, tuple))
        and len(betas) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)
    ):
        raise ConfigError(
            f"optimizer.betas must be two numbers in [0, 1), got {betas!r}. Set e.g. optimizer.betas=[0.9,0.999]."
        )


LIGER_LOSS = "torchtune.modules.loss.LigerLinearCrossEntropyLoss"


def check_liger(cfg: Any) -> None:
    """``liger_kernels: True`` and the liger loss (``loss._component_``) run liger-kernel's Triton kernels:
    they need a CUDA device and the package, checked here before anything is built.

    Raises:
        ConfigError: naming the key and the plain PyTorch setting that runs anywhere.
    """
    from torchtune import utils

    asked = []
    if bool(cfg.get("liger_kernels", False)):
        asked.append(("liger_kernels=True", "set liger_kernels=False"))
    loss = cfg.get("loss")
    if isinstance(loss, DictConfig) and str(loss.get("_component_", "")) == LIGER_LOSS:
        asked.append(
            (f"loss._component_={LIGER_LOSS}", "set loss._component_=torchtune.modules.loss.ChunkedCrossEntropyLoss")
        )
    if not asked:
        return
    keys = " and ".join(key for key, _ in asked)
    plain = " and ".join(fix for _, fix in asked)
    run, need = ("runs", "needs") if len(asked) == 1 else ("run", "need")
    device = utils.parse_device(cfg.device)
    if device.type != "cuda":
        raise ConfigError(
            f"{keys} {run} liger-kernel's Triton kernels, which need a CUDA GPU, but device={cfg.device}. "
            f"For the plain PyTorch path (same results, any device) {plain}."
        )
    # found, not imported: importing it takes a second and imports Triton
    if importlib.util.find_spec("liger_kernel") is None:
        raise ConfigError(
            f"{keys} {need} the liger-kernel package, which is not installed. Install it "
            f"with pip install 'plaintune[liger]', or {plain} for the plain PyTorch path."
        )
