"""Gemma (torchtune's ``torchtune.models.gemma``): the tokenizer."""

from torchtune.models.gemma._tokenizer import GemmaTokenizer, gemma_tokenizer

__all__ = ["GemmaTokenizer", "gemma_tokenizer"]
