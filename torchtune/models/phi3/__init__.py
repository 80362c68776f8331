"""Phi-3: builders (``phi3`` is also Phi-4's component builder), tokenizer and RoPE; Hugging Face folders are
read and written by ``torchtune.training.FullModelHFCheckpointer`` through the ``phi3`` registration in
``torchtune.models.phi4._hf`` (``checkpointer.model_type: PHI3_MINI``)."""

from torchtune.models.phi3._component_builders import phi3, phi3_mlp
from torchtune.models.phi3._convert_weights import phi3_hf_to_tune, phi3_tune_to_hf
from torchtune.models.phi3._model_builders import phi3_mini
from torchtune.models.phi3._position_embeddings import Phi3RotaryPositionalEmbeddings
from torchtune.models.phi3._tokenizer import PHI3_SPECIAL_TOKENS, Phi3MiniTokenizer, phi3_mini_tokenizer

__all__ = [
    "Phi3MiniTokenizer",
    "PHI3_SPECIAL_TOKENS",
    "Phi3RotaryPositionalEmbeddings",
    "phi3",
    "phi3_hf_to_tune",
    "phi3_mini",
    "phi3_mini_tokenizer",
    "phi3_mlp",
    "phi3_tune_to_hf",
]
