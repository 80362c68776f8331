"""Mistral 7B (v0.1 with its sliding window, v0.3): builders and tokenizer; Hugging Face folders are read and
written by ``torchtune.training.FullModelHFCheckpointer`` through this family's ``_hf.py`` registration."""

from torchtune.models.mistral._component_builders import mistral, mistral_classifier, mistral_mlp
from torchtune.models.mistral._model_builders import (
    mistral_7b,
    mistral_7b_v0_1,
    mistral_7b_v0_3,
    mistral_reward_7b,
)
from torchtune.models.mistral._prompt_template import MistralChatTemplate
from torchtune.models.mistral._tokenizer import MistralTokenizer, mistral_tokenizer

__all__ = [
    "MistralTokenizer",
    "MistralChatTemplate",
    "mistral",
    "mistral_7b",
    "mistral_7b_v0_1",
    "mistral_7b_v0_3",
    "mistral_classifier",
    "mistral_mlp",
    "mistral_reward_7b",
    "mistral_tokenizer",
]
