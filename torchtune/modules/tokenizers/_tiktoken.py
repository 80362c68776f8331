"""A tiktoken BPE tokenizer read from a local rank file (Llama 3's ``original/tokenizer.model``)."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Dict, List, Sequence

from torchtune._errors import TuneError


def read_bpe_ranks(path: Path) -> Dict[bytes, int]:
    """``{token bytes: rank}`` from a tiktoken BPE file: one ``<base64 token> <rank>`` per line.

    Read here rather than with ``tiktoken.load.load_tiktoken_bpe``, which caches files by their path
    in a temporary folder and would keep serving an old file after it is replaced at the same path.

    Raises:
        TuneError: a line that is not ``<base64> <integer>`` (the line number is given), or no lines.
    """
    ranks: Dict[bytes, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except (ValueError, binascii.Error) as err:
                raise TuneError(
                    f"Line {number} of the tiktoken BPE file {path} is not '<base64 token> <rank>' "
                    f"({line[:60]!r}); the file is damaged or not a tiktoken file. Download the model's "
                    "original/tokenizer.model again (config key tokenizer.path)."
                ) from err
    if not ranks:
        raise TuneError(f"The tiktoken BPE file {path} (config key tokenizer.path) has no tokens.")
    return ranks


class TikTokenBaseTokenizer:
    """Byte-level BPE through ``tiktoken``: a rank file, a pre-tokenization regex and special tokens.

    ``encode`` recognises special tokens written in the text (``"<|eot_id|>"`` becomes that one id),
    as Hugging Face tokenizers do, so both give the same ids for the same text.

    Args:
        path: the BPE rank file.
        name: a name for the ``tiktoken.Encoding`` (shown in its repr only).
        pattern: the regex that splits text into pieces before BPE.
        special_tokens: special token texts; they get the ids right after the highest rank, in order.
    """

    def __init__(self, path: Path, name: str, pattern: str, special_tokens: Sequence[str]) -> None:
        import tiktoken

        ranks = read_bpe_ranks(path)
        missing_bytes = [b for b in range(256) if bytes([b]) not in ranks]
        if missing_bytes:
            # tiktoken aborts the process on a byte it cannot start from; say so up front instead.
            raise TuneError(
                f"The tiktoken BPE file {path} has no token for {len(missing_bytes)} of the 256 single bytes "
                f"(e.g. byte {missing_bytes[0]}), so some texts could not be encoded. A byte-level BPE file "
                "starts from every byte; the file is incomplete or not a Llama 3 tokenizer."
            )
        first_special = max(ranks.values()) + 1
        self.base_vocab_size = len(ranks)
        self.special_tokens: Dict[str, int] = {tok: first_special + i for i, tok in enumerate(special_tokens)}
        self._special_ids = frozenset(self.special_tokens.values())
        self._encoding = tiktoken.Encoding(
            name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=self.special_tokens
        )

    @property
    def vocab_size(self) -> int:
        """Highest id + 1 (BPE ranks and special tokens)."""
        return self._encoding.n_vocab

    def token_to_id(self, token: str) -> int | None:
        return self.special_tokens.get(token)

    def encode(self, text: str) -> List[int]:
        return self._encoding.encode(text, allowed_special="all")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return self._encoding.decode(list(ids))
