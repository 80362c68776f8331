"""WikiText: whole Wikipedia articles as free text."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from torchtune.config._types import checked_by
from torchtune.datasets._build import check_dataset_args
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._text_completion import TextCompletionDataset, text_completion_dataset

__all__ = ["wikitext_dataset"]


@checked_by(check_dataset_args)
def wikitext_dataset(
    tokenizer: Any,
    source: str = "EleutherAI/wikitext_document_level",
    subset: str = "wikitext-103-v1",
    max_seq_len: Optional[int] = None,
    packed: bool = False,
    filter_fn: Optional[Callable] = None,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> Union[TextCompletionDataset, PackedDataset]:
    """The ``page`` column of ``EleutherAI/wikitext_document_level`` (configuration ``subset``) as a
    ``text_completion_dataset``; ``max_seq_len`` cuts each page, and is the pack length with ``packed``."""
    return text_completion_dataset(
        tokenizer,
        source,
        column="page",
        packed=packed,
        split=split,
        filter_fn=filter_fn,
        max_seq_len=max_seq_len,
        name=subset,
        **load_dataset_kwargs,
    )
