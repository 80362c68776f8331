"""Byte-level BPE from a ``vocab.json`` and a ``merges.txt`` (GPT-2's file format, also Qwen's and Phi-4's),
run by the ``tokenizers`` library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from torchtune._errors import TuneError
from torchtune.modules.transforms.tokenizers._utils import BaseTokenizer

# The split before BPE of torchtune's GPT2BaseTokenizer: contractions, then a word, a number or a run of
# other symbols each with at most one leading space, then whitespace.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[\w]+| ?\d+| ?[^\s\w\d]+|\s+(?!\S)|\s+"""


def _read_merges(path: Union[str, Path]) -> List[Tuple[str, str]]:
    merges = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line or (number == 1 and line.startswith("#version")):
                continue
            pair = line.split()
            if len(pair) != 2:
                raise TuneError(f"Line {number} of the merges file {path} is not two tokens: {line[:60]!r}.")
            merges.append((pair[0], pair[1]))
    return merges


def byte_level_bpe(vocab_path: Union[str, Path], merges_path: Union[str, Path], pattern: str) -> Any:
    """A ``tokenizers.Tokenizer`` for GPT-2-style files: the text split by ``pattern`` (each match a piece),
    each piece's bytes mapped to GPT-2's printable characters, then BPE with the file's merges in rank order.
    No normalizer, special tokens or post-processor: the model tokenizers handle those.

    Raises:
        TuneError: a file that is missing or malformed.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    try:
        with open(vocab_path, encoding="utf-8") as f:
            vocab = json.load(f)
        # A merge whose result is not in the vocabulary could only produce an unknown token; a vocabulary
        # cut short (as in small test files) keeps the merges it can use, in their rank order.
        merges = [(a, b) for a, b in _read_merges(merges_path) if a + b in vocab and a in vocab and b in vocab]
        bpe = models.BPE(vocab=vocab, merges=merges)
    except Exception as err:  # OSError, bad JSON, or the bare Exception tokenizers raises for a bad merge
        raise TuneError(
            f"Cannot build the BPE tokenizer from {vocab_path} and {merges_path}: {err}. Use the vocab.json and "
            "merges.txt of one model folder (config keys tokenizer.path and tokenizer.merges_file)."
        ) from err
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class GPT2BaseTokenizer(BaseTokenizer):
    """GPT-2's byte-level BPE from ``vocab.json`` and ``merges.txt``.

    Args:
        vocab_path: the ``vocab.json``.
        merges_path: the ``merges.txt``.
        unk_id: id for an unknown token (kept; byte-level BPE has none).
        bos_id: id ``encode`` puts first with ``add_bos``.
        eos_id: id ``encode`` puts last with ``add_eos``.
        pad_id: the padding id.
    """

    def __init__(
        self,
        vocab_path: str,
        merges_path: str,
        unk_id: Optional[int] = None,
        bos_id: Optional[int] = None,
        eos_id: Optional[int] = None,
        pad_id: Optional[int] = None,
    ) -> None:
        self._bpe = byte_level_bpe(vocab_path, merges_path, GPT2_PATTERN)
        self.encoder: Dict[str, int] = self._bpe.get_vocab()
        self.decoder: Dict[int, str] = {i: token for token, i in self.encoder.items()}
        self.unk_id = unk_id
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id

    @property
    def vocab_size(self) -> int:
        """Entries of ``vocab.json``."""
        return len(self.encoder)

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> List[int]:
        """The ids of ``text``, ``bos_id`` / ``eos_id`` around them on request."""
        ids = self._bpe.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, tokens: List[int]) -> List[str]:
        """The vocabulary entry of each id (GPT-2's byte characters, ``Ġ`` for a space), as torchtune's
        returns them; ``None`` for an id not in the vocabulary."""
        return [self.decoder.get(i) for i in tokens]
