"""Qwen3 (dense 0.6B-32B): builders and tokenizer; Hugging Face folders are read and written by
``torchtune.training.FullModelHFCheckpointer`` through this family's ``_hf.py`` registration."""

from torchtune.models.qwen3._component_builders import qwen3
from torchtune.models.qwen3._model_builders import (
    qwen3_0_6b,
    qwen3_1_7b,
    qwen3_4b,
    qwen3_8b,
    qwen3_14b,
    qwen3_32b,
    qwen3_tokenizer,
)

__all__ = [
    "qwen3",
    "qwen3_0_6b",
    "qwen3_14b",
    "qwen3_1_7b",
    "qwen3_32b",
    "qwen3_4b",
    "qwen3_8b",
    "qwen3_tokenizer",
]
