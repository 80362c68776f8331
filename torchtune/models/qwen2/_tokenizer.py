"""Qwen2's tokenizer: byte-level BPE from ``vocab.json`` + ``merges.txt`` (run by the ``tokenizers``
library with Qwen's pre-tokenization regex), special tokens at fixed ids, and the ChatML chat format."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Dict, List, Mapping, Optional, Tuple

from torchtune._errors import TuneError, TuneValueError
from torchtune.config._types import checked_by
from torchtune.data import ChatMLTemplate, Message, truncate
from torchtune.models._tokenizer_files import folder_tokenizer, is_hf_tokenizer_json
from torchtune.modules.tokenizers._checks import check_tokenizer_args
from torchtune.modules.transforms.tokenizers import ModelTokenizer
from torchtune.modules.transforms.tokenizers._gpt2 import byte_level_bpe

# Qwen's split before BPE: contractions, letter runs with one leading non-letter, single digits,
# punctuation runs, newlines, other whitespace.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
QWEN2_SPECIAL_TOKENS: Dict[str, int] = {ENDOFTEXT: 151643, IM_START: 151644, IM_END: 151645}
# Kept for torchtune's signature; the tokenizers library caches merges itself.
DEFAULT_QWEN2_TOKENIZER_BPE_CACHE_SIZE = 152064


class Qwen2Tokenizer(ModelTokenizer):
    """Qwen2's tokenizer. Text is NFC-normalised; special tokens written in it become their ids; the rest
    is byte-level BPE. Chat format (``tokenize_messages``)::

        <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n{content}<|im_end|>

    (the last assistant message ends with EOS, ``<|im_end|>`` by default, instead of ``<|im_end|>\\n``).

    Args:
        path: the ``vocab.json``.
        merges_file: the ``merges.txt``.
        special_tokens: ``{text: id}`` of the special tokens.
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template applied before tokenizing (not ChatML: the format is already ChatML).
        errors: how undecodable bytes are decoded (``"replace"``; kept for torchtune's signature).
        unk_token: the special token for unknown text, or None.
        bos_token: the special token ``encode`` puts first, or None (Qwen has none).
        eos_token: the special token ``encode`` puts last and that ends a sequence.
        pad_token: the special token batches are padded with.
        bpe_cache_size: kept for torchtune's signature.
        truncation_type: ``"right"`` cuts the end of a long conversation, ``"left"`` its start.

    Raises:
        TuneError: unreadable or malformed files.
        TuneValueError: a ``unk/bos/eos/pad_token`` that is not among the special tokens.
    """

    def __init__(
        self,
        path: str,
        merges_file: str,
        special_tokens: Dict[str, int] = QWEN2_SPECIAL_TOKENS,
        max_seq_len: Optional[int] = None,
        *,
        prompt_template: Optional[Any] = None,
        errors: str = "replace",
        unk_token: Optional[str] = None,
        bos_token: Optional[str] = None,
        eos_token: str = IM_END,
        pad_token: Optional[str] = ENDOFTEXT,
        bpe_cache_size: int = DEFAULT_QWEN2_TOKENIZER_BPE_CACHE_SIZE,
        truncation_type: str = "right",
    ) -> None:
        self.path = path
        self._bpe = byte_level_bpe(path, merges_file, PRETOKENIZE_REGEX)
        self.errors = errors
        self.special_tokens = dict(special_tokens)
        self._special_text = {i: t for t, i in self.special_tokens.items()}
        self.unk_id = self._special_id(unk_token, "unk_token")
        self.bos_id = self._special_id(bos_token, "bos_token")
        self.eos_id = self._special_id(eos_token, "eos_token")
        self.pad_id = self._special_id(pad_token, "pad_token")
        self.im_start_id = self._special_id(IM_START, "the chat format")
        self.im_end_id = self._special_id(IM_END, "the chat format")
        self.stop_tokens = [self.eos_id, self.pad_id]
        # Longest first, so that a special token that starts another is not matched inside it.
        names = sorted(self.special_tokens, key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(re.escape(n) for n in names) + ")") if names else None
        self.max_seq_len = max_seq_len
        self.prompt_template = prompt_template
        self.truncation_type = truncation_type

    def _special_id(self, token: Optional[str], what: str) -> Optional[int]:
        if token is None:
            return None
        if token not in self.special_tokens:
            raise TuneValueError(
                f"{token} (for {what}) is not among the special tokens {sorted(self.special_tokens)}: pass the "
                "model's tokenizer.json as special_tokens_path, or name one of them."
            )
        return self.special_tokens[token]

    @property
    def vocab_size(self) -> int:
        """One past the highest id (BPE entries and special tokens)."""
        return max([self._bpe.get_vocab_size(), *(i + 1 for i in self.special_tokens.values())])

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True, **_: Any) -> List[int]:
        """Token ids of ``text`` (BOS / EOS around them on request, where the tokenizer has them); other
        keywords change nothing (byte-level BPE adds no word-start space)."""
        text = unicodedata.normalize("NFC", text)
        pieces = self._special_split.split(text) if self._special_split else [text]
        ids = [self.bos_id] if add_bos and self.bos_id is not None else []
        for piece in pieces:
            if piece in self.special_tokens:
                ids.append(self.special_tokens[piece])
            elif piece:
                ids += self._bpe.encode(piece, add_special_tokens=False).ids
        if add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def decode(self, token_ids: List[int], skip_special_tokens: bool = False) -> str:
        """The text of ``token_ids``, special tokens written out unless ``skip_special_tokens``."""
        pieces, run = [], []
        for i in (int(i) for i in token_ids):
            if i in self._special_text:
                pieces.append(self._bpe.decode(run))
                run = []
                if not skip_special_tokens:
                    pieces.append(self._special_text[i])
            else:
                run.append(i)
        return "".join(pieces) + self._bpe.decode(run)

    def _start(self, role: str) -> List[int]:
        return [self.im_start_id] + self.encode(f"{role}\n", add_bos=False, add_eos=False)

    def _end(self) -> List[int]:
        return [self.im_end_id] + self.encode("\n", add_bos=False, add_eos=False)

    def _body(self, message: Message) -> List[int]:
        ids: List[int] = []
        for piece in message.content:
            if piece["type"] != "text":
                raise TuneError(f"Unsupported message content type: {piece['type']} (Qwen reads text only).")
            ids += self.encode(piece["content"], add_bos=False, add_eos=False)
        return ids

    def _message_ids(self, messages: List[Message], i: int) -> List[int]:
        """The ids of ``messages[i]``: header, content and footer of the ChatML format."""
        message = messages[i]
        if message.role == "ipython":
            return self._body(message)
        ids = self._start(message.role) + self._body(message)
        if message.role != "assistant" or i != len(messages) - 1:
            ids += self._end()
        return ids

    def tokenize_messages(self, messages: List[Message], *, add_eos: bool = True) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)`` of the conversation in the ChatML format (class docstring); each token's mask
        is its message's ``masked``, EOS's that of the message before it.

        Raises:
            TuneValueError: ``prompt_template`` is a ``ChatMLTemplate`` (the tags would be doubled).
            TuneError: content that is not text.
        """
        if isinstance(self.prompt_template, ChatMLTemplate):
            raise TuneValueError(
                "Using ChatMLTemplate with tokenize_messages will result in multiple <|im_*|> tokens wrapping "
                "each message. Please use a different template or set to None."
            )
        if self.prompt_template is not None:
            messages = self.prompt_template(messages)
        tokens: List[int] = []
        mask: List[bool] = []
        for i, message in enumerate(messages):
            ids = self._message_ids(messages, i)
            tokens += ids
            mask += [message.masked] * len(ids)
            if self.max_seq_len and len(tokens) >= self.max_seq_len and self.truncation_type == "right":
                break
        if add_eos:
            tokens.append(self.eos_id)
            mask.append(mask[-1] if mask else True)
        if self.max_seq_len:
            tokens = truncate(tokens, self.max_seq_len, self.eos_id if add_eos else None, self.truncation_type)
            mask = truncate(mask, self.max_seq_len, True if add_eos else None, self.truncation_type)
        return tokens, mask

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """``sample["messages"]`` replaced by ``tokens`` and ``mask``."""
        messages = sample.pop("messages")
        sample["tokens"], sample["mask"] = self.tokenize_messages(messages)
        return sample


def build_qwen_tokenizer(
    cls: type,
    default_special_tokens: Dict[str, int],
    builder: str,
    path: str,
    merges_file: Optional[str],
    special_tokens_path: Optional[str],
    max_seq_len: Optional[int],
    prompt_template: Any,
    truncation_type: str,
    options: Dict[str, Any],
) -> Any:
    """What ``qwen2_tokenizer`` and ``qwen2_5_tokenizer`` do: a model folder's ``tokenizer.json`` (no
    ``merges_file``) gives an ``HFModelTokenizer``; ``vocab.json`` + ``merges.txt`` give ``cls`` with
    ``options`` (its keyword arguments).

    Raises:
        TuneError: a ``vocab.json`` without its ``merges_file``; ``options`` other than the defaults with a
            ``tokenizer.json`` (its folder's files set them).
    """
    if merges_file is None:
        if is_hf_tokenizer_json(path) and not str(path).endswith("vocab.json"):
            changed = [k for k, v in options.items() if v != _OPTION_DEFAULTS[k]]
            if changed:
                raise TuneError(
                    f"{builder}: tokenizer.{changed[0]} is set, but tokenizer.path={path} is a tokenizer.json, whose "
                    "folder's tokenizer_config.json sets the special tokens. Remove it, or give the vocab.json and "
                    "merges.txt."
                )
            return folder_tokenizer(path, max_seq_len, prompt_template, None, builder)
        raise TuneError(
            f"{builder}: tokenizer.path={path} needs tokenizer.merges_file (the merges.txt beside it), or point "
            "tokenizer.path at the model folder's tokenizer.json."
        )
    from torchtune.data._prompt_templates import _get_prompt_template
    from torchtune.modules.transforms.tokenizers import parse_hf_tokenizer_json

    special = (
        parse_hf_tokenizer_json(special_tokens_path) if special_tokens_path is not None else default_special_tokens
    )
    return cls(
        path=path,
        merges_file=merges_file,
        special_tokens=special,
        max_seq_len=max_seq_len,
        prompt_template=_get_prompt_template(prompt_template) if prompt_template is not None else None,
        truncation_type=truncation_type,
        **options,
    )


_OPTION_DEFAULTS: Dict[str, Any] = {
    "errors": "replace",
    "unk_token": None,
    "bos_token": None,
    "eos_token": IM_END,
    "pad_token": ENDOFTEXT,
    "bpe_cache_size": DEFAULT_QWEN2_TOKENIZER_BPE_CACHE_SIZE,
}


@checked_by(check_tokenizer_args)
def qwen2_tokenizer(
    path: str,
    merges_file: Optional[str] = None,
    special_tokens_path: Optional[str] = None,
    max_seq_len: Optional[int] = None,
    prompt_template: Optional[Any] = None,
    truncation_type: str = "right",
    *,
    errors: str = "replace",
    unk_token: Optional[str] = None,
    bos_token: Optional[str] = None,
    eos_token: str = IM_END,
    pad_token: Optional[str] = ENDOFTEXT,
    bpe_cache_size: int = DEFAULT_QWEN2_TOKENIZER_BPE_CACHE_SIZE,
) -> Any:
    """Qwen2's tokenizer (torchtune's builder).

    Args:
        path: the ``vocab.json`` (with ``merges_file``: a ``Qwen2Tokenizer``), or a model folder's
            ``tokenizer.json`` (an ``HFModelTokenizer``: the folder's special tokens and chat template).
        merges_file: the ``merges.txt``.
        special_tokens_path: a ``tokenizer.json`` whose ``added_tokens`` give the special tokens; None for
            ``QWEN2_SPECIAL_TOKENS``.
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template's dotted path, ``{role: [before, after]}``, or None.
        truncation_type: ``"right"`` or ``"left"``: which end of a long conversation is cut.
        errors, unk_token, bos_token, eos_token, pad_token, bpe_cache_size: ``Qwen2Tokenizer``'s (torchtune
            passes them as ``**kwargs``).
    """
    options = dict(
        errors=errors,
        unk_token=unk_token,
        bos_token=bos_token,
        eos_token=eos_token,
        pad_token=pad_token,
        bpe_cache_size=bpe_cache_size,
    )
    return build_qwen_tokenizer(
        Qwen2Tokenizer,
        QWEN2_SPECIAL_TOKENS,
        "qwen2_tokenizer",
        path,
        merges_file,
        special_tokens_path,
        max_seq_len,
        prompt_template,
        truncation_type,
        options,
    )
