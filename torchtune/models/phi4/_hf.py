"""Phi-3 and Phi-4's registration (``torchtune.models._hf_family``): ``model_type: phi3`` (Phi-3, Phi-4 and
Phi-4-mini share the architecture), fused ``qkv_proj`` / ``gate_up_proj``, rotary embeddings over the halves
of the whole head (Phi-3, Phi-4) or of part of it with LongRoPE (Phi-4-mini), read from either spelling of
config.json."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from torchtune._errors import TuneError
from torchtune.models._hf_family import (
    HFFamily,
    ModelShape,
    llama_like_config,
    llama_like_shape,
    longrope_scaling,
)

_ROPE_KEYS = ("rope_parameters", "rope_scaling", "partial_rotary_factor")


def _rope(config: Dict[str, Any], path: Path, head_dim: int) -> Tuple[float, Optional[int], Optional[tuple]]:
    """``(rope_base, rotary_dim, rope_scaling)`` as transformers' Phi-3 reads them: the hub's spelling
    (``rope_theta``, ``partial_rotary_factor``, ``rope_scaling`` at the top) or transformers 5's
    (``rope_parameters``); ``original_max_position_embeddings`` at the top wins, as there."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise TuneError(f"{path}: rope_parameters / rope_scaling must be an object, got {params!r}.")
    base = float(params.get("rope_theta", config.get("rope_theta", 10_000.0)))
    partial = float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) or 1.0)
    rotary_dim = int(head_dim * partial)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in ("su", "yarn"):  # older names that transformers' Phi-3 config reads as longrope
        rope_type = "longrope"
    if rope_type == "default":
        return base, (rotary_dim if rotary_dim != head_dim else None), None
    if rope_type != "longrope":
        raise TuneError(
            f"{path} asks for RoPE scaling of type '{rope_type}'; Phi-3 models (Phi-4, Phi-4-mini) use plain RoPE "
            "or longrope, as transformers' Phi3 implements them. Use the config.json that came with the weights."
        )
    factors = {}
    for key in ("short_factor", "long_factor"):
        values = params.get(key)
        if not isinstance(values, list) or len(values) != rotary_dim // 2:
            raise TuneError(
                f"{path}: longrope needs rope_scaling.{key}, a list of {rotary_dim // 2} numbers (one per rotated "
                f"channel pair of {rotary_dim}), got {values!r}. Use the config.json that came with the weights."
            )
        factors[key] = values
    max_positions = config.get("max_position_embeddings")
    original = config.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
    original = int(original or max_positions)
    factor = params.get("factor") or int(max_positions or original) / original
    attention = params.get("attention_factor")
    if attention is None:
        from torchtune.modules.position_embeddings import longrope_attention_factor

        attention = longrope_attention_factor(float(factor), original)
    scaling = longrope_scaling(factors["short_factor"], factors["long_factor"], original, factor, attention)
    return base, (rotary_dim if rotary_dim != head_dim else None), scaling


def _shape(config: Dict[str, Any], path: Path) -> ModelShape:
    window = config.get("sliding_window")
    plain = {k: v for k, v in config.items() if k not in _ROPE_KEYS}
    shape = llama_like_shape(plain, path, family="Phi-4", sliding_window=int(window) if window else None)
    base, rotary_dim, scaling = _rope(config, path, shape.head_dim)
    return dataclasses.replace(
        shape, rope_base=base, rotary_dim=rotary_dim, rope_scaling=scaling, rope_interleaved=False
    )


def _config_json(shape: ModelShape) -> Dict[str, Any]:
    extra: Dict[str, Any] = {}
    if shape.rotary_dim is not None:
        extra["partial_rotary_factor"] = shape.rotary_dim / shape.head_dim
    if shape.rope_scaling is not None:
        scaling = dict(shape.rope_scaling)
        extra["original_max_position_embeddings"] = scaling.pop("original_max_position_embeddings")
        extra["rope_scaling"] = {k: list(v) if isinstance(v, tuple) else v for k, v in scaling.items()}
    return llama_like_config(shape, hf_model_type="phi3", architecture="Phi3ForCausalLM", **extra)


FAMILY = HFFamily(
    model_type="PHI4",
    name="Phi-3 / Phi-4",
    hf_model_types=("phi3",),
    architectures=("Phi3ForCausalLM",),
    builder="torchtune.models.phi4.phi4_14b",
    shape=_shape,
    config_json=_config_json,
    fused_projections=True,
    aliases=("PHI3", "PHI3_MINI", "PHI4_MINI"),
)
