"""Llama 3.x's tokenizer: tiktoken BPE (``original/tokenizer.model``) or ``tokenizer.json``, with the
Llama 3 special tokens and chat format."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

from torchtune._errors import TuneError
from torchtune.config._types import checked_by
from torchtune.modules.tokenizers._checks import check_tokenizer_args
from torchtune.modules.tokenizers._format import (
    DESCRIPTIONS,
    HF_TOKENIZER_JSON,
    SENTENCEPIECE,
    TIKTOKEN,
    sniff_tokenizer_format,
)

# Llama 3's pre-tokenization regex (the cl100k pattern): contractions, letter runs with one leading
# non-letter, numbers of up to 3 digits, punctuation runs, newlines, other whitespace.
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# torchtune's name for the same pattern (tiktoken's cl100k pre-tokenization, which Llama 3 uses)
CL100K_PATTERN = LLAMA3_SPLIT_PATTERN

NUM_SPECIAL_TOKENS = 256
_NAMED_SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
# The 256 special tokens of Llama 3.1 / 3.2 in id order, right after the BPE ranks (ids 128000-128255
# in the released file): the named ones, then reserved_special_token_3 ... _247.
LLAMA3_SPECIAL_TOKENS: List[str] = _NAMED_SPECIAL_TOKENS + [
    f"<|reserved_special_token_{i}|>" for i in range(3, 3 + NUM_SPECIAL_TOKENS - len(_NAMED_SPECIAL_TOKENS))
]
# What the chat format and BOS/EOS need; a tokenizer.json without one of them is not Llama 3's.
_REQUIRED = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

CHAT_ROLES = ("system", "user", "assistant", "ipython")
_TOKENIZER_HINT = (
    "`tune download meta-llama/Llama-3.2-1B --output-dir /tmp/Llama-3.2-1B` puts the tiktoken file at "
    "/tmp/Llama-3.2-1B/original/tokenizer.model and a tokenizer.json beside config.json; tokenizer.path "
    "may name either."
)


class Llama3Tokenizer:
    """Llama 3.x's tokenizer, read from the tiktoken ``tokenizer.model`` (through ``tiktoken``) or a
    Hugging Face ``tokenizer.json`` (through ``tokenizers``); both give the same ids.

    The tiktoken file holds only the BPE ranks: the 256 special tokens get the ids after them, in Llama
    3.1's order (``<|begin_of_text|>`` = 128000 ... ``<|eot_id|>`` = 128009 for the released file).
    A ``tokenizer.json`` lists its special tokens itself. Special tokens written in a text are encoded
    as those tokens, as transformers does.

    Chat format (:meth:`tokenize_messages`), as Llama 3 Instruct's chat template renders it::

        <|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\n{content}<|eot_id|>
        <|start_header_id|>assistant<|end_header_id|>\\n\\n{content}<|eot_id|>

    with each content stripped of surrounding whitespace.

    Padding uses ``<|finetune_right_pad_id|>``, which Llama 3.1 reserves for it (EOS where a
    tokenizer.json lacks it): padded positions carry label -100 and follow the real tokens.

    Args:
        path: ``original/tokenizer.model`` or ``tokenizer.json`` (config key ``tokenizer.path``).
        max_seq_len: optional default longest sequence for datasets built on this tokenizer.

    Raises:
        TuneError: the file is missing, is a folder, is a SentencePiece model (Llama 2's; use
            ``torchtune.models.llama2.llama2_tokenizer``), or lacks Llama 3's special tokens.
    """

    def __init__(self, path: Union[str, Path], max_seq_len: Optional[int] = None) -> None:
        path = Path(path).expanduser()
        if path.is_dir():
            inside = [p for p in (path / "original" / "tokenizer.model", path / "tokenizer.json") if p.is_file()]
            more = f" It contains {' and '.join(str(p) for p in inside)}: use one as tokenizer.path." if inside else ""
            raise TuneError(
                f"The tokenizer path '{path}' (config key tokenizer.path) is a folder, not a tokenizer "
                f"file.{more} {_TOKENIZER_HINT}"
            )
        if not path.is_file():
            raise TuneError(
                f"The tokenizer file '{path}' (config key tokenizer.path) does not exist. {_TOKENIZER_HINT}"
            )
        fmt = sniff_tokenizer_format(path)
        if fmt == TIKTOKEN:
            from torchtune.modules.tokenizers._tiktoken import TikTokenBaseTokenizer

            self._backend: Any = TikTokenBaseTokenizer(path, "llama3", LLAMA3_SPLIT_PATTERN, LLAMA3_SPECIAL_TOKENS)
        elif fmt == HF_TOKENIZER_JSON:
            from torchtune.modules.tokenizers._hf_tokenizers import HuggingFaceBaseTokenizer

            self._backend = HuggingFaceBaseTokenizer(path)
        elif fmt == SENTENCEPIECE:
            raise TuneError(
                f"The tokenizer file '{path}' (config key tokenizer.path) is {DESCRIPTIONS[SENTENCEPIECE]}, "
                "but tokenizer._component_ is the Llama 3 tokenizer, which reads tiktoken BPE files and "
                "tokenizer.json. For a Llama 2 model set tokenizer._component_=torchtune.models.llama2."
                f"llama2_tokenizer; for Llama 3.x point tokenizer.path at its own tokenizer. {_TOKENIZER_HINT}"
            )
        else:
            raise TuneError(
                f"The tokenizer file '{path}' (config key tokenizer.path) is {DESCRIPTIONS[fmt]}: the Llama 3 "
                f"tokenizer reads {DESCRIPTIONS[TIKTOKEN]} or {DESCRIPTIONS[HF_TOKENIZER_JSON]}. {_TOKENIZER_HINT}"
            )
        missing = [t for t in _REQUIRED if self._backend.token_to_id(t) is None]
        if missing:
            raise TuneError(
                f"The tokenizer '{path}' (config key tokenizer.path) has no {', '.join(missing)}: it is not a "
                f"Llama 3 tokenizer. {_TOKENIZER_HINT}"
            )
        self.path = path
        self.max_seq_len = max_seq_len
        self.bos_id: int = self._id("<|begin_of_text|>")
        self.eos_id: int = self._id("<|end_of_text|>")
        self.start_header_id: int = self._id("<|start_header_id|>")
        self.end_header_id: int = self._id("<|end_header_id|>")
        self.eot_id: int = self._id("<|eot_id|>")
        pad = self._backend.token_to_id("<|finetune_right_pad_id|>")
        self.pad_id: int = self.eos_id if pad is None else pad
        # Generation stops at either: a base model ends a text with EOS, a chat model its turn with EOT.
        self.stop_tokens: List[int] = [self.eos_id, self.eot_id]
        self._header_sep = self.encode("\n\n", add_bos=False, add_eos=False)

    def _id(self, token: str) -> int:
        return int(self._backend.token_to_id(token))

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce (BPE ranks + special tokens): 128256 for Llama 3.x."""
        return self._backend.vocab_size

    def encode(
        self, text: str, add_bos: bool = True, add_eos: bool = True, trim_leading_whitespace: bool = False
    ) -> List[int]:
        """Token ids of ``text``, optionally with ``<|begin_of_text|>`` / ``<|end_of_text|>``.

        ``trim_leading_whitespace`` is accepted for the datasets' sake and changes nothing: byte-level
        BPE adds no dummy-prefix space, so ``encode(a) + encode(b)`` already equals ``encode(a + b)``
        where ``a`` ends at a piece boundary (after a newline, before a space).
        """
        del trim_leading_whitespace
        ids = self._backend.encode(text)
        if add_bos:
            ids = [self.bos_id] + ids
        if add_eos:
            ids = ids + [self.eos_id]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; special tokens, -100 and out-of-range ids are left out unless asked for."""
        size = self.vocab_size
        return self._backend.decode(
            [int(i) for i in ids if 0 <= int(i) < size], skip_special_tokens=skip_special_tokens
        )

    def tokenize_messages(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False
    ) -> Tuple[List[int], List[bool]]:
        """Tokens of a conversation in Llama 3's chat format, and which of them are the assistant's.

        Args:
            messages: ``{"role": system|user|assistant|ipython, "content": str}`` in order.
            add_generation_prompt: end with an empty assistant header, for generation.

        Returns:
            ``(tokens, is_assistant)``: ``is_assistant[i]`` is True for the content and closing
            ``<|eot_id|>`` of assistant messages, the tokens a model learns to write. Headers,
            including ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``, are the prompt.
        """
        tokens = [self.bos_id]
        is_assistant = [False]
        for message in messages:
            role, content = message["role"], message["content"]
            header = self._header(role)
            body = self.encode(content.strip(), add_bos=False, add_eos=False) + [self.eot_id]
            tokens += header + body
            is_assistant += [False] * len(header) + [role == "assistant"] * len(body)
        if add_generation_prompt:
            header = self._header("assistant")
            tokens += header
            is_assistant += [False] * len(header)
        return tokens, is_assistant

    def _header(self, role: str) -> List[int]:
        role_ids = self.encode(role, add_bos=False, add_eos=False)
        return [self.start_header_id] + role_ids + [self.end_header_id] + self._header_sep

    def __repr__(self) -> str:
        return f"Llama3Tokenizer(path='{self.path}', vocab_size={self.vocab_size})"


@checked_by(check_tokenizer_args)
def llama3_tokenizer(
    path: str,
    special_tokens_path: Optional[str] = None,
    max_seq_len: Optional[int] = None,
    prompt_template: Optional[Any] = None,
    truncation_type: str = "right",
) -> Llama3Tokenizer:
    """Llama 3.x's tokenizer from ``path``: ``original/tokenizer.model`` or ``tokenizer.json`` (torchtune's
    arguments).

    Args:
        path: the tokenizer file (config key ``tokenizer.path``).
        special_tokens_path: torchtune's ``tokenizer.json`` to read the special tokens from; kept as
            ``tokenizer.special_tokens_path`` (Llama 3.1's special tokens are built in).
        max_seq_len: stored as ``tokenizer.max_seq_len`` (datasets truncate to it); ``None`` for no limit.
        prompt_template: torchtune's prompt template, kept as ``tokenizer.prompt_template``.
        truncation_type: ``"left"`` or ``"right"``, kept as ``tokenizer.truncation_type``.
    """
    from torchtune.models._tokenizer_args import keep_args

    return keep_args(
        Llama3Tokenizer(path, max_seq_len=max_seq_len),
        special_tokens_path=special_tokens_path,
        prompt_template=prompt_template,
        truncation_type=truncation_type,
    )
