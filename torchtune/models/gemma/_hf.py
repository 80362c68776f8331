"""Gemma (1)'s registration (``torchtune.models._hf_family``): ``model_type: gemma``, Llama's weight names
and rotary permutation; what makes it Gemma (the ``sqrt(hidden_size)`` embedding scale, ``1 + weight``
norms, tanh-GELU feed-forward, tied embeddings) is checked on the built model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict

from torchtune._errors import TuneError
from torchtune.models._hf_family import HFFamily, ModelShape, llama_like_config, llama_like_shape

# transformers reads Gemma's legacy "gelu" as the tanh approximation too (GemmaConfig's warning says so)
_TANH_GELU = ("gelu", "gelu_pytorch_tanh")


def _shape(config: Dict[str, Any], path: Path) -> ModelShape:
    activation = config.get("hidden_act") or config.get("hidden_activation") or "gelu_pytorch_tanh"
    if activation not in _TANH_GELU or config.get("attention_bias"):
        raise TuneError(
            f"{path} sets hidden_act={activation!r}, attention_bias={config.get('attention_bias')!r}; the Gemma "
            "models here are the published ones (tanh GELU, no attention biases). Use a Gemma checkpoint's config.json."
        )
    shape = llama_like_shape(config, path, family="Gemma")
    return dataclasses.replace(shape, tie_word_embeddings=bool(config.get("tie_word_embeddings", True)), gemma=True)


FAMILY = HFFamily(
    model_type="GEMMA",
    name="Gemma",
    hf_model_types=("gemma",),
    architectures=("GemmaForCausalLM",),
    builder="torchtune.models.gemma.gemma_2b",
    shape=_shape,
    config_json=lambda shape: llama_like_config(
        shape, hf_model_type="gemma", architecture="GemmaForCausalLM", hidden_act="gelu_pytorch_tanh"
    ),
)
