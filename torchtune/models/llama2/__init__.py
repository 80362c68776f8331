"""Llama2: builders, tokenizer and checkpoint-format conversion."""

from torchtune.models.llama2._component_builders import llama2, llama2_classifier, llama2_mlp
from torchtune.models.llama2._convert_weights import (
    hf_to_tune,
    iter_tune_to_hf,
    meta_to_tune,
    tune_to_hf,
    tune_to_meta,
)
from torchtune.models.llama2._model_builders import llama2_7b, llama2_13b, llama2_70b, llama2_tiny
from torchtune.models.llama2._model_utils import scale_hidden_dim_for_mlp
from torchtune.models.llama2._prompt_template import Llama2ChatTemplate
from torchtune.models.llama2._tokenizer import Llama2Tokenizer, llama2_tokenizer

__all__ = [
    "Llama2Tokenizer",
    "Llama2ChatTemplate",
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
