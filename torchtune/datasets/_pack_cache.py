"""The on-disk cache of a packed dataset: packing tokenizes every example, so it is done once per
(data, tokenizer, max_seq_len) and the packs are kept next to the dataset's own cache files.

The cache file lives in a ``packs/`` folder beside the Arrow files ``datasets.load_dataset`` wrote
(``~/.cache/huggingface/datasets/...`` or the ``cache_dir`` given), named by a SHA-256 of everything
that decides the packs:

- the data: the ``datasets`` fingerprint of the loaded split (it changes when a data file changes);
- how a row becomes tokens: the dataset's own settings (column map, ``train_on_input``, ``chat_format``,
  ``max_seq_len``, ...), and the source of the modules that do it (dataset, message and model transforms,
  template and tokenizer classes, this packing code), so a code change cannot serve stale packs;
- the tokenizer: its class, the SHA-256 of its model file, its special ids, its ``max_seq_len``, its prompt
  template and its chat template;
- the packing: ``max_seq_len``, ``padding_idx``, ``max_packs``, ``split_across_pack``, ``best_fit``.

A dataset without cache files (built in memory) or a tokenizer without a ``path`` is packed every
time; the log line of the packed dataset says which happened.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import torch

__all__ = ["pack_cache_file", "load_packs", "save_packs"]

# Bump when the file layout below changes.
_FORMAT = 3


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _module_sha256(obj: Any) -> str:
    """SHA-256 of the source file of ``obj``'s class (or of ``obj`` if it is a class)."""
    cls = obj if isinstance(obj, type) else type(obj)
    try:
        return _file_sha256(Path(inspect.getfile(cls)))
    except (TypeError, OSError):
        return f"{cls.__module__}.{cls.__qualname__}"  # built-in or generated: its name is all there is


def tokenizer_fingerprint(tokenizer: Any) -> Optional[Dict[str, Any]]:
    """What identifies a tokenizer's output, or None when it has no model file to hash."""
    path = getattr(tokenizer, "path", None)
    if path is None or not Path(path).is_file():
        return None
    chat_template = getattr(tokenizer, "chat_template", None)
    return {
        "class": f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}",
        "code": _module_sha256(tokenizer),
        "file": _file_sha256(Path(path)),
        "ids": [getattr(tokenizer, name, None) for name in ("bos_id", "eos_id", "pad_id")],
        # what else changes tokenize_messages: its cut, its prompt template, a folder's chat template
        "max_seq_len": getattr(tokenizer, "max_seq_len", None),
        "prompt_template": _describe_template(getattr(tokenizer, "prompt_template", None)),
        "chat_template": hashlib.sha256(chat_template.encode()).hexdigest() if isinstance(chat_template, str) else None,
    }


def _describe_template(template: Any) -> Optional[str]:
    """A prompt template as the cache key holds it: its class and its ``{role: (before, after)}`` texts."""
    if template is None:
        return None
    cls = type(template)
    return f"{cls.__module__}.{cls.__qualname__}:{getattr(template, 'template', '')!r}"


def pack_cache_file(
    hf_data: Any,
    settings: Mapping[str, Any],
    code: list,
    tokenizer: Any,
    *,
    packing: Mapping[str, Any],
) -> Optional[Path]:
    """The cache file of these packs, or None when they cannot be cached (see the module docstring).

    Args:
        hf_data: the loaded ``datasets.Dataset`` the examples come from.
        settings: the dataset's own settings that change its tokens (JSON-serialisable).
        code: objects whose classes' source files turn a row into tokens (dataset, message and model
            transforms, template).
        tokenizer: the tokenizer.
        packing: the ``PackedDataset`` arguments (``max_seq_len``, ``padding_idx``, ``best_fit`` ...).
    """
    cache_files = getattr(hf_data, "cache_files", None) or []
    fingerprint = getattr(hf_data, "_fingerprint", None)
    tok = tokenizer_fingerprint(tokenizer)
    if not cache_files or fingerprint is None or tok is None:
        return None
    key = {
        "format": _FORMAT,
        "data": fingerprint,
        "settings": dict(settings),
        "code": [_module_sha256(obj) for obj in code] + [_file_sha256(Path(f)) for f in _packing_sources()],
        "tokenizer": tok,
        "packing": dict(packing),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return Path(cache_files[0]["filename"]).parent / "packs" / f"packed-{digest}.pt"


def _packing_sources() -> list:
    """The packing algorithm (``_packed.py``, beside this file: not imported, it imports this) and this
    file layout."""
    return [str(Path(__file__).with_name("_packed.py")), __file__]


def save_packs(path: Path, packs: Mapping[str, Any], num_examples: int, num_dropped: int) -> None:
    """Write the packs to ``path`` atomically (a temporary file in the same folder, then a rename), so
    a crash or a concurrent run never leaves a half-written cache under the final name.

    ``packs``: ``tokens``, ``labels``, ``input_pos`` (``[P, L]``), ``padding`` (``[P]``) and ``seq_lens``
    (one tensor per pack)."""
    from torchtune.utils._checkpointing._atomic import fsync_file

    path.parent.mkdir(parents=True, exist_ok=True)
    seq_lens = packs["seq_lens"]
    payload = {
        "format": _FORMAT,
        "tokens": packs["tokens"].to(torch.int32),
        "labels": packs["labels"].to(torch.int32),
        "input_pos": packs["input_pos"].to(torch.int32),
        "seq_lens": torch.cat([torch.as_tensor(s, dtype=torch.int32) for s in seq_lens]),
        "segments_per_pack": torch.tensor([len(s) for s in seq_lens], dtype=torch.int64),
        "padding": packs["padding"].to(torch.int32),
        "num_examples": torch.tensor(num_examples),
        "num_dropped": torch.tensor(num_dropped),
    }
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        torch.save(payload, tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except OSError as err:  # a read-only cache folder: packing still worked, only the cache is lost
        tmp.unlink(missing_ok=True)
        print(f"Could not write the pack cache {path} ({err}); the packs are used without it.", file=sys.stderr)


def load_packs(path: Path) -> Optional[Dict[str, Any]]:
    """The packs saved at ``path`` (as ``save_packs`` takes them, with ``num_examples`` and ``num_dropped``),
    or None if there is no readable cache file of this format."""
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # damaged or foreign: pack again and overwrite it
        return None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        return None
    seq_lens = list(torch.split(payload["seq_lens"].to(torch.int64), payload["segments_per_pack"].tolist()))
    return {
        "tokens": payload["tokens"].to(torch.int64),
        "labels": payload["labels"].to(torch.int64),
        "input_pos": payload["input_pos"],
        "seq_lens": seq_lens,
        "padding": payload["padding"].to(torch.int64),
        "num_examples": int(payload["num_examples"]),
        "num_dropped": int(payload["num_dropped"]),
    }
