"""Llama 3.x's tokenizer: tiktoken BPE (``original/tokenizer.model``) or ``tokenizer.json``, with the
Llama 3 special tokens and chat format (torchtune's ``Llama3Tokenizer``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from torchtune._errors import TuneError, TuneValueError
from torchtune.config._types import checked_by
from torchtune.data import Message, PromptTemplate, truncate
from torchtune.modules.tokenizers._chat_spans import ChatEncoding
from torchtune.modules.tokenizers._checks import check_tokenizer_args
from torchtune.modules.transforms import Transform
from torchtune.modules.transforms.tokenizers import ModelTokenizer
from torchtune.modules.transforms.tokenizers._format import (
    DESCRIPTIONS,
    HF_TOKENIZER_JSON,
    SENTENCEPIECE,
    TIKTOKEN,
    sniff_tokenizer_format,
)

# Llama 3's pre-tokenization regex (the cl100k pattern): contractions, letter runs with one leading
# non-letter, numbers of up to 3 digits, punctuation runs, newlines, other whitespace.
CL100K_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT_PATTERN = CL100K_PATTERN  # this library's earlier name

# The special tokens torchtune gives a tiktoken file, at fixed ids after Llama 3's 128000 BPE ranks:
# Llama 3.1's named tokens, <|step_id|> and the Llama 3.2 Vision media tokens, then reserved tokens.
SPECIAL_TOKENS: Dict[str, int] = {
    "<|begin_of_text|>": 128000,
    "<|end_of_text|>": 128001,
    "<|reserved_special_token_0|>": 128002,
    "<|reserved_special_token_1|>": 128003,
    "<|finetune_right_pad_id|>": 128004,
    "<|step_id|>": 128005,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eom_id|>": 128008,
    "<|eot_id|>": 128009,
    "<|python_tag|>": 128010,
    "<|image|>": 128256,
    "<|video|>": 128012,
}
NUM_RESERVED_SPECIAL_TOKENS = 256
RESERVED_TOKENS: Dict[str, int] = {
    f"<|reserved_special_token_{2 + i}|>": 128013 + i for i in range(NUM_RESERVED_SPECIAL_TOKENS - len(SPECIAL_TOKENS))
}
LLAMA3_SPECIAL_TOKENS: Dict[str, int] = {**SPECIAL_TOKENS, **RESERVED_TOKENS}

# What the chat format, BOS and EOS need; special tokens without one of them are not Llama 3's.
_REQUIRED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
# Media tokens: only an image or video in a message produces them, never text.
_MEDIA = ("<|image|>", "<|video|>")

CHAT_ROLES = ("system", "user", "assistant", "ipython")
_TOKENIZER_HINT = (
    "`tune download meta-llama/Llama-3.2-1B --output-dir /tmp/Llama-3.2-1B` puts the tiktoken file at "
    "/tmp/Llama-3.2-1B/original/tokenizer.model and a tokenizer.json beside config.json; tokenizer.path "
    "may name either."
)
_SPECIAL_TEXT = re.compile(r"<\|.*?\|>")
_HEADER_TEXT = re.compile(r"<\|start_header_id\|>.*?<\|end_header_id\|>\n\n")


class Llama3Tokenizer(ModelTokenizer, Transform):
    """Llama 3.x's tokenizer, read from the tiktoken ``tokenizer.model`` (through ``tiktoken``) or a Hugging
    Face ``tokenizer.json`` (through ``tokenizers``).

    Special tokens: given as ``special_tokens``; else, for a tiktoken file, torchtune's
    ``LLAMA3_SPECIAL_TOKENS`` (``<|begin_of_text|>`` = 128000 ... ``<|eot_id|>`` = 128009, ``<|image|>`` =
    128256, so ``vocab_size`` is 128257), and for a ``tokenizer.json`` the file's own. A special token's
    text inside a text is encoded as that token, as transformers does.

    Chat format (``tokenize_messages``), each content stripped of surrounding whitespace::

        <|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\n{content}<|eot_id|>
        <|start_header_id|>assistant<|end_header_id|>\\n\\n{content}<|eot_id|><|end_of_text|>

    A tool call (``ipython=True``) starts with ``<|python_tag|>``; a message with ``eot=False`` ends with
    ``<|eom_id|>``. Padding uses ``<|finetune_right_pad_id|>`` (EOS where the tokens lack it).

    Args:
        path: ``original/tokenizer.model`` or ``tokenizer.json`` (config key ``tokenizer.path``).
        special_tokens: ``{text: id}``; None for the defaults above.
        max_seq_len: the longest ``tokenize_messages`` returns (cut with EOS last); None for no limit.
        prompt_template: a template applied to the messages before they are tokenized.
        truncation_type: ``"right"`` cuts the end of a long conversation, ``"left"`` its start.

    Raises:
        TuneError: the file is missing, a folder, a SentencePiece model (Llama 2's), or not a tokenizer.
        TuneValueError: special tokens without one of Llama 3's chat tokens.
    """

    def __init__(
        self,
        path: Union[str, Path],
        special_tokens: Optional[Dict[str, int]] = None,
        max_seq_len: Optional[int] = None,
        prompt_template: Optional[PromptTemplate] = None,
        truncation_type: str = "right",
    ) -> None:
        path = Path(path).expanduser()
        self.path = path
        fmt = _checked_format(path)
        if fmt == TIKTOKEN:
            from torchtune.modules.transforms.tokenizers import TikTokenBaseTokenizer

            self.special_tokens = dict(special_tokens if special_tokens is not None else LLAMA3_SPECIAL_TOKENS)
            self._validate_special_tokens()
            self.tt_model: Any = TikTokenBaseTokenizer(
                path=str(path),
                name="llama3_tiktoken",
                pattern=CL100K_PATTERN,
                bos_id=self.special_tokens["<|begin_of_text|>"],
                eos_id=self.special_tokens["<|end_of_text|>"],
                special_tokens=self.special_tokens,
                special_tokens_in_text=True,
            )
            self._json = None
        else:
            from torchtune.modules.transforms.tokenizers._hf_tokenizer import TokenizerJson

            self._json = TokenizerJson(path)
            self.special_tokens = dict(special_tokens if special_tokens is not None else self._json.special_tokens)
            missing = [t for t in _REQUIRED if t not in self.special_tokens]
            if missing:
                raise TuneError(
                    f"The tokenizer '{path}' (config key tokenizer.path) has no {', '.join(missing)}: it is not a "
                    f"Llama 3 tokenizer. {_TOKENIZER_HINT}"
                )
            self.tt_model = None
        self.bos_id: int = self.special_tokens["<|begin_of_text|>"]
        self.eos_id: int = self.special_tokens["<|end_of_text|>"]
        self.pad_id: int = self.special_tokens.get("<|finetune_right_pad_id|>", self.eos_id)
        self.step_id: Optional[int] = self.special_tokens.get("<|step_id|>")
        self.start_header_id: int = self.special_tokens["<|start_header_id|>"]
        self.end_header_id: int = self.special_tokens["<|end_header_id|>"]
        self.eot_id: int = self.special_tokens["<|eot_id|>"]
        self.eom_id: int = self.special_tokens["<|eom_id|>"]
        self.python_tag: int = self.special_tokens["<|python_tag|>"]
        self.image_id: Optional[int] = self.special_tokens.get("<|image|>")
        # Generation stops at any: a base model ends a text with EOS, a chat model its turn with EOT, a
        # tool call with EOM.
        self.stop_tokens: List[int] = [self.eos_id, self.eot_id, self.eom_id]
        self.max_seq_len = max_seq_len
        self.prompt_template = prompt_template
        self.truncation_type = truncation_type
        self._header_sep = self.encode("\n\n", add_bos=False, add_eos=False)

    def _validate_special_tokens(self) -> None:
        for token in _REQUIRED:
            if token not in self.special_tokens:
                raise TuneValueError(
                    f"{token} missing from special_tokens: Llama 3's chat format needs {', '.join(_REQUIRED)}."
                )

    # --- sizes ---------------------------------------------------------------------------------------
    @property
    def base_vocab_size(self) -> int:
        """BPE tokens, special tokens not counted."""
        if self.tt_model is not None:
            return self.tt_model.base_vocab_size
        return self._json._tokenizer.get_vocab_size(with_added_tokens=False)

    @property
    def vocab_size(self) -> int:
        """One past the highest id (BPE ranks and special tokens): 128256 for Llama 3.x's ``tokenizer.json``,
        128257 for its tiktoken file with torchtune's special tokens (``<|image|>`` is 128256)."""
        if self.tt_model is not None:
            return self.tt_model.vocab_size
        return self._json.vocab_size

    @property
    def text_vocab_size(self) -> int:
        """One past the highest id a text-only sample can hold: ``vocab_size`` without the media tokens, so
        a text model's 128256-row embedding table fits the tiktoken file's 128257 ids."""
        text_ids = [i for token, i in self.special_tokens.items() if token not in _MEDIA]
        return max([self.base_vocab_size, *(i + 1 for i in text_ids)])

    # --- text ----------------------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True, **_: Any) -> List[int]:
        """Token ids of ``text``, with ``<|begin_of_text|>`` / ``<|end_of_text|>`` on request. Extra keywords
        (``trim_leading_whitespace`` from the instruction datasets) change nothing: byte-level BPE adds no
        word-start space, so the ids of two texts join like the ids of the joined text at a piece boundary."""
        if self.tt_model is not None:
            return self.tt_model.encode(text, add_bos=add_bos, add_eos=add_eos)
        ids = self._json.encode(text)
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, token_ids: List[int], truncate_at_eos: bool = True, skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``: up to the first EOS (``truncate_at_eos``), with the headers
        (``<|start_header_id|>role<|end_header_id|>\\n\\n``) and special tokens left out
        (``skip_special_tokens``). Ids outside the vocabulary (padding labels such as -100) are skipped."""
        ids = [int(i) for i in token_ids if 0 <= int(i) < self.vocab_size]
        if truncate_at_eos and self.eos_id in ids[1:]:
            ids = ids[: ids.index(self.eos_id, 1)]
        if self.tt_model is not None:
            text = self.tt_model.decode(ids, truncate_at_eos=False)
        else:
            text = self._json.decode(ids, skip_special_tokens=False)
        return _SPECIAL_TEXT.sub("", _HEADER_TEXT.sub("", text)) if skip_special_tokens else text

    # --- messages ------------------------------------------------------------------------------------
    def _tokenize_header(self, message: Message) -> List[int]:
        role = self.encode(message.role.strip(), add_bos=False, add_eos=False)
        return [self.start_header_id] + role + [self.end_header_id] + self._header_sep

    def _tokenize_body(self, message: Message) -> List[int]:
        body = [self.python_tag] if message.ipython else []
        for piece in message.content:
            if piece["type"] == "text":
                body += self.encode(piece["content"].strip(), add_bos=False, add_eos=False)
            elif piece["type"] == "image" and self.image_id is not None:
                body.append(self.image_id)
            else:
                raise TuneError(f"Unsupported message content type: {piece['type']} (role {message.role}).")
        return body

    def _tokenize_end(self, message: Message) -> List[int]:
        return [self.eot_id if message.eot else self.eom_id]

    def tokenize_message(
        self, message: Message, *, add_start_tokens: bool = True, add_end_tokens: bool = True
    ) -> List[int]:
        """Ids of one message: its header (``add_start_tokens``), content, and ``<|eot_id|>`` or
        ``<|eom_id|>`` (``add_end_tokens``)."""
        header = self._tokenize_header(message) if add_start_tokens else []
        end = self._tokenize_end(message) if add_end_tokens else []
        return header + self._tokenize_body(message) + end

    def tokenize_messages(
        self, messages: List[Message], *, add_end_tokens: bool = True
    ) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)`` of a conversation in the chat format (class docstring); ``mask`` is True for
        tokens not learnt: each message's tokens (header included) take its ``masked``, BOS and EOS are
        masked. ``add_end_tokens=False`` (generation) leaves the last message open and adds no EOS."""
        if self.prompt_template is not None:
            messages = self.prompt_template(messages)
        tokens = [self.bos_id]
        mask = [True]
        for i, message in enumerate(messages):
            ids = self.tokenize_message(message, add_end_tokens=add_end_tokens or i < len(messages) - 1)
            tokens += ids
            mask += [message.masked] * len(ids)
            if self.max_seq_len and len(tokens) >= self.max_seq_len and self.truncation_type == "right":
                break
        if add_end_tokens:
            tokens.append(self.eos_id)
            mask.append(True)
        if self.max_seq_len:
            tokens = truncate(tokens, self.max_seq_len, self.eos_id if add_end_tokens else None, self.truncation_type)
            mask = truncate(mask, self.max_seq_len, True if add_end_tokens else None, self.truncation_type)
        return tokens, mask

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """``sample["messages"]`` replaced by ``tokens`` and ``mask`` (``inference``: no end tokens)."""
        messages = sample.pop("messages")
        sample["tokens"], sample["mask"] = self.tokenize_messages(messages, add_end_tokens=not inference)
        return sample

    def message_spans(
        self, messages: Sequence[Union[Mapping[str, Any], Message]], add_generation_prompt: bool = False
    ) -> ChatEncoding:
        """A conversation exactly as Llama 3 Instruct's chat template renders it (transformers'
        ``apply_chat_template``: no ``<|end_of_text|>`` at the end), and per message its turn and (assistant
        messages) the tokens the model writes, as ``HFModelTokenizer.message_spans`` gives them for the same
        template. The chat datasets of this library train on these.

        A turn is a message's header, content and ``<|eot_id|>`` (the first turn also holds
        ``<|begin_of_text|>``); an assistant reply is its content and closing ``<|eot_id|>``, the header
        ``<|start_header_id|>assistant<|end_header_id|>\\n\\n`` being the generation prompt.
        ``add_generation_prompt`` ends with an open assistant header."""
        tokens = [self.bos_id]
        turns: List[Tuple[int, int]] = []
        replies: List[Optional[Tuple[int, int]]] = []
        for message in messages:
            if not isinstance(message, Message):
                message = Message.from_dict(message)
            start = len(tokens) if turns else 0
            tokens += self._tokenize_header(message)
            reply_start = len(tokens)
            tokens += self._tokenize_body(message) + self._tokenize_end(message)
            turns.append((start, len(tokens)))
            replies.append((reply_start, len(tokens)) if message.role == "assistant" else None)
        if add_generation_prompt:
            tokens += self._tokenize_header(Message("assistant", ""))
        return ChatEncoding(tokens=tokens, turns=turns, replies=replies)

    def __repr__(self) -> str:
        return f"Llama3Tokenizer(path='{self.path}', vocab_size={self.vocab_size})"


def _checked_format(path: Path) -> str:
    """The file format of ``path`` if the Llama 3 tokenizer reads it, else a ``TuneError`` saying why not."""
    if path.is_dir():
        inside = [p for p in (path / "original" / "tokenizer.model", path / "tokenizer.json") if p.is_file()]
        more = f" It contains {' and '.join(str(p) for p in inside)}: use one as tokenizer.path." if inside else ""
        raise TuneError(
            f"The tokenizer path '{path}' (config key tokenizer.path) is a folder, not a tokenizer file.{more} "
            f"{_TOKENIZER_HINT}"
        )
    if not path.is_file():
        raise TuneError(f"The tokenizer file '{path}' (config key tokenizer.path) does not exist. {_TOKENIZER_HINT}")
    fmt = sniff_tokenizer_format(path)
    if fmt == SENTENCEPIECE:
        raise TuneError(
            f"The tokenizer file '{path}' (config key tokenizer.path) is {DESCRIPTIONS[SENTENCEPIECE]}, but "
            "tokenizer._component_ is the Llama 3 tokenizer, which reads tiktoken BPE files and tokenizer.json. "
            "For a Llama 2 model set tokenizer._component_=torchtune.models.llama2.llama2_tokenizer; for Llama "
            f"3.x point tokenizer.path at its own tokenizer. {_TOKENIZER_HINT}"
        )
    if fmt not in (TIKTOKEN, HF_TOKENIZER_JSON):
        raise TuneError(
            f"The tokenizer file '{path}' (config key tokenizer.path) is {DESCRIPTIONS[fmt]}: the Llama 3 tokenizer "
            f"reads {DESCRIPTIONS[TIKTOKEN]} or {DESCRIPTIONS[HF_TOKENIZER_JSON]}. {_TOKENIZER_HINT}"
        )
    return fmt


@checked_by(check_tokenizer_args)
def llama3_tokenizer(
    path: str,
    special_tokens_path: Optional[str] = None,
    max_seq_len: Optional[int] = None,
    prompt_template: Optional[Any] = None,
    truncation_type: str = "right",
) -> Llama3Tokenizer:
    """Llama 3.x's tokenizer (torchtune's builder).

    Args:
        path: ``original/tokenizer.model`` (tiktoken) or ``tokenizer.json`` (config key ``tokenizer.path``).
        special_tokens_path: a ``tokenizer.json`` whose ``added_tokens`` give the special tokens and their
            ids; None for torchtune's Llama 3 tokens (tiktoken) or the file's own (``tokenizer.json``).
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template's dotted path, ``{role: [before, after]}``, or None.
        truncation_type: ``"right"`` or ``"left"``: which end of a long conversation is cut.
    """
    from torchtune.data._prompt_templates import _get_prompt_template
    from torchtune.modules.transforms.tokenizers import parse_hf_tokenizer_json

    return Llama3Tokenizer(
        path=path,
        special_tokens=parse_hf_tokenizer_json(special_tokens_path) if special_tokens_path is not None else None,
        max_seq_len=max_seq_len,
        prompt_template=_get_prompt_template(prompt_template) if prompt_template is not None else None,
        truncation_type=truncation_type,
    )
