"""How the dataset builders turn messages into tokens: the ``chat_format`` a builder takes.

- ``"tokenizer"`` (torchtune's, the default): the model tokenizer itself is the model transform; its
  ``tokenize_messages`` applies its prompt template (Llama 2's ``[INST]``), its special tokens (Llama 3's
  headers) or its folder's chat template (``HFModelTokenizer``), and its mask decides the labels. A
  tokenizer without a chat format (``SentencePieceTokenizer``: ``encode`` only) has one way to tokenize
  messages, ``"plain_text"``.
- ``"chat_template"``: the conversation exactly as the model's chat template renders it (transformers'
  ``apply_chat_template``), through the tokenizer's ``message_spans``; an unmasked assistant message learns
  what the assistant writes (its reply and end-of-turn token, not its header). For ``HFModelTokenizer``
  this is what ``"tokenizer"`` gives; for Llama 3 it differs from torchtune's ``tokenize_messages`` (which
  learns the assistant header and appends ``<|end_of_text|>``).
- ``"plain_text"``: the messages' texts joined with no template: BOS first, EOS after each assistant
  message; a continuation is encoded without the SentencePiece word-start space, so an Alpaca prompt and
  its response give the ids of the joined text. This library's instruction datasets did this before they
  followed torchtune.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from torchtune._errors import TuneValueError
from torchtune.data._messages import Message

CHAT_FORMATS = ("tokenizer", "chat_template", "plain_text")


class PlainText:
    """A model transform that encodes messages as plain text (``chat_format: plain_text``).

    Args:
        tokenizer: anything with ``encode(text, add_bos, add_eos, trim_leading_whitespace)``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.max_seq_len: Optional[int] = getattr(tokenizer, "max_seq_len", None)

    def tokenize_messages(
        self, messages: Sequence[Message], add_end_tokens: bool = True
    ) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)``: each message's text encoded in turn (BOS before the first, EOS after each
        assistant message when ``add_end_tokens``), each token masked as its message."""
        tokens: List[int] = []
        mask: List[bool] = []
        for i, message in enumerate(messages):
            if message.contains_media:
                raise TuneValueError(f"chat_format plain_text encodes text only; message {i} holds an image.")
            ids = self.tokenizer.encode(
                message.text_content,
                add_bos=i == 0,
                add_eos=add_end_tokens and message.role == "assistant",
                trim_leading_whitespace=i > 0,
            )
            tokens += ids
            mask += [message.masked] * len(ids)
        return tokens, mask

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """``sample["messages"]`` replaced by ``tokens`` and ``mask`` (``inference``: no EOS at the end)."""
        sample = dict(sample)
        sample["tokens"], sample["mask"] = self.tokenize_messages(sample.pop("messages"), not inference)
        return sample


class ChatTemplate:
    """A model transform that renders messages with the model's chat template (``chat_format:
    chat_template``): the tokenizer's ``message_spans`` give the ids and each message's turn and reply, and
    the messages' ``masked`` flags give the mask (``ChatEncoding.mask``).

    Args:
        tokenizer: a tokenizer with ``message_spans`` (``Llama3Tokenizer``, ``HFModelTokenizer``).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.max_seq_len: Optional[int] = getattr(tokenizer, "max_seq_len", None)

    def tokenize_messages(
        self, messages: Sequence[Message], add_generation_prompt: bool = False
    ) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)`` of the rendered conversation; mask True = not learnt."""
        encoded = self.tokenizer.message_spans(messages, add_generation_prompt=add_generation_prompt)
        return encoded.tokens, encoded.mask([m.masked for m in messages])

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """``sample["messages"]`` replaced by ``tokens`` and ``mask`` (``inference``: with the generation prompt)."""
        sample = dict(sample)
        sample["tokens"], sample["mask"] = self.tokenize_messages(sample.pop("messages"), inference)
        return sample


def has_chat_format(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` is a model tokenizer (it formats messages: ``tokenize_messages``)."""
    return callable(getattr(tokenizer, "tokenize_messages", None))


def model_transform(tokenizer: Any, chat_format: str = "tokenizer") -> Any:
    """The model transform of ``chat_format`` (module docstring) for ``tokenizer``.

    Raises:
        TuneValueError: an unknown ``chat_format``, or ``chat_template`` for a tokenizer without
            ``message_spans``.
    """
    if chat_format not in CHAT_FORMATS:
        raise TuneValueError(
            f"dataset.chat_format={chat_format!r} is not one of {', '.join(CHAT_FORMATS)}: 'tokenizer' formats "
            "messages as the model tokenizer does (torchtune's), 'chat_template' as the model's chat template "
            "renders them (transformers'), 'plain_text' joins their texts with BOS and EOS."
        )
    if chat_format == "plain_text" or (chat_format == "tokenizer" and not has_chat_format(tokenizer)):
        return PlainText(tokenizer)
    if chat_format == "chat_template":
        if not callable(getattr(tokenizer, "message_spans", None)):
            raise TuneValueError(
                f"dataset.chat_format=chat_template renders a model's chat template, which {type(tokenizer).__name__} "
                "does not have: it is there for torchtune.models.llama3.llama3_tokenizer and a model folder's "
                "tokenizer.json (HFModelTokenizer). Use chat_format: tokenizer (this tokenizer's own format)."
            )
        return ChatTemplate(tokenizer)
    return tokenizer
