"""Phi-4 (14B) and Phi-4-mini (3.8B): builders and tokenizer; Hugging Face folders are read and written by
``torchtune.training.FullModelHFCheckpointer`` through this family's ``_hf.py`` registration."""

from torchtune.models.phi4._component_builders import phi4
from torchtune.models.phi4._model_builders import (
    phi4_14b,
    phi4_mini,
)
from torchtune.models.phi4._tokenizer import PHI4_SPECIAL_TOKENS, Phi4Tokenizer, phi4_tokenizer

__all__ = [
    "Phi4Tokenizer",
    "PHI4_SPECIAL_TOKENS",
    "phi4",
    "phi4_14b",
    "phi4_mini",
    "phi4_tokenizer",
]
