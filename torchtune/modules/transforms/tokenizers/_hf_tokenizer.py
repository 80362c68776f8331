"""A Hugging Face ``tokenizer.json`` read through the ``tokenizers`` library."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from torchtune._errors import TuneError, TuneValueError
from torchtune.modules.transforms.tokenizers._utils import BaseTokenizer


class TokenizerJson:
    """The pipeline a ``tokenizer.json`` describes (normalizer, pre-tokenizer, model, decoder) without its
    post-processor: ``encode`` gives the ids of the text alone, for a model tokenizer to put its own
    special tokens around. Special tokens written in the text are recognised. The model tokenizers of
    this library read a ``tokenizer.json`` through this class.

    Args:
        path: the ``tokenizer.json`` file.

    Raises:
        TuneError: the file does not load as a ``tokenizer.json``.
    """

    def __init__(self, path: Union[str, Path]) -> None:
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception for a malformed file
            raise TuneError(
                f"The tokenizer file {path} (config key tokenizer.path) could not be read as a Hugging Face "
                f"tokenizer.json ({err}). Download it again, or point tokenizer.path at the model's own "
                "tokenizer file."
            ) from err
        added = self._tokenizer.get_added_tokens_decoder()
        self.special_tokens: Dict[str, int] = {tok.content: idx for idx, tok in added.items() if tok.special}

    @property
    def vocab_size(self) -> int:
        """Tokens including the added (special) ones."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> Optional[int]:
        """The id of ``token``, or None."""
        return self._tokenizer.token_to_id(token)

    def encode(self, text: str) -> List[int]:
        """The ids of ``text``, without the post-processor's tokens."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _read_json(path: Union[str, Path], what: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise TuneError(f"Cannot read the {what} {path}: {err}. Use the model folder's own file.") from err


class HuggingFaceBaseTokenizer(BaseTokenizer):
    """A ``tokenizer.json`` as a base tokenizer, with BOS/EOS from the model folder's
    ``tokenizer_config.json`` (``bos_token`` / ``eos_token``) or, failing that, ``generation_config.json``
    (``bos_token_id`` / ``eos_token_id``). ``encode`` runs the whole pipeline, post-processor included, and
    adds BOS / EOS only where the post-processor does not already.

    Args:
        tokenizer_json_path: the ``tokenizer.json``.
        tokenizer_config_json_path: the ``tokenizer_config.json``.
        generation_config_path: the ``generation_config.json``.

    Raises:
        TuneValueError: neither config file given, or neither gives BOS and EOS.
        TuneError: a file that cannot be read.
    """

    def __init__(
        self,
        tokenizer_json_path: str,
        *,
        tokenizer_config_json_path: Optional[str] = None,
        generation_config_path: Optional[str] = None,
    ) -> None:
        if not (tokenizer_config_json_path or generation_config_path):
            raise TuneValueError(
                "At least one of tokenizer_config_json_path or generation_config_path must be specified: they "
                "give the BOS and EOS tokens (both are in the model's Hugging Face folder)."
            )
        self.tokenizer = TokenizerJson(tokenizer_json_path)._tokenizer
        self.config = _read_json(tokenizer_config_json_path, "tokenizer config") if tokenizer_config_json_path else None
        self.generation_config = (
            _read_json(generation_config_path, "generation config") if generation_config_path else None
        )
        self._infer_bos_eos_tokens()
        self._infer_should_add_bos_eos()

    def _get_token_from_config(self, config: Dict[str, Any], key: str) -> str:
        """``config[key]`` as a token text: a string, or ``{"content": text}``."""
        token = config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if not isinstance(token, str):
            raise TuneValueError(f"Could not parse {key} from config: {config.get(key)!r}")
        return token

    def _infer_bos_eos_tokens(self) -> None:
        self.bos_id: Optional[int] = None
        self.eos_id: Optional[int] = None
        if self.config:
            self.bos_id = self.tokenizer.token_to_id(self._get_token_from_config(self.config, "bos_token"))
            self.eos_id = self.tokenizer.token_to_id(self._get_token_from_config(self.config, "eos_token"))
        if self.generation_config:
            if self.bos_id is None:
                self.bos_id = self.generation_config.get("bos_token_id")
            if self.eos_id is None:
                self.eos_id = self.generation_config.get("eos_token_id")
        if self.bos_id is None or self.eos_id is None:
            raise TuneValueError(
                "Could not infer BOS and EOS token IDs from config: neither the tokenizer config nor the "
                "generation config names both."
            )

    def _infer_should_add_bos_eos(self) -> None:
        """Whether the post-processor already puts BOS / EOS around a text (then ``encode`` does not)."""
        empty = self.tokenizer.encode("").ids
        self.hf_adds_bos = self.bos_id in empty
        self.hf_adds_eos = self.eos_id in empty

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> List[int]:
        """The ids of ``text``, BOS / EOS added on request where the post-processor does not add them."""
        ids = list(self.tokenizer.encode(text).ids)
        if add_bos and not self.hf_adds_bos:
            ids = [self.bos_id] + ids
        if add_eos and not self.hf_adds_eos:
            ids = ids + [self.eos_id]
        return ids

    def decode(self, token_ids: List[int]) -> str:
        """The text of ``token_ids``."""
        return self.tokenizer.decode(token_ids)
