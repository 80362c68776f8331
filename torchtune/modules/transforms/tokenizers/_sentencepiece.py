"""SentencePiece tokenizers (the ``tokenizer.model`` of Llama 2, Mistral v0.1-v0.2, Gemma, Phi-3 mini).

SentencePiece starts every encoded text with a word-start ``▁`` (a space). Encoding a prompt and its
response separately and joining the ids would put that ``▁`` at the junction, where the text has no
space, and give the response's first word the word-start piece instead of the mid-text one.
``encode(text, trim_leading_whitespace=True)`` encodes ``prefix + text`` (``"\\n"`` by default) and cuts the
prefix's ids off: ``encode(prompt, add_eos=False) + encode(response, add_bos=False,
trim_leading_whitespace=True) == encode(prompt + response)`` whenever the prompt ends at a token boundary
of the joined text (after a newline, or before a space the response starts with). A newline is a byte
piece in these vocabularies that never merges with what follows; should a prefix merge with the text, the
method drops a lone leading ``▁`` instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from torchtune._assets import missing_path_hint
from torchtune._errors import TuneError
from torchtune.data._messages import Message
from torchtune.modules.transforms.tokenizers._format import (
    DESCRIPTIONS,
    HF_TOKENIZER_JSON,
    TIKTOKEN,
    sniff_tokenizer_format,
    tokenizer_owner,
)
from torchtune.modules.transforms.tokenizers._utils import BaseTokenizer, tokenize_messages_no_special_tokens

WHITESPACE_CHARS = [" ", "\n", "\t", "\r", "\v"]
_DEFAULT_PREFIX = "\n"
_HINT = (
    "Set tokenizer.path to the tokenizer.model file that came with the weights; `tune download <model> "
    "--output-dir <folder>` puts it in that folder."
)


def _load_processor(path: Union[str, Path]):
    """A ``SentencePieceProcessor`` of the file at ``path``, or a ``TuneError`` that says what the file is."""
    import sentencepiece as spm

    path = Path(path).expanduser()
    if path.is_dir():
        inside = path / "tokenizer.model"
        more = f" It contains a tokenizer.model: use tokenizer.path={inside}." if inside.is_file() else ""
        raise TuneError(
            f"The tokenizer path '{path}' (config key tokenizer.path) is a folder, not a tokenizer.model file.{more} "
            f"{_HINT}"
        )
    if not path.is_file():
        raise TuneError(
            f"The tokenizer file '{path}' (config key tokenizer.path) does not exist.{missing_path_hint(path)} {_HINT}"
        )
    processor = spm.SentencePieceProcessor()
    try:
        processor.Load(str(path))
    except (RuntimeError, OSError) as err:
        fmt = sniff_tokenizer_format(path)
        if fmt in (TIKTOKEN, HF_TOKENIZER_JSON):
            owner = tokenizer_owner(path)
            if owner is not None:
                whose = f"it is {owner}"
            elif fmt == TIKTOKEN:
                whose = (
                    "Llama 3.x ships this format: set tokenizer._component_=torchtune.models.llama3.llama3_tokenizer"
                )
            else:  # Llama 3.x, Qwen, Gemma 3, Mistral and Phi-4 folders all hold one
                whose = (
                    "every Hugging Face model folder has one (Llama 3.x, Qwen, Gemma 3, Mistral, Phi-4 ...): set "
                    "tokenizer._component_ to the tokenizer builder of the model it came with (e.g. "
                    "torchtune.models.qwen3.qwen3_tokenizer)"
                )
            raise TuneError(
                f"The tokenizer file '{path}' (config key tokenizer.path) is {DESCRIPTIONS[fmt]}, not a "
                f"SentencePiece model (which tokenizer._component_ reads): {whose}, with the model of that "
                "family; or, for a SentencePiece model, point tokenizer.path at its tokenizer.model."
            ) from err
        raise TuneError(
            f"The tokenizer file '{path}' (config key tokenizer.path) is not a valid SentencePiece model ({err}). "
            f"{_HINT}"
        ) from err
    return path, processor


class SentencePieceBaseTokenizer(BaseTokenizer):
    """A SentencePiece model: ``encode`` with optional BOS/EOS and the leading-space trim (module
    docstring), ``decode``, and the model's own ids (``pad_id`` is -1 when it has none, as for Llama 2).

    Args:
        path: the ``tokenizer.model`` file.

    Raises:
        TuneError: the file is missing, a folder, or not a SentencePiece model (the message says what it is).
    """

    def __init__(self, path: Union[str, Path]) -> None:
        self.path, self.spm_model = _load_processor(path)
        self.vocab_size: int = self.spm_model.vocab_size()
        self.bos_id: int = self.spm_model.bos_id()
        self.eos_id: int = self.spm_model.eos_id()
        self.pad_id: int = self.spm_model.pad_id()
        # Trimming is only needed (and only safe) where whitespace has pieces of its own.
        self.encodes_whitespace = any(self.spm_model.encode(c) for c in WHITESPACE_CHARS)
        self._prefix_ids: Dict[str, List[int]] = {}
        self._dummy_prefix_id: int = self.spm_model.PieceToId("▁")

    def encode(
        self,
        text: str,
        add_bos: bool = True,
        add_eos: bool = True,
        trim_leading_whitespace: bool = False,
        prefix: Optional[str] = None,
    ) -> List[int]:
        """Token ids of ``text``.

        Args:
            text: the text.
            add_bos: put the model's BOS first.
            add_eos: put the model's EOS last.
            trim_leading_whitespace: encode ``text`` as the continuation of a text, without the word-start
                space SentencePiece puts first (module docstring); only where the model encodes whitespace.
            prefix: the text encoded before ``text`` and cut off again when trimming (default ``"\\n"``).
        """
        if trim_leading_whitespace and self.encodes_whitespace:
            ids = self._encode_continuation(text, prefix or _DEFAULT_PREFIX)
        else:
            ids = self.spm_model.encode(text, out_type=int)
        if add_bos and self.bos_id >= 0:
            ids = [self.bos_id] + ids
        if add_eos and self.eos_id >= 0:
            ids = ids + [self.eos_id]
        return ids

    def _encode_continuation(self, text: str, prefix: str) -> List[int]:
        prefix_ids = self._prefix_ids.get(prefix)
        if prefix_ids is None:
            prefix_ids = self._prefix_ids[prefix] = self.spm_model.encode(prefix, out_type=int)
        ids = self.spm_model.encode(prefix + text, out_type=int)
        if ids[: len(prefix_ids)] == prefix_ids:
            return ids[len(prefix_ids) :]
        # The prefix merged with the text: drop a lone word-start token instead.
        ids = self.spm_model.encode(text, out_type=int)
        if ids and ids[0] == self._dummy_prefix_id and not text[:1].isspace():
            ids = ids[1:]
        return ids

    def decode(self, ids: List[int]) -> str:
        """The text of ``ids`` (SentencePiece leaves BOS and EOS out)."""
        return self.spm_model.decode(ids)


class SentencePieceTokenizer(SentencePieceBaseTokenizer):
    """``SentencePieceBaseTokenizer`` for the instruction datasets: a ``max_seq_len`` they truncate to, a
    usable ``pad_id`` and a ``decode`` that reads a row of a batch.

    Padding: Llama 2's model has no pad token (``pad_id == -1``); ``pad_id`` is then 0 (``<unk>``).
    Padded positions carry label -100 and come after the real tokens of a causal model, so their id never
    reaches the loss. ``decode`` leaves out BOS, EOS, padding, -100 and ids past the vocabulary.

    Args:
        path: the ``tokenizer.model`` file (config key ``tokenizer.path``).
        max_seq_len: optional default longest sequence for datasets built on this tokenizer; ``encode``
            itself never truncates.
    """

    def __init__(self, path: Union[str, Path], max_seq_len: Optional[int] = None) -> None:
        super().__init__(path)
        self.max_seq_len = max_seq_len
        if self.pad_id < 0:
            self.pad_id = 0

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; BOS, EOS, padding, -100 and out-of-range ids are skipped."""
        skip = {self.bos_id, self.eos_id, self.pad_id}
        return self.spm_model.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size and int(i) not in skip])

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(path='{self.path}', vocab_size={self.vocab_size})"


