"""Qwen2 (torchtune's ``torchtune.models.qwen2``): the tokenizer."""

from torchtune.models.qwen2._tokenizer import QWEN2_SPECIAL_TOKENS, Qwen2Tokenizer, qwen2_tokenizer

__all__ = ["QWEN2_SPECIAL_TOKENS", "Qwen2Tokenizer", "qwen2_tokenizer"]
