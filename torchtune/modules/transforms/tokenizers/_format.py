"""Tell tokenizer files apart by their bytes, so that a file given to the wrong tokenizer gets a message
that names the right one instead of a parser's error."""

from __future__ import annotations

import binascii
import json
import re
from pathlib import Path
from typing import Optional

SENTENCEPIECE = "sentencepiece"
TIKTOKEN = "tiktoken"
HF_TOKENIZER_JSON = "tokenizer.json"
UNKNOWN = "unknown"

# One line of a tiktoken BPE file: the token's bytes in base64, a space, its rank.
_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+={0,2} \d+$")

DESCRIPTIONS = {
    SENTENCEPIECE: "a SentencePiece model (the tokenizer.model of Llama 2)",
    TIKTOKEN: "a tiktoken BPE file (the original/tokenizer.model of Llama 3.x)",
    HF_TOKENIZER_JSON: "a Hugging Face tokenizer.json",
    UNKNOWN: "not a tokenizer file this library reads",
}


def sniff_tokenizer_format(path: Path) -> str:
    """``"sentencepiece"``, ``"tiktoken"``, ``"tokenizer.json"`` or ``"unknown"`` for the file at ``path``."""
    with open(path, "rb") as f:
        head = f.read(4096)
    stripped = head.lstrip()
    if stripped.startswith(b"{"):
        return HF_TOKENIZER_JSON
    first_line = head.split(b"\n", 1)[0].rstrip(b"\r")
    if _TIKTOKEN_LINE.match(first_line):
        try:
            binascii.a2b_base64(first_line.split(b" ", 1)[0])
            return TIKTOKEN
        except binascii.Error:
            pass
    # A SentencePiece ModelProto starts with its repeated `pieces` field: tag byte 0x0A.
    if head[:1] == b"\n" and _loads_as_sentencepiece(path):
        return SENTENCEPIECE
    return UNKNOWN


def _loads_as_sentencepiece(path: Path) -> bool:
    import sentencepiece as spm

    try:
        spm.SentencePieceProcessor().Load(str(path))
    except (RuntimeError, OSError):
        return False
    return True


def tokenizer_owner(path: Path) -> Optional[str]:
    """Whose tokenizer the file at ``path`` is, from the ``config.json`` of its model folder (beside it, or one
    folder up for Llama 3's ``original/tokenizer.model``): ``"Qwen3 (tokenizer._component_=...)"``, or None
    when no readable config.json names a family this library implements."""
    from torchtune._errors import TuneError
    from torchtune.models._hf_family import detect_family

    for folder in (path.parent, path.parent.parent):
        config_file = folder / "config.json"
        if not config_file.is_file():
            continue
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
            family = detect_family(config, config_file) if isinstance(config, dict) else None
        except (OSError, ValueError, TuneError):
            return None
        if family is None:
            return None
        package = family.builder.rsplit(".", 1)[0]  # torchtune.models.qwen3
        if package.rsplit(".", 1)[1].startswith("llama3"):
            package = "torchtune.models.llama3"
        builder = f"{package}.{package.rsplit('.', 1)[1]}_tokenizer"
        return f"{family.name}'s (its folder's config.json says so): set tokenizer._component_={builder}"
    return None
