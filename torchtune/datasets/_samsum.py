"""The SAMSum summarization dataset: a dialogue as the prompt, its summary as the response."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from torchtune.config._types import checked_by
from torchtune.datasets._build import check_dataset_args
from torchtune.datasets._instruct import instruct_dataset
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._sft import SFTDataset

__all__ = ["samsum_dataset"]


@checked_by(check_dataset_args)
def samsum_dataset(
    tokenizer: Any,
    *,
    source: str = "Samsung/samsum",
    column_map: Optional[Dict[str, str]] = None,
    train_on_input: bool = False,
    new_system_prompt: Optional[str] = None,
    packed: bool = False,
    filter_fn: Optional[Callable] = None,
    split: str = "train",
    max_seq_len: Optional[int] = None,
    chat_format: str = "tokenizer",
    best_fit: bool = False,
    **load_dataset_kwargs: Any,
) -> Union[SFTDataset, PackedDataset]:
    """``instruct_dataset`` of ``Samsung/samsum``: the ``dialogue`` column is the prompt, ``summary`` the
    response (``column_map`` default ``{input: dialogue, output: summary}``; same arguments). A prompt around
    the dialogue comes from the tokenizer's prompt template, e.g. ``torchtune.data.SummarizeTemplate``."""
    return instruct_dataset(
        tokenizer,
        source=source,
        column_map=column_map or {"input": "dialogue", "output": "summary"},
        train_on_input=train_on_input,
        new_system_prompt=new_system_prompt,
        packed=packed,
        filter_fn=filter_fn,
        split=split,
        max_seq_len=max_seq_len,
        chat_format=chat_format,
        best_fit=best_fit,
        **load_dataset_kwargs,
    )
