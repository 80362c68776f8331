"""Qwen2.5's registration (``torchtune.models._hf_family``): ``model_type: qwen2`` (Qwen2 and Qwen2.5
share it), q/k/v biases."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from torchtune.models._hf_family import HFFamily, ModelShape, llama_like_config, llama_like_shape
from torchtune.models.qwen3._hf import refuse_sliding_window


def _shape(config: Dict[str, Any], path: Path) -> ModelShape:
    refuse_sliding_window(config, path, "Qwen2.5")
    return llama_like_shape(config, path, family="Qwen2.5", qkv_bias=True)


FAMILY = HFFamily(
    model_type="QWEN2",
    name="Qwen2.5",
    hf_model_types=("qwen2",),
    architectures=("Qwen2ForCausalLM",),
    builder="torchtune.models.qwen2_5.qwen2_5_0_5b",
    shape=_shape,
    config_json=lambda shape: llama_like_config(
        shape, hf_model_type="qwen2", architecture="Qwen2ForCausalLM", use_sliding_window=False, sliding_window=None
    ),
    aliases=("QWEN2_5",),
)
