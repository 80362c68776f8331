"""The files of a saved Hugging Face folder that are not weights, written so the folder tells the truth
and loads on its own with ``AutoModelForCausalLM`` / ``AutoTokenizer`` / ``GenerationConfig``.

* ``config.json``: the input's, with ``torch_dtype`` (or ``dtype``, the newer name, where the input
  uses it) set to the dtype of the tensors written -- a bf16 finetune of a float16 download says bfloat16.
* tokenizer files: copied from the input folder (``tokenizer.json``, the chat template, Llama 3's
  ``original/tokenizer.model`` and the other side files transformers and our tokenizers read); when
  the input has a SentencePiece ``tokenizer.model`` but no ``tokenizer_config.json`` /
  ``special_tokens_map.json`` (the demo bundle, a converted Meta download), they are written from it:
  BOS added, EOS not, as the recipes encode a prompt.
* ``generation_config.json``: copied, or written with the tokenizer's (else config.json's) BOS/EOS ids.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

import torch

CONFIG = "config.json"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_MODEL = "tokenizer.model"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
CHAT_TEMPLATE = "chat_template.jinja"
# Copied as they are when the input folder has them: what AutoTokenizer reads (the chat template is its own
# file since transformers 4.50), and Llama 3's tiktoken file, which our llama3_tokenizer reads.
COPIED = (
    TOKENIZER_MODEL,
    "tokenizer.json",
    TOKENIZER_CONFIG,
    SPECIAL_TOKENS_MAP,
    GENERATION_CONFIG,
    CHAT_TEMPLATE,
    "chat_template.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "original/tokenizer.model",
)

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _write_json(path: Path, data: Dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def model_config(config: Dict[str, Any], dtype: Optional[torch.dtype]) -> Dict[str, Any]:
    """``config`` with the dtype entries set to ``dtype`` (left as they are when ``dtype`` is unknown)."""
    out = dict(config)
    if dtype in DTYPE_NAMES:
        # transformers < 4.56 writes torch_dtype, later versions dtype: set the ones the input has.
        keys = [k for k in ("torch_dtype", "dtype") if k in out] or ["torch_dtype"]
        for key in keys:
            out[key] = DTYPE_NAMES[dtype]
    return out


def _sentencepiece_tokens(path: Path) -> Optional[Dict[str, Any]]:
    """BOS/EOS/UNK/PAD pieces and ids of a SentencePiece model, or None if ``path`` is not one."""
    try:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(path))
    except Exception:  # not SentencePiece (Llama 3's tiktoken file), or sentencepiece missing
        return None

    def piece(i: int) -> Optional[str]:
        return sp.IdToPiece(i) if 0 <= i < sp.GetPieceSize() else None

    return {
        "bos": (piece(sp.bos_id()), sp.bos_id()),
        "eos": (piece(sp.eos_id()), sp.eos_id()),
        "unk": (piece(sp.unk_id()), sp.unk_id()),
        "pad": (piece(sp.pad_id()), sp.pad_id()),
    }


def tokenizer_config(tokens: Dict[str, Any], max_length: Optional[int]) -> Dict[str, Any]:
    """``tokenizer_config.json`` of a Llama SentencePiece tokenizer that encodes as the recipes do:
    BOS first, no EOS (the dataset appends EOS after the response)."""
    return {
        "tokenizer_class": "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": tokens["bos"][0],
        "eos_token": tokens["eos"][0],
        "unk_token": tokens["unk"][0],
        "pad_token": tokens["pad"][0],
        "model_max_length": max_length if max_length else 1_000_000_000_000_000_019_884_624_838_656,
        "clean_up_tokenization_spaces": False,
        "legacy": True,  # SentencePiece's own encoding (what the recipes train on), not transformers' variant
        "sp_model_kwargs": {},
    }


def write_hf_side_files(
    source_dir: Path, folder: Path, *, config: Dict[str, Any], dtype: Optional[torch.dtype]
) -> None:
    """Write ``config.json``, the tokenizer files and ``generation_config.json`` of a saved HF folder.

    Args:
        source_dir: the input model folder (``checkpointer.checkpoint_dir``) whose files are copied.
        folder: the folder being saved.
        config: the input's ``config.json``.
        dtype: the dtype of the weights written.
    """
    _write_json(folder / CONFIG, model_config(config, dtype))
    for name in COPIED:
        if (source_dir / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source_dir / name, folder / name)
    tokens = _sentencepiece_tokens(folder / TOKENIZER_MODEL) if (folder / TOKENIZER_MODEL).is_file() else None
    if tokens is not None:
        if not (folder / TOKENIZER_CONFIG).is_file():
            _write_json(folder / TOKENIZER_CONFIG, tokenizer_config(tokens, config.get("max_position_embeddings")))
        if not (folder / SPECIAL_TOKENS_MAP).is_file():
            # transformers' keys: bos_token, eos_token, unk_token
            special = {f"{k}_token": tokens[k][0] for k in ("bos", "eos", "unk") if tokens[k][0]}
            _write_json(folder / SPECIAL_TOKENS_MAP, special)
    if not (folder / GENERATION_CONFIG).is_file():
        bos = tokens["bos"][1] if tokens else config.get("bos_token_id")
        eos = tokens["eos"][1] if tokens else config.get("eos_token_id")
        generation = {"bos_token_id": bos, "eos_token_id": eos}
        if tokens and tokens["pad"][1] >= 0:
            generation["pad_token_id"] = tokens["pad"][1]
        _write_json(folder / GENERATION_CONFIG, {k: v for k, v in generation.items() if v is not None and v >= 0})
