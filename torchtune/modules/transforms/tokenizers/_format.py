"""Tell tokenizer files apart by their bytes, so that a file given to the wrong tokenizer gets a message
that names the right one instead of a parser's error."""

from __future__ import annotations

import binascii
import re
from pathlib import Path

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
