"""What the family tokenizer builders share: torchtune's arguments, accepted and kept on the tokenizer, and
torchtune's ``vocab.json`` / ``merges.txt`` paths turned into the ``tokenizer.json`` beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, TypeVar

from torchtune._errors import TuneError

T = TypeVar("T")

TOKENIZER_JSON = "tokenizer.json"


def keep_args(tokenizer: T, **args: Any) -> T:
    """``tokenizer`` with torchtune's builder arguments (``prompt_template``, ``truncation_type``,
    ``special_tokens_path``, ...) set as its attributes, as given: the message layer reads them there."""
    for name, value in args.items():
        setattr(tokenizer, name, value)
    return tokenizer


def tokenizer_json(path: str, merges_file: Optional[str], *, family: str, key: str = "tokenizer.path") -> str:
    """The ``tokenizer.json`` to read for torchtune's ``path`` (and ``merges_file``).

    torchtune's byte-level BPE builders take the ``vocab.json`` and ``merges.txt`` of a Hugging Face folder;
    the same folder holds ``tokenizer.json``, which has both and the special tokens, and is what is read
    here. A ``tokenizer.json`` (or a folder) is taken as it is.

    Raises:
        TuneError: a ``vocab.json`` with no ``tokenizer.json`` beside it.
    """
    given = Path(path).expanduser()
    if given.name == TOKENIZER_JSON or given.is_dir() or given.suffix != ".json":
        return path
    beside = given.parent / TOKENIZER_JSON
    if beside.is_file():
        return str(beside)
    merges = f" and {merges_file}" if merges_file else ""
    raise TuneError(
        f"{key}={path}{merges}: the {family} tokenizer here reads the folder's {TOKENIZER_JSON} (the same vocabulary "
        f"and merges, with the special tokens), and there is none at {beside}. Point {key} at the model folder's "
        f"{TOKENIZER_JSON}, or put it beside {given.name}."
    )


def model_or_json_tokenizer(path: str, max_seq_len: Optional[int]) -> Any:
    """The tokenizer of ``path``: a ``tokenizer.json`` (or a folder holding one) through
    ``HFModelTokenizer``, else a SentencePiece ``tokenizer.model`` (torchtune's Mistral, Gemma and Phi-3
    builders take that one)."""
    from torchtune.modules.tokenizers import HFModelTokenizer, SentencePieceTokenizer

    given = Path(path).expanduser()
    if given.suffix == ".json" or given.is_dir():
        return HFModelTokenizer(path, max_seq_len=max_seq_len)
    return SentencePieceTokenizer(path, max_seq_len=max_seq_len)
