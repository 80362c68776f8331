"""Llama2: builders, tokenizer and checkpoint-format conversion."""

from torchtune.models.llama2._component_builders import llama2, llama2_classifier, llama2_mlp
from torchtune.models.llama2._convert_weights import (
    hf_to_tune,
    iter_tune_to_hf,
    meta_to_tune,
    tune_to_hf,
    tune_to_meta,
)
from torchtune.models.llama2._model_builders import llama2_7b, llama2_13b, llama2_70b, llama2_tiny, llama2_tokenizer
from torchtune.models.llama2._model_utils import scale_hidden_dim_for_mlp

__all__ = [
    "hf_to_tune",
    "iter_tune_to_hf",
    "llama2",
    "llama2_classifier",
    "llama2_mlp",
    "llama2_13b",
    "llama2_70b",
    "llama2_7b",
    "llama2_tiny",
    "llama2_tokenizer",
    "meta_to_tune",
    "scale_hidden_dim_for_mlp",
    "tune_to_hf",
    "tune_to_meta",
]
