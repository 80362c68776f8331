"""Llama 3.2 (text, 1B and 3B): builders with tied embeddings. Tokenizer: ``torchtune.models.llama3``."""

from torchtune.models.llama3_2._component_builders import llama3_2
from torchtune.models.llama3_2._model_builders import llama3_2_1b, llama3_2_3b

__all__ = ["llama3_2", "llama3_2_1b", "llama3_2_3b"]
