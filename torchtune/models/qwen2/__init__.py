"""Qwen2: builders (``qwen2`` is also Qwen2.5's component builder), tokenizer, RoPE and torchtune's weight
conversion functions; Hugging Face folders are read and written by ``torchtune.training.FullModelHFCheckpointer``
through the ``qwen2`` registration in ``torchtune.models.qwen2_5._hf``."""

from torchtune.models.qwen2._component_builders import qwen2, qwen2_mlp
from torchtune.models.qwen2._convert_weights import qwen2_hf_to_tune, qwen2_tune_to_hf
from torchtune.models.qwen2._model_builders import qwen2_0_5b, qwen2_1_5b, qwen2_7b
from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
from torchtune.models.qwen2._tokenizer import QWEN2_SPECIAL_TOKENS, Qwen2Tokenizer, qwen2_tokenizer

__all__ = [
    "Qwen2Tokenizer",
    "QWEN2_SPECIAL_TOKENS",
    "Qwen2RotaryPositionalEmbeddings",
    "qwen2",
    "qwen2_0_5b",
    "qwen2_1_5b",
    "qwen2_7b",
    "qwen2_hf_to_tune",
    "qwen2_mlp",
    "qwen2_tokenizer",
    "qwen2_tune_to_hf",
]
