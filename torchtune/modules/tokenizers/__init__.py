"""Tokenizers: ``SentencePieceTokenizer`` (Llama2's ``tokenizer.model``), ``TikTokenBaseTokenizer``
(tiktoken BPE files, Llama 3's ``original/tokenizer.model``) and ``HuggingFaceBaseTokenizer``
(``tokenizer.json``), and ``HFModelTokenizer``: a model folder's own tokenizer.json, special tokens and
chat template (Qwen, Mistral, Phi-4). The Llama model tokenizers live in ``torchtune.models``.
``ChatEncoding`` is what both chat tokenizers' ``message_spans`` return: the ids of a conversation and,
per message, its turn and the tokens an assistant writes."""

from torchtune.modules.tokenizers._chat_spans import ChatEncoding
from torchtune.modules.tokenizers._hf_model_tokenizer import HFModelTokenizer
from torchtune.modules.tokenizers._hf_tokenizers import HuggingFaceBaseTokenizer
from torchtune.modules.tokenizers._sentencepiece import SentencePieceTokenizer
from torchtune.modules.tokenizers._tiktoken import TikTokenBaseTokenizer

__all__ = [
    "ChatEncoding",
    "HFModelTokenizer",
    "HuggingFaceBaseTokenizer",
    "SentencePieceTokenizer",
    "TikTokenBaseTokenizer",
]
