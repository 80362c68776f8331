"""What the dataset builders share: the model transform of their ``chat_format``, an ``SFTDataset`` that
checks every row, packing with its cache, and the config checks of their arguments."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Union

from torchtune._errors import ConfigError, TuneValueError
from torchtune.config._types import whole_number
from torchtune.datasets._model_transform import CHAT_FORMATS, model_transform
from torchtune.datasets._pack_cache import pack_cache_file
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._rows import RowCheck, TextColumns
from torchtune.datasets._sft import SFTDataset

__all__ = ["build_sft_dataset", "check_dataset_args", "maybe_pack", "padding_idx"]


def build_sft_dataset(
    tokenizer: Any,
    message_transform: Any,
    *,
    source: str,
    columns: Callable[[List[str], str], TextColumns],
    settings: Mapping[str, Any],
    chat_format: str = "tokenizer",
    max_seq_len: Optional[int] = None,
    packed: bool = False,
    best_fit: bool = False,
    filter_fn: Optional[Callable] = None,
    split: str = "train",
    advice: str = "",
    load_dataset_kwargs: Optional[Dict[str, Any]] = None,
) -> Union[SFTDataset, PackedDataset]:
    """An ``SFTDataset`` of ``message_transform`` and the model transform of ``chat_format``, every row checked
    (``columns``: the ``RowCheck`` of the columns it reads; ``advice`` ends the error about malformed rows),
    packed with ``packed`` (``maybe_pack``; ``settings`` are what the cache key holds of the builder's
    arguments).

    Raises:
        TuneValueError: ``packed`` without a ``max_seq_len`` on the dataset or the tokenizer.
    """
    if packed:
        _pack_length(tokenizer, max_seq_len)
    ds = SFTDataset(
        source=source,
        message_transform=message_transform,
        model_transform=model_transform(tokenizer, chat_format),
        filter_fn=filter_fn,
        split=split,
        max_seq_len=max_seq_len,
        # packing reads every example anyway, and leaves out those cut down to no label itself
        check_rows=RowCheck(columns=columns, find_cut_rows=not packed, advice=advice),
        **(load_dataset_kwargs or {}),
    )
    return maybe_pack(
        ds, tokenizer, packed=packed, best_fit=best_fit, settings={**settings, "chat_format": chat_format}
    )


def maybe_pack(
    ds: Any,
    tokenizer: Any,
    *,
    packed: bool,
    settings: Mapping[str, Any],
    best_fit: bool = False,
    split_across_pack: bool = False,
) -> Any:
    """``ds``, or with ``packed`` a ``PackedDataset`` of it: packs of ``ds.max_seq_len`` tokens (the dataset's
    ``max_seq_len``, else the tokenizer's), padded with the tokenizer's pad id, cached next to the dataset's
    cache files (``_pack_cache``; ``settings`` and the transforms' code are part of the key).

    torchtune pads its packs with id 0; the pad id only fills the padding, which is a block of its own with
    -100 labels, so the losses are the same, and the recipe's count of real tokens (``tokens != pad_id``)
    stays right.

    Raises:
        TuneValueError: no ``max_seq_len`` on the dataset or the tokenizer.
    """
    if not packed:
        return ds
    length = _pack_length(tokenizer, getattr(ds, "max_seq_len", None))
    pad = padding_idx(tokenizer)
    packing = {"max_seq_len": length, "padding_idx": pad, "split_across_pack": split_across_pack, "best_fit": best_fit}
    code = [ds, getattr(ds, "_message_transform", None), getattr(ds, "_model_transform", None)]
    cache_file = pack_cache_file(
        getattr(ds, "_data", None),
        {**settings, "max_seq_len": getattr(ds, "max_seq_len", None)},
        [obj for obj in code if obj is not None],
        tokenizer,
        packing=packing,
    )
    return PackedDataset(ds, **packing, cache_file=cache_file)


def _pack_length(tokenizer: Any, max_seq_len: Optional[int]) -> int:
    length = max_seq_len if max_seq_len is not None else getattr(tokenizer, "max_seq_len", None)
    if length is None:
        raise TuneValueError(
            "PackedDataset requires a max_seq_len to be set on the tokenizer (tokenizer.max_seq_len) or the "
            "dataset (dataset.max_seq_len): it is the length of every pack."
        )
    return int(length)


def padding_idx(tokenizer: Any) -> int:
    """The id batches and packs are padded with: the tokenizer's pad id, else 0."""
    pad = getattr(tokenizer, "pad_id", None)
    return int(pad) if pad is not None and pad >= 0 else 0


def check_dataset_args(key: str, fields: Mapping[str, Any]) -> None:
    """The value checks of the dataset builders' arguments (``config.validate`` runs them before anything
    is built): ``max_seq_len`` holds BOS and EOS, a source is named, ``chat_format`` is one there is."""
    whole_number(f"{key}.max_seq_len", fields.get("max_seq_len"), minimum=2, allow_none=True, why=" (BOS and EOS)")
    source = fields.get("source", "?")
    if isinstance(source, str) and not source.strip():
        raise ConfigError(
            f"{key}.source is empty: name a Hugging Face dataset (tatsu-lab/alpaca) or a file format with "
            f"its files ({key}.source=json {key}.data_files=/path/data.json)."
        )
    chat_format = fields.get("chat_format", "tokenizer")
    if chat_format not in CHAT_FORMATS:
        raise ConfigError(f"{key}.chat_format={chat_format!r} is not one of {', '.join(CHAT_FORMATS)}.")