class SentencePieceModelTokenizer(SentencePieceTokenizer):
    """The model tokenizer of a SentencePiece model whose chat format is plain text (Llama 2, Mistral v0.1,
    Gemma): an optional prompt template around the messages, BOS at the start of each turn and EOS after
    each assistant message (``tokenize_messages_no_special_tokens``).

    Args:
        path: the ``tokenizer.model`` file (config key ``tokenizer.path``).
        max_seq_len: the longest ``tokenize_messages`` returns, and the datasets' default; None for no limit.
        prompt_template: a template applied to the messages before they are tokenized, or None.
        truncation_type: ``"right"`` cuts the end of a long conversation, ``"left"`` its start.
    """

    def __init__(
        self,
        path: Union[str, Path],
        max_seq_len: Optional[int] = None,
        prompt_template: Optional[Any] = None,
        truncation_type: str = "right",
    ) -> None:
        super().__init__(path, max_seq_len=max_seq_len)
        self.prompt_template = prompt_template
        self.truncation_type = truncation_type
        self.special_tokens: Dict[str, int] = {}
        # Generation stops at EOS.
        self.stop_tokens = [self.eos_id]

    def _tokenize(self, messages: List[Message], add_bos: bool, add_eos: bool) -> Tuple[List[int], List[bool]]:
        if self.prompt_template is not None:
            messages = self.prompt_template(messages)
        return tokenize_messages_no_special_tokens(
            self, messages, bos_id=self.bos_id if add_bos else None, eos_id=self.eos_id if add_eos else None
        )

    def tokenize_messages(
        self, messages: List[Message], *, add_start_tokens: bool = True, add_end_tokens: bool = True
    ) -> Tuple[List[int], List[bool]]:
        """``(tokens, mask)`` of the templated messages, joined as their text is; mask True = not learnt.
        ``add_start_tokens`` puts BOS before each turn, ``add_end_tokens`` EOS after each assistant message."""
        return self._tokenize(messages, add_start_tokens, add_end_tokens)

    def __call__(self, sample: Mapping[str, Any], inference: bool = False) -> Mapping[str, Any]:
        """``sample["messages"]`` replaced by ``tokens`` and ``mask`` (``inference``: no EOS at the end)."""
        messages = sample.pop("messages")
        sample["tokens"], sample["mask"] = self._tokenize(messages, True, not inference)
        return sample

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path='{self.path}', vocab_size={self.vocab_size})"
