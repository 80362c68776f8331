"""The SlimOrca dataset: ShareGPT-style conversations with a system prompt."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from torchtune.config._types import checked_by
from torchtune.datasets._build import check_dataset_args
from torchtune.datasets._chat import chat_dataset
from torchtune.datasets._columns import as_column_map
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._sft import SFTDataset

__all__ = ["slimorca_dataset"]


@checked_by(check_dataset_args)
def slimorca_dataset(
    tokenizer: Any,
    *,
    source: str = "Open-Orca/SlimOrca-Dedup",
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
    """``chat_dataset`` of ``Open-Orca/SlimOrca-Dedup``: ShareGPT conversations in the ``conversations``
    column (``column_map: {conversations: <column>}`` for another one; same arguments)."""
    columns = as_column_map(column_map) or {}
    return chat_dataset(
        tokenizer,
        source=source,
        conversation_column=columns.get("conversations", "conversations"),
        conversation_style="sharegpt",
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
