"""Qwen3's registration (``torchtune.models._hf_family``): ``model_type: qwen3``, q/k norm, no biases
unless ``attention_bias``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from torchtune._errors import TuneError
from torchtune.models._hf_family import HFFamily, ModelShape, llama_like_config, llama_like_shape


def refuse_sliding_window(config: Dict[str, Any], path: Path, family: str) -> None:
    """Qwen configs carry a ``sliding_window`` size that only ``use_sliding_window: true`` switches on
    (for the layers from ``max_window_layers``); no published checkpoint does."""
    if config.get("use_sliding_window"):
        raise TuneError(
            f"{path} has use_sliding_window: true; the {family} models here implement full attention in every "
            "layer, as every published checkpoint uses it. Set use_sliding_window: false (the published value)."
        )


def _shape(config: Dict[str, Any], path: Path) -> ModelShape:
    refuse_sliding_window(config, path, "Qwen3")
    bias = bool(config.get("attention_bias", False))
    return llama_like_shape(config, path, family="Qwen3", qkv_bias=bias, output_bias=bias, qk_norm=True)


FAMILY = HFFamily(
    model_type="QWEN3",
    name="Qwen3",
    hf_model_types=("qwen3",),
    architectures=("Qwen3ForCausalLM",),
    builder="torchtune.models.qwen3.qwen3_0_6b",
    shape=_shape,
    config_json=lambda shape: llama_like_config(
        shape,
        hf_model_type="qwen3",
        architecture="Qwen3ForCausalLM",
        attention_bias=shape.qkv_bias,
        use_sliding_window=False,
        sliding_window=None,
    ),
)
