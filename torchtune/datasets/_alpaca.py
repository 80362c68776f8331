"""The Alpaca instruction dataset (``tatsu-lab/alpaca`` and files in its format)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from torchtune.config._types import checked_by
from torchtune.data._messages import AlpacaToMessages
from torchtune.datasets._build import build_sft_dataset, check_dataset_args
from torchtune.datasets._columns import FieldColumns, as_column_map
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._sft import SFTDataset

__all__ = ["AlpacaToMessages", "alpaca_cleaned_dataset", "alpaca_dataset"]


@checked_by(check_dataset_args)
def alpaca_dataset(
    tokenizer: Any,
    *,
    source: str = "tatsu-lab/alpaca",
    column_map: Optional[Dict[str, str]] = None,
    train_on_input: bool = True,
    packed: bool = False,
    filter_fn: Optional[Callable] = None,
    split: str = "train",
    max_seq_len: Optional[int] = None,
    chat_format: str = "tokenizer",
    best_fit: bool = False,
    **load_dataset_kwargs: Any,
) -> Union[SFTDataset, PackedDataset]:
    """Alpaca rows (``instruction``, optional ``input``, ``output``) as a user message in Stanford Alpaca's
    prompt (``AlpacaToMessages``) and an assistant message, tokenized by the model tokenizer with its own
    prompt template or chat format (torchtune's; ``chat_format: plain_text`` encodes the prompt and the
    response as they are, BOS first and EOS last). ``train_on_input=False`` leaves the prompt out of the loss.

    torchtune's arguments, then this library's (not passed to ``datasets.load_dataset``):

    Args:
        tokenizer: the model tokenizer (config node ``tokenizer``).
        source: dataset name, file builder (``json`` with ``data_files=...``) or the path of one data file.
            Offline, use a local copy: ``source: json``, ``data_files: alpaca_data.json``.
        column_map: ``{field: column}`` for data that names ``instruction`` / ``input`` / ``output``
            differently, e.g. ``{instruction: prompt, output: answer}``.
        train_on_input: also learn the prompt (torchtune's default, True).
        packed: pack examples into sequences of ``max_seq_len`` tokens (``PackedDataset``).
        filter_fn: keeps the rows for which it returns True, before anything else.
        split: the split to load.
        max_seq_len: longest example; default the tokenizer's ``max_seq_len`` (torchtune's), None for no
            limit. Also the length of a pack.
        chat_format: ``tokenizer`` (torchtune's), ``chat_template`` or ``plain_text``
            (``torchtune.datasets._model_transform``).
        best_fit: with ``packed``, this library's best-fit packing instead of torchtune's greedy one.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ``cache_dir`` ...).

    Raises:
        TuneError: unreadable data, missing columns (with the ``column_map`` to set), a null or non-text
            ``instruction``/``output`` in any row, no row with anything to learn, or ``packed`` without a
            ``max_seq_len``.
    """
    columns = as_column_map(column_map)
    return build_sft_dataset(
        tokenizer,
        AlpacaToMessages(train_on_input=train_on_input, column_map=columns),
        source=source,
        columns=FieldColumns(
            ["instruction", "output"], ["input"], columns, reader="Alpaca's prompt (torchtune.data.AlpacaToMessages)"
        ),
        settings={"dataset": "alpaca", "column_map": columns, "train_on_input": train_on_input},
        chat_format=chat_format,
        max_seq_len=max_seq_len,
        packed=packed,
        best_fit=best_fit,
        filter_fn=filter_fn,
        split=split,
        load_dataset_kwargs=load_dataset_kwargs,
    )


@checked_by(check_dataset_args)
def alpaca_cleaned_dataset(
    tokenizer: Any,
    *,
    source: str = "yahma/alpaca-cleaned",
    column_map: Optional[Dict[str, str]] = None,
    train_on_input: bool = True,
    packed: bool = False,
    filter_fn: Optional[Callable] = None,
    split: str = "train",
    max_seq_len: Optional[int] = None,
    chat_format: str = "tokenizer",
    best_fit: bool = False,
    **load_dataset_kwargs: Any,
) -> Union[SFTDataset, PackedDataset]:
    """``alpaca_dataset`` of the cleaned Alpaca data, ``yahma/alpaca-cleaned`` (same arguments)."""
    return alpaca_dataset(
        tokenizer,
        source=source,
        column_map=column_map,
        train_on_input=train_on_input,
        packed=packed,
        filter_fn=filter_fn,
        split=split,
        max_seq_len=max_seq_len,
        chat_format=chat_format,
        best_fit=best_fit,
        **load_dataset_kwargs,
    )
