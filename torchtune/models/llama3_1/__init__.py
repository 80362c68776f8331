"""Llama 3.1: builders (scaled RoPE, grouped-query attention). Tokenizer: ``torchtune.models.llama3``."""

from torchtune.models.llama3_1._component_builders import llama3_1
from torchtune.models.llama3_1._model_builders import llama3_1_8b, llama3_1_70b, llama3_1_405b
from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

__all__ = ["Llama3ScaledRoPE", "llama3_1", "llama3_1_405b", "llama3_1_70b", "llama3_1_8b"]
