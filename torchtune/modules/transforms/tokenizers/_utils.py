"""The tokenizer protocols, and what model tokenizers without many special tokens share."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Protocol, Tuple

from torchtune._errors import TuneError
from torchtune.data._messages import Message
from torchtune.data._utils import truncate


class BaseTokenizer(Protocol):
    """Text <-> ids, with no knowledge of messages: ``encode`` and ``decode`` (SentencePiece, tiktoken,
    ``tokenizer.json``, GPT-2 BPE files)."""

    def encode(self, text: str, **kwargs: Any) -> List[int]:
        """The ids of ``text``."""
        ...

    def decode(self, token_ids: List[int], **kwargs: Any) -> str:
        """The text of ``token_ids``."""
        ...


class ModelTokenizer(Protocol):
    """A model's tokenizer: its special tokens, the longest sequence it returns, and
    ``tokenize_messages``, which formats a conversation with the model's special tokens and returns the
    ids and a mask (True = the token is not learnt)."""

    special_tokens: Dict[str, int]
    max_seq_len: Optional[int]

    def tokenize_messages(self, messages: List[Message], **kwargs: Any) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)`` of ``messages``."""
        ...


def tokenize_messages_no_special_tokens(
    tokenizer: ModelTokenizer,
    messages: List[Message],
    *,
    bos_id: Optional[int] = None,
    eos_id: Optional[int] = None,
) -> Tuple[List[int], List[bool]]:
    """Tokenize ``messages`` one text piece at a time and join them, adding no special token but ``bos_id``
    at the start of each turn and ``eos_id`` after each assistant message (where given); for tokenizers
    whose chat format is plain text (Llama 2, Mistral, Gemma, with an optional prompt template).

    A SentencePiece tokenizer starts every encoded text with a word-start space; a piece that continues
    a turn (not the turn's first message) is encoded with ``trim_leading_whitespace=True`` unless the
    previous message ended with a space, so the joined ids equal those of the joined text. Trailing
    spaces of each piece are dropped before encoding. Each token's mask is its message's ``masked``.
    With ``tokenizer.max_seq_len``, the result is cut to it (at the end, or at the start where
    ``tokenizer.truncation_type`` is ``"left"``), the last token becoming ``eos_id``.

    Raises:
        TuneError: a content piece that is not text.
    """
    max_seq_len = tokenizer.max_seq_len
    truncation_type = getattr(tokenizer, "truncation_type", "right")
    tokens: List[int] = []
    mask: List[bool] = []
    turn_starts = True
    previous_ends_with_space = False
    masked = False
    for message in messages:
        masked = message.masked
        if turn_starts and bos_id is not None:
            tokens.append(bos_id)
            mask.append(masked)
        trim = not turn_starts and not previous_ends_with_space
        body: List[int] = []
        for piece in message.content:
            if piece["type"] != "text":
                raise TuneError(
                    f"Unsupported message content type: {piece['type']} (this tokenizer reads text only; "
                    f"message role {message.role})."
                )
            body += tokenizer.encode(
                piece["content"].rstrip(" "), add_bos=False, add_eos=False, trim_leading_whitespace=trim
            )
        texts = [piece["content"] for piece in message.content]
        previous_ends_with_space = bool(texts) and texts[-1].endswith(" ")
        tokens += body
        mask += [masked] * len(body)
        turn_starts = message.role == "assistant"
        if turn_starts and eos_id is not None:
            tokens.append(eos_id)
            mask.append(masked)
        if max_seq_len is not None and len(tokens) >= max_seq_len and truncation_type == "right":
            break
    if max_seq_len is not None:
        tokens = truncate(tokens, max_seq_len, eos_id, truncation_type)
        mask = truncate(mask, max_seq_len, masked if eos_id is not None else None, truncation_type)
    return tokens, mask


def parse_hf_tokenizer_json(tokenizer_json_path: str) -> Dict[str, int]:
    """``{special token text: id}`` from the ``added_tokens`` of a Hugging Face ``tokenizer.json``.

    Raises:
        TuneError: the file is missing, not JSON, or has no ``added_tokens`` list.
    """
    try:
        with open(tokenizer_json_path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise TuneError(
            f"Cannot read the special tokens from {tokenizer_json_path} (config key tokenizer.special_tokens_path): "
            f"{err}. Point it at the model folder's tokenizer.json."
        ) from err
    added = data.get("added_tokens") if isinstance(data, dict) else None
    if not isinstance(added, list):
        raise TuneError(
            f"{tokenizer_json_path} (config key tokenizer.special_tokens_path) has no 'added_tokens' list: it "
            "is not a Hugging Face tokenizer.json. Point it at the model folder's tokenizer.json."
        )
    return {token["content"]: int(token["id"]) for token in added}
