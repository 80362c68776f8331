"""Tokenizers (torchtune's ``torchtune.modules.transforms.tokenizers``): the ``BaseTokenizer`` (text <-> ids)
and ``ModelTokenizer`` (messages -> ids and mask) protocols, the base tokenizers of each file format
(SentencePiece, tiktoken, ``tokenizer.json``, GPT-2 ``vocab.json`` + ``merges.txt``), and what model
tokenizers share. The model tokenizers themselves live with their families in ``torchtune.models``."""

from torchtune.modules.transforms.tokenizers._gpt2 import GPT2BaseTokenizer
from torchtune.modules.transforms.tokenizers._hf_tokenizer import HuggingFaceBaseTokenizer
from torchtune.modules.transforms.tokenizers._sentencepiece import SentencePieceBaseTokenizer
from torchtune.modules.transforms.tokenizers._tiktoken import TikTokenBaseTokenizer
from torchtune.modules.transforms.tokenizers._utils import (
    BaseTokenizer,
    ModelTokenizer,
    parse_hf_tokenizer_json,
    tokenize_messages_no_special_tokens,
)

__all__ = [
    "BaseTokenizer",
    "GPT2BaseTokenizer",
    "HuggingFaceBaseTokenizer",
    "ModelTokenizer",
    "SentencePieceBaseTokenizer",
    "TikTokenBaseTokenizer",
    "parse_hf_tokenizer_json",
    "tokenize_messages_no_special_tokens",
]
