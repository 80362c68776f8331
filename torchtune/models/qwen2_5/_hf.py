"""Qwen2 and Qwen2.5's registration (``torchtune.models._hf_family``): ``model_type: qwen2`` (they share
it), q/k/v biases, RoPE over the halves of each head (q/k rows copied as HF stores them)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict

from torchtune.models._hf_family import HFFamily, ModelShape, llama_like_config, llama_like_shape
from torchtune.models.qwen3._hf import refuse_sliding_window


def _shape(config: Dict[str, Any], path: Path) -> ModelShape:
    refuse_sliding_window(config, path, "Qwen2.5")
    shape = llama_like_shape(config, path, family="Qwen2.5", qkv_bias=True)
    return dataclasses.replace(shape, rope_interleaved=False)


FAMILY = HFFamily(
    model_type="QWEN2",
    name="Qwen2 / Qwen2.5",
    hf_model_types=("qwen2",),
    architectures=("Qwen2ForCausalLM",),
    builder="torchtune.models.qwen2_5.qwen2_5_0_5b",
    shape=_shape,
    config_json=lambda shape: llama_like_config(
        shape, hf_model_type="qwen2", architecture="Qwen2ForCausalLM", use_sliding_window=False, sliding_window=None
    ),
    aliases=("QWEN2_5",),
)
