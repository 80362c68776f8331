"""Mistral's registration (``torchtune.models._hf_family``): ``model_type: mistral``, Llama-shaped, a
``sliding_window`` (v0.1: 4096; v0.3: null)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from torchtune.models._hf_family import HFFamily, ModelShape, llama_like_config, llama_like_shape


def _shape(config: Dict[str, Any], path: Path) -> ModelShape:
    window = config.get("sliding_window")
    return llama_like_shape(config, path, family="Mistral", sliding_window=int(window) if window else None)


FAMILY = HFFamily(
    model_type="MISTRAL",
    name="Mistral",
    hf_model_types=("mistral",),
    architectures=("MistralForCausalLM",),
    builder="torchtune.models.mistral.mistral_7b_v0_3",
    shape=_shape,
    config_json=lambda shape: llama_like_config(shape, hf_model_type="mistral", architecture="MistralForCausalLM"),
)
