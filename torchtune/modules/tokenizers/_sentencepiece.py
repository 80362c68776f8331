"""SentencePiece tokenizer (the format of Llama2's ``tokenizer.model``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence, Union

from torchtune._assets import missing_path_hint
from torchtune._errors import TuneError
from torchtune.modules.tokenizers._format import (
    DESCRIPTIONS,
    HF_TOKENIZER_JSON,
    TIKTOKEN,
    sniff_tokenizer_format,
    tokenizer_owner,
)

# Prepended to a text encoded with ``trim_leading_whitespace=True`` and stripped again. A newline is
# a byte-fallback piece in Llama2's vocabulary that never merges with what follows, so the text after
# it is tokenized exactly as it is in the middle of a longer text.
_ENCODE_PREFIX = "\n"


class SentencePieceTokenizer:
    """Wraps a ``sentencepiece.SentencePieceProcessor`` loaded from ``path``.

    SentencePiece adds a dummy-prefix ``▁`` (a space) at the start of every ``encode`` call. When a
    prompt and its response are encoded separately and joined, that ``▁`` would appear at the junction,
    where the text has no space, and the response's first word would get the "word start" token instead
    of the mid-text one. ``encode(text, trim_leading_whitespace=True)`` avoids it: it encodes
    ``"\\n" + text`` and strips the tokens of the ``"\\n"`` prefix (known from encoding the prefix alone
    at construction). So ``encode(prompt, add_eos=False) + encode(response, add_bos=False,
    trim_leading_whitespace=True) == encode(prompt + response)`` whenever the prompt ends at a token
    boundary of the joined text: after a newline (Alpaca's ``"### Response:\\n"``), or before a space
    that the response starts with (``"Answer:"`` + ``" 42"``). If a model merges the newline with the
    next character (no Llama2 model does), the prefix cannot be stripped safely and the method falls
    back to dropping a lone leading ``▁`` token.

    Padding: Llama2's model defines no pad token (``pad_id == -1``). ``pad_id`` then returns 0 (the
    ``<unk>`` id): padded positions carry label -100 and sit after the real tokens of a causal model, so
    their token id never influences the loss. ``decode`` skips ``bos_id``, ``eos_id`` and ``pad_id``.

    Args:
        path: the ``tokenizer.model`` file (config key ``tokenizer.path``).
        max_seq_len: optional default longest sequence for datasets built on this tokenizer; ``encode``
            itself never truncates.

    Raises:
        TuneError: the file is missing, is a directory, or is not a SentencePiece model.
    """

    def __init__(self, path: Union[str, Path], max_seq_len: Optional[int] = None) -> None:
        import sentencepiece as spm

        path = Path(path).expanduser()
        hint = (
            "Set tokenizer.path to the tokenizer.model file of your model; "
            "`tune download meta-llama/Llama-2-7b-hf --output-dir /tmp/Llama-2-7b-hf` puts it in that folder."
        )
        if path.is_dir():
            inside = path / "tokenizer.model"
            more = f" It contains a tokenizer.model: use tokenizer.path={inside}." if inside.is_file() else ""
            raise TuneError(
                f"The tokenizer path '{path}' (config key tokenizer.path) is a folder, "
                f"not a tokenizer.model file.{more} {hint}"
            )
        if not path.is_file():
            raise TuneError(
                f"The tokenizer file '{path}' (config key tokenizer.path) does not exist."
                f"{missing_path_hint(path)} {hint}"
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
                        "Llama 3.x ships this format: "
                        "set tokenizer._component_=torchtune.models.llama3.llama3_tokenizer"
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
                    "family; or, for a Llama 2 model, point tokenizer.path at its SentencePiece tokenizer.model."
                ) from err
            raise TuneError(
                f"The tokenizer file '{path}' (config key tokenizer.path) is not a valid SentencePiece "
                f"model ({err}). Point tokenizer.path at the tokenizer.model that came with the "
                f"weights (a Hugging Face tokenizer.json is a different format). {hint}"
            ) from err
        self.path = path
        self.spm_model = processor
        self.max_seq_len = max_seq_len
        self._prefix_ids: List[int] = processor.Encode(_ENCODE_PREFIX)
        self._dummy_prefix_id: int = processor.PieceToId("▁")

    @property
    def vocab_size(self) -> int:
        """Number of pieces (the model's embedding rows must be at least this many)."""
        return self.spm_model.GetPieceSize()

    @property
    def bos_id(self) -> int:
        return self.spm_model.bos_id()

    @property
    def eos_id(self) -> int:
        return self.spm_model.eos_id()

    @property
    def pad_id(self) -> int:
        """The model's pad id, or 0 when it defines none (Llama2: -1); see the class docstring."""
        pad = self.spm_model.pad_id()
        return pad if pad >= 0 else 0

    def encode(
        self,
        text: str,
        add_bos: bool = True,
        add_eos: bool = True,
        trim_leading_whitespace: bool = False,
    ) -> List[int]:
        """Token ids of ``text``, optionally with BOS/EOS. ``trim_leading_whitespace=True`` drops the
        dummy-prefix space so the ids can be appended to those of a preceding text."""
        if trim_leading_whitespace:
            ids = self._encode_without_dummy_prefix(text)
        else:
            ids = self.spm_model.Encode(text)
        if add_bos and self.bos_id >= 0:
            ids = [self.bos_id] + ids
        if add_eos and self.eos_id >= 0:
            ids = ids + [self.eos_id]
        return ids

    def _encode_without_dummy_prefix(self, text: str) -> List[int]:
        ids = self.spm_model.Encode(_ENCODE_PREFIX + text)
        n = len(self._prefix_ids)
        if ids[:n] == self._prefix_ids:
            return ids[n:]
        # The prefix merged with the text (an unusual vocabulary): drop a lone dummy-prefix token.
        ids = self.spm_model.Encode(text)
        if ids and ids[0] == self._dummy_prefix_id and not text[:1].isspace():
            ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; BOS, EOS, padding, -100 and out-of-range ids are skipped."""
        skip = {self.bos_id, self.eos_id, self.pad_id}
        size = self.vocab_size
        return self.spm_model.Decode([int(i) for i in ids if 0 <= int(i) < size and int(i) not in skip])

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(path='{self.path}', vocab_size={self.vocab_size})"
