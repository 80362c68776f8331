"""A grammar-correction dataset: a sentence with errors as the prompt, the corrected sentence as the response."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from torchtune.config._types import checked_by
from torchtune.datasets._build import check_dataset_args
from torchtune.datasets._instruct import instruct_dataset
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._sft import SFTDataset

__all__ = ["grammar_dataset"]


@checked_by(check_dataset_args)
def grammar_dataset(
    tokenizer: Any,
    *,
    source: str = "liweili/c4_200m",
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
    """``instruct_dataset`` of ``liweili/c4_200m``: ``input`` the sentence to correct, ``output`` the correct
    one (same arguments). A prompt around the sentence comes from the tokenizer's prompt template, e.g.
    ``tokenizer.prompt_template: torchtune.data.GrammarErrorCorrectionTemplate``."""
    return instruct_dataset(
        tokenizer,
        source=source,
        column_map=column_map,
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
