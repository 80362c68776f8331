"""Qwen2.5 (0.5B-72B): builders and tokenizer; Hugging Face folders are read and written by
``torchtune.training.FullModelHFCheckpointer`` through this family's ``_hf.py`` registration."""

from torchtune.models.qwen2_5._component_builders import qwen2_5
from torchtune.models.qwen2_5._model_builders import (
    qwen2_5_0_5b,
    qwen2_5_1_5b,
    qwen2_5_1_5b_base,
    qwen2_5_1_5b_instruct,
    qwen2_5_3b,
    qwen2_5_7b,
    qwen2_5_7b_base,
    qwen2_5_7b_instruct,
    qwen2_5_14b,
    qwen2_5_14b_base,
    qwen2_5_14b_instruct,
    qwen2_5_32b,
    qwen2_5_32b_base,
    qwen2_5_32b_instruct,
    qwen2_5_72b_base,
    qwen2_5_72b_instruct,
)
from torchtune.models.qwen2_5._tokenizer import QWEN2_5_SPECIAL_TOKENS, Qwen2_5Tokenizer, qwen2_5_tokenizer

__all__ = [
    "Qwen2_5Tokenizer",
    "QWEN2_5_SPECIAL_TOKENS",
    "qwen2_5",
    "qwen2_5_0_5b",
    "qwen2_5_14b",
    "qwen2_5_14b_base",
    "qwen2_5_14b_instruct",
    "qwen2_5_1_5b",
    "qwen2_5_1_5b_base",
    "qwen2_5_1_5b_instruct",
    "qwen2_5_32b",
    "qwen2_5_32b_base",
    "qwen2_5_32b_instruct",
    "qwen2_5_3b",
    "qwen2_5_72b_base",
    "qwen2_5_72b_instruct",
    "qwen2_5_7b",
    "qwen2_5_7b_base",
    "qwen2_5_7b_instruct",
    "qwen2_5_tokenizer",
]
