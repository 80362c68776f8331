"""Gemma 3 (text): builders, weight conversion, the Hugging Face config reading and the tokenizer."""

from torchtune.models.gemma3._component_builders import gemma3, gemma3_layer_types
from torchtune.models.gemma3._convert_weights import hf_to_tune, iter_tune_to_hf, tune_to_hf
from torchtune.models.gemma3._model_builders import (
    gemma3_1b,
    gemma3_4b,
    gemma3_12b,
    gemma3_27b,
    gemma3_tiny,
    gemma3_tokenizer,
)

__all__ = [
    "gemma3",
    "gemma3_12b",
    "gemma3_1b",
    "gemma3_27b",
    "gemma3_4b",
    "gemma3_layer_types",
    "gemma3_tiny",
    "gemma3_tokenizer",
    "hf_to_tune",
    "iter_tune_to_hf",
    "tune_to_hf",
]
