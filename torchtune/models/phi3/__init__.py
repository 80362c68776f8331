"""Phi-3 mini (torchtune's ``torchtune.models.phi3``): the tokenizer."""

from torchtune.models.phi3._tokenizer import PHI3_SPECIAL_TOKENS, Phi3MiniTokenizer, phi3_mini_tokenizer

__all__ = ["PHI3_SPECIAL_TOKENS", "Phi3MiniTokenizer", "phi3_mini_tokenizer"]
