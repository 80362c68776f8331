"""Phi-4's registration (``torchtune.models._hf_family``): ``model_type: phi3`` (Phi-4 uses the Phi-3
architecture), fused ``qkv_proj`` / ``gate_up_proj``, full rotary embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from torchtune.models._hf_family import HFFamily, ModelShape, llama_like_config, llama_like_shape


def _shape(config: Dict[str, Any], path: Path) -> ModelShape:
    window = config.get("sliding_window")
    return llama_like_shape(config, path, family="Phi-4", sliding_window=int(window) if window else None)


FAMILY = HFFamily(
    model_type="PHI4",
    name="Phi-4",
    hf_model_types=("phi3",),
    architectures=("Phi3ForCausalLM",),
    builder="torchtune.models.phi4.phi4_14b",
    shape=_shape,
    config_json=lambda shape: llama_like_config(shape, hf_model_type="phi3", architecture="Phi3ForCausalLM"),
    fused_projections=True,
    aliases=("PHI3", "PHI3_MINI"),
)
