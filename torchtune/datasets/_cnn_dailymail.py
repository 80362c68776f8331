"""CNN / DailyMail news articles as free text."""

from __future__ import annotations

from typing import Any, Callable, Optional

from torchtune.config._types import checked_by
from torchtune.datasets._build import check_dataset_args
from torchtune.datasets._text_completion import TextCompletionDataset

__all__ = ["cnn_dailymail_articles_dataset"]


@checked_by(check_dataset_args)
def cnn_dailymail_articles_dataset(
    tokenizer: Any,
    source: str = "ccdv/cnn_dailymail",
    max_seq_len: Optional[int] = None,
    filter_fn: Optional[Callable] = None,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> TextCompletionDataset:
    """The ``article`` column of ``ccdv/cnn_dailymail`` (its configuration ``3.0.0``) as a
    ``TextCompletionDataset``; ``max_seq_len`` cuts each article (torchtune passes it on to ``load_dataset``,
    which has no use for it)."""
    return TextCompletionDataset(
        tokenizer,
        source,
        column="article",
        filter_fn=filter_fn,
        max_seq_len=max_seq_len,
        split=split,
        name="3.0.0",
        **load_dataset_kwargs,
    )
