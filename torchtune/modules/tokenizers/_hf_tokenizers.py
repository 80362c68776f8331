"""A Hugging Face ``tokenizer.json`` read through the ``tokenizers`` library."""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence

from torchtune._errors import TuneError


class HuggingFaceBaseTokenizer:
    """Encodes and decodes with the pipeline a ``tokenizer.json`` describes (normalizer, pre-tokenizer,
    model, decoder), without its post-processor: BOS/EOS are added by the model tokenizer on top, so
    ``encode`` returns the ids of the text alone. Special tokens written in the text are recognised.

    Args:
        path: the ``tokenizer.json`` file.
    """

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception for a malformed file
            raise TuneError(
                f"The tokenizer file {path} (config key tokenizer.path) could not be read as a Hugging Face "
                f"tokenizer.json ({err}). Download it again, or point tokenizer.path at the model's "
                "original/tokenizer.model instead."
            ) from err
        added = self._tokenizer.get_added_tokens_decoder()
        self.special_tokens = {tok.content: idx for idx, tok in added.items() if tok.special}

    @property
    def vocab_size(self) -> int:
        """Tokens including the added (special) ones."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> List[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
