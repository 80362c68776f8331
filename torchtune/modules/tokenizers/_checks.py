"""The value checks of the tokenizer builders' arguments, shared by every model family."""

from __future__ import annotations

from typing import Any, Mapping

from torchtune._errors import ConfigError
from torchtune.config._types import whole_number


def check_tokenizer_args(key: str, fields: Mapping[str, Any]) -> None:
    """``max_seq_len`` holds BOS and EOS (or is null: no limit); ``path`` is not empty. Whether the file
    exists and parses is checked when the tokenizer is loaded (before the model, and by ``tune validate``)."""
    whole_number(f"{key}.max_seq_len", fields.get("max_seq_len"), minimum=2, allow_none=True, why=" (BOS and EOS)")
    path = fields.get("path", "?")
    if isinstance(path, str) and not path.strip():
        raise ConfigError(f"{key}.path is empty: set it to the tokenizer file, e.g. {key}.path=/path/tokenizer.model.")
