"""What of torchtune 0.6.1 this library does not ship, recognised by name so that a torchtune recipe, config
or component outside its scope gets one paragraph saying so, before anything is imported or loaded.

This library is full finetuning (one device or FSDP2) of decoder-only language models, with evaluation
and generation. Out of scope: parameter-efficient finetuning (LoRA, QLoRA, DoRA), quantization-aware
training (QAT) and post-training quantization, knowledge distillation, preference and RL training (DPO,
PPO), multimodal models and LayerSkip (early exit).
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = [
    "out_of_scope_component",
    "out_of_scope_config",
    "out_of_scope_message",
    "out_of_scope_name",
    "out_of_scope_recipe",
]

# What each kind of out-of-scope work is called in the messages.
_KINDS = {
    "lora": "LoRA/QLoRA/DoRA (parameter-efficient finetuning)",
    "qat": "quantization-aware training (QAT) and quantization",
    "kd": "knowledge distillation",
    "dpo": "preference training (DPO)",
    "ppo": "RL training (PPO)",
    "vision": "multimodal models",
    "early_exit": "LayerSkip (early exit)",
}

# torchtune's recipe names outside the scope.
_RECIPES = {
    "lora_finetune_single_device": "lora",
    "lora_finetune_distributed": "lora",
    "lora_dpo_single_device": "dpo",
    "lora_dpo_distributed": "dpo",
    "full_dpo_distributed": "dpo",
    "ppo_full_finetune_single_device": "ppo",
    "knowledge_distillation_single_device": "kd",
    "knowledge_distillation_distributed": "kd",
    "qat_distributed": "qat",
    "qat_single_device": "qat",
    "qat_lora_finetune_distributed": "qat",
    "quantize": "qat",
    "dev/early_exit_finetune_distributed": "early_exit",
}

# Parts of a config name ("llama3_2/1B_qat_lora" -> 1B, qat, lora) that name out-of-scope work.
_NAME_PARTS = {
    "lora": "lora",
    "qlora": "lora",
    "dora": "lora",
    "qdora": "lora",
    "qat": "qat",
    "quantization": "qat",
    "kd": "kd",
    "dpo": "dpo",
    "ppo": "ppo",
    "vision": "vision",
    "exit": "early_exit",
}

# Dotted-path patterns of torchtune components outside the scope.
_COMPONENTS = (
    (re.compile(r"^torchtune\.models\.\w+\.(q?lora|q?dora)_\w+$"), "lora"),
    (re.compile(r"^torchtune\.modules\.peft(\.|$)"), "lora"),
    (re.compile(r"^torchtune\.training\.quantization(\.|$)"), "qat"),
    (re.compile(r"\.\w*QATQuantizer$"), "qat"),
    (re.compile(r"^torchtune\.modules\.loss\.\w*KL\w*Loss$"), "kd"),
    (re.compile(r"^torchtune\.(rlhf|modules\.rlhf)(\.|$)"), "dpo"),
    (re.compile(r"^torchtune\.datasets\.(stack_exchange_paired|hh_rlhf_helpful|preference)_dataset$"), "dpo"),
    (re.compile(r"^torchtune\.models\.(llama3_2_vision|clip|flamingo|llama4)(\.|$)"), "vision"),
    (re.compile(r"^torchtune\.datasets\.multimodal(\.|$)"), "vision"),
    (re.compile(r"^torchtune\.modules\.(early_exit_loss|layer_dropout)(\.|$)"), "early_exit"),
)

# Top-level keys only the out-of-scope recipes read.
_KEYS = {
    "teacher_model": "kd",
    "teacher_checkpointer": "kd",
    "kd_loss": "kd",
    "kd_ratio": "kd",
    "quantizer": "qat",
    "ref_checkpointer": "dpo",
    "reward_and_value_model": "ppo",
    "ref_policy_checkpointer": "ppo",
    "save_adapter_weights_only": "lora",
    "early_exit_loss": "early_exit",
    "layer_dropout": "early_exit",
}


def out_of_scope_message(what: str, kind: str) -> str:
    """The paragraph for ``what`` (a recipe, config, component or key, named) of out-of-scope ``kind``."""
    return (
        f"{what} is torchtune's {_KINDS[kind]}, which is out of this library's scope: it ships full finetuning "
        "(full_finetune_single_device, full_finetune_distributed) of decoder-only language models, with "
        "eleuther_eval and generate. Run that recipe with torchtune itself, or finetune every weight here with a "
        "full-finetune config of the same model (`tune ls` lists them; docs/torchtune.md maps torchtune's names)."
    )


def out_of_scope_recipe(name: str) -> Optional[str]:
    """The kind of out-of-scope work of one of torchtune's recipe names, or None."""
    return _RECIPES.get(name)


def out_of_scope_name(name: str) -> Optional[str]:
    """The kind of out-of-scope work a torchtune recipe or config name names, or None."""
    if name in _RECIPES:
        return _RECIPES[name]
    stem = re.sub(r"\.(ya?ml|py)$", "", name)
    for part in re.split(r"[/_]", stem.lower()):
        if part in _NAME_PARTS:
            return _NAME_PARTS[part]
    return None


def out_of_scope_component(path: Any) -> Optional[str]:
    """The kind of out-of-scope work a ``_component_`` path names, or None."""
    if not isinstance(path, str):
        return None
    return next((kind for pattern, kind in _COMPONENTS if pattern.search(path)), None)


def _components(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, DictConfig):
        for key in node.keys():
            path = f"{prefix}.{key}" if prefix else str(key)
            if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
                continue
            value = node[key]
            if key == "_component_":
                yield path, value
            else:
                yield from _components(value, path)
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            if not (OmegaConf.is_interpolation(node, i) or OmegaConf.is_missing(node, i)):
                yield from _components(node[i], f"{prefix}.{i}")


def out_of_scope_config(cfg: Any) -> Optional[str]:
    """The paragraph for the first out-of-scope component or key of ``cfg`` (nothing is imported), or None."""
    if not isinstance(cfg, DictConfig):
        return None
    for key in cfg.keys():
        if str(key) in _KEYS:
            return out_of_scope_message(f"The config key '{key}'", _KEYS[str(key)])
    for path, component in _components(cfg, ""):
        kind = out_of_scope_component(component)
        if kind is not None:
            return out_of_scope_message(f"{path}: {component}", kind)
    return None
