"""Mistral 7B (v0.3; v0.1 with its sliding window): builders and tokenizer; Hugging Face folders are read and written by
``torchtune.training.FullModelHFCheckpointer`` through this family's ``_hf.py`` registration."""

from torchtune.models.mistral._component_builders import mistral
from torchtune.models.mistral._model_builders import (
    mistral_7b,
    mistral_7b_v0_1,
)
from torchtune.models.mistral._prompt_template import MistralChatTemplate
from torchtune.models.mistral._tokenizer import MistralTokenizer, mistral_tokenizer

__all__ = [
    "MistralChatTemplate",
    "MistralTokenizer",
    "mistral",
    "mistral_7b",
    "mistral_7b_v0_1",
    "mistral_tokenizer",
]
