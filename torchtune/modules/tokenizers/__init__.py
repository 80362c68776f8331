"""Tokenizers at their older import path: torchtune's protocols and base tokenizers (defined in
``torchtune.modules.transforms.tokenizers``, re-exported here as torchtune does), this library's
``SentencePieceTokenizer`` (a SentencePiece model for the instruction datasets), and ``HFModelTokenizer``: a
model folder's own ``tokenizer.json``, special tokens and chat template (Qwen, Mistral, Phi-4, Gemma 3), a
torchtune model tokenizer (``tokenize_messages`` -> tokens and mask, ``__call__`` on ``{"messages": ...}``).
``ChatEncoding`` is what the chat tokenizers' ``message_spans`` return: the ids of a conversation and, per
message, its turn and the tokens an assistant writes."""

from torchtune.modules.tokenizers._chat_spans import ChatEncoding
from torchtune.modules.tokenizers._hf_model_tokenizer import HFModelTokenizer
from torchtune.modules.transforms.tokenizers import (
    BaseTokenizer,
    GPT2BaseTokenizer,
    HuggingFaceBaseTokenizer,
    ModelTokenizer,
    SentencePieceBaseTokenizer,
    TikTokenBaseTokenizer,
    parse_hf_tokenizer_json,
    tokenize_messages_no_special_tokens,
)
from torchtune.modules.transforms.tokenizers._sentencepiece import SentencePieceTokenizer

__all__ = [
    "ChatEncoding",
    "BaseTokenizer",
    "GPT2BaseTokenizer",
    "HFModelTokenizer",
    "HuggingFaceBaseTokenizer",
    "ModelTokenizer",
    "SentencePieceBaseTokenizer",
    "SentencePieceTokenizer",
    "TikTokenBaseTokenizer",
    "parse_hf_tokenizer_json",
    "tokenize_messages_no_special_tokens",
]
