"""Gemma 2: builders (the tokenizer is Gemma's); Hugging Face folders are read and written by
``torchtune.training.FullModelHFCheckpointer`` through this family's ``_hf.py`` registration
(``checkpointer.model_type: GEMMA2``)."""

from torchtune.models.gemma._tokenizer import gemma_tokenizer
from torchtune.models.gemma2._component_builders import gemma2
from torchtune.models.gemma2._model_builders import gemma2_2b, gemma2_9b, gemma2_27b

__all__ = ["gemma2", "gemma2_27b", "gemma2_2b", "gemma2_9b", "gemma_tokenizer"]
