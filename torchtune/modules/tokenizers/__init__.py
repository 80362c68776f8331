"""Tokenizers: ``SentencePieceTokenizer`` (Llama2's ``tokenizer.model``), ``TikTokenBaseTokenizer``
(tiktoken BPE files, Llama 3's ``original/tokenizer.model``) and ``HuggingFaceBaseTokenizer``
(``tokenizer.json``). The model tokenizers built on the last two live in ``torchtune.models``."""

from torchtune.modules.tokenizers._hf_tokenizers import HuggingFaceBaseTokenizer
from torchtune.modules.tokenizers._sentencepiece import SentencePieceTokenizer
from torchtune.modules.tokenizers._tiktoken import TikTokenBaseTokenizer

__all__ = ["HuggingFaceBaseTokenizer", "SentencePieceTokenizer", "TikTokenBaseTokenizer"]
