"""A tiktoken BPE tokenizer read from a local rank file (Llama 3's ``original/tokenizer.model``)."""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Dict, Iterator, List, Union

from torchtune._errors import TuneError
from torchtune.modules.transforms.tokenizers._utils import BaseTokenizer

# tiktoken is slow on very long inputs and on long runs without a whitespace change: texts are encoded in
# chunks of at most this many characters, runs of one kind cut at the second length.
MAX_ENCODE_CHARS = 400_000
MAX_NO_WHITESPACE_CHARS = 25_000


def read_bpe_ranks(path: Union[str, Path]) -> Dict[bytes, int]:
    """``{token bytes: rank}`` from a tiktoken BPE file: one ``<base64 token> <rank>`` per line.

    Read here rather than with ``tiktoken.load.load_tiktoken_bpe``, which caches files by their path
    in a temporary folder and would keep serving an old file after it is replaced at the same path.

    Raises:
        TuneError: a missing file, a line that is not ``<base64> <integer>`` (the line number is given), or
            no lines.
    """
    ranks: Dict[bytes, int] = {}
    try:
        f = open(path, "rb")
    except OSError as err:
        raise TuneError(
            f"The tiktoken BPE file {path} (config key tokenizer.path) cannot be read: {err}. Point tokenizer.path "
            "at the model's original/tokenizer.model."
        ) from err
    with f:
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


class TikTokenBaseTokenizer(BaseTokenizer):
    """Byte-level BPE through ``tiktoken``: a rank file, a pre-tokenization regex and special tokens at
    given ids.

    Args:
        path: the BPE rank file.
        name: a name for the ``tiktoken.Encoding``.
        pattern: the regex that splits text into pieces before BPE.
        bos_id: the id ``encode`` puts first with ``add_bos`` (in ``special_tokens`` or not).
        eos_id: the id ``encode`` puts last with ``add_eos``; ``decode`` stops there.
        special_tokens: ``{text: id}`` of the special tokens.
        special_tokens_in_text: a special token's text inside an encoded text becomes its id, as
            transformers encodes it (Llama 3's tokenizer does this); by default it is encoded as text.

    Raises:
        TuneError: an unreadable rank file, or one without a token for each of the 256 bytes.
    """

    def __init__(
        self,
        path: str,
        name: str,
        pattern: str,
        bos_id: int,
        eos_id: int,
        special_tokens: Dict[str, int],
        *,
        special_tokens_in_text: bool = False,
    ) -> None:
        import tiktoken

        ranks = read_bpe_ranks(path)
        missing_bytes = [b for b in range(256) if bytes([b]) not in ranks]
        if missing_bytes:
            # tiktoken aborts the process on a byte it cannot start from; say so up front instead.
            raise TuneError(
                f"The tiktoken BPE file {path} has no token for {len(missing_bytes)} of the 256 single bytes "
                f"(e.g. byte {missing_bytes[0]}), so some texts could not be encoded. A byte-level BPE file "
                "starts from every byte; the file is incomplete or not this model's tokenizer."
            )
        self.tt_model = tiktoken.Encoding(
            name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=dict(special_tokens)
        )
        self.base_vocab_size = len(ranks)
        self.vocab_size = self.tt_model.n_vocab
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.special_tokens = dict(special_tokens)
        self._allowed_special: Union[str, set] = "all" if special_tokens_in_text else set()

    def _split_long_repetitions(self, s: str, max_consecutive_slice_len: int) -> Iterator[str]:
        """Cut ``s`` wherever a run of whitespace, or of non-whitespace, would exceed the given length."""
        start = 0
        run = 0
        run_is_space = s[:1].isspace()
        for i, char in enumerate(s):
            if char.isspace() != run_is_space:
                run_is_space = not run_is_space
                run = 1
                continue
            run += 1
            if run > max_consecutive_slice_len:
                yield s[start:i]
                start = i
                run = 1
        yield s[start:]

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> List[int]:
        """Token ids of ``text``, with ``bos_id`` / ``eos_id`` around it on request."""
        ids: List[int] = []
        for offset in range(0, len(text), MAX_ENCODE_CHARS):
            for piece in self._split_long_repetitions(
                text[offset : offset + MAX_ENCODE_CHARS], MAX_NO_WHITESPACE_CHARS
            ):
                ids += self.tt_model.encode(piece, allowed_special=self._allowed_special, disallowed_special=())
        if add_bos:
            ids = [self.bos_id] + ids
        if add_eos:
            ids = ids + [self.eos_id]
        return ids

    def decode(self, token_ids: List[int], truncate_at_eos: bool = True) -> str:
        """The text of ``token_ids``; with ``truncate_at_eos``, of those before the first ``eos_id`` after
        the first position."""
        ids = list(token_ids)
        if truncate_at_eos and self.eos_id in ids[1:]:
            ids = ids[: ids.index(self.eos_id, 1)]
        return self.tt_model.decode(ids)
