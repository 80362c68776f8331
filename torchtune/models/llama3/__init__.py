"""Llama 3: builders (``llama3``, ``llama3_8b``, ``llama3_70b``), and the tokenizer and chat format shared by
Llama 3.1 and 3.2 (their builders live in ``torchtune.models.llama3_1`` and ``torchtune.models.llama3_2``).
Weight conversion is Llama2's: ``torchtune.models.llama2.hf_to_tune`` / ``tune_to_hf``."""

from torchtune.models.llama3._component_builders import llama3, llama3_mlp
from torchtune.models.llama3._model_builders import llama3_8b, llama3_70b
from torchtune.models.llama3._parallelism import base_llama_tp_plan
from torchtune.models.llama3._tokenizer import (
    CHAT_ROLES,
    LLAMA3_SPECIAL_TOKENS,
    LLAMA3_SPLIT_PATTERN,
    Llama3Tokenizer,
    llama3_tokenizer,
)

__all__ = [
    "CHAT_ROLES",
    "LLAMA3_SPECIAL_TOKENS",
    "LLAMA3_SPLIT_PATTERN",
    "Llama3Tokenizer",
    "base_llama_tp_plan",
    "llama3",
    "llama3_70b",
    "llama3_8b",
    "llama3_mlp",
    "llama3_tokenizer",
]
