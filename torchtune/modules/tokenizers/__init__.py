"""Tokenizers: ``SentencePieceTokenizer`` (Llama2's ``tokenizer.model`` format)."""

from torchtune.modules.tokenizers._sentencepiece import SentencePieceTokenizer

__all__ = ["SentencePieceTokenizer"]
