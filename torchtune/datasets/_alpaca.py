"""The Alpaca instruction dataset (``tatsu-lab/alpaca`` and files in its format)."""

from __future__ import annotations

from typing import Any, Optional

from torch.utils.data import Dataset

from torchtune.config._types import checked_by
from torchtune.datasets._instruct import Tokenizer, check_dataset_args, instruct_dataset
from torchtune.datasets._templates import AlpacaInstructTemplate


@checked_by(check_dataset_args)
def alpaca_dataset(
    tokenizer: Tokenizer,
    source: str = "tatsu-lab/alpaca",
    train_on_input: bool = True,
    max_seq_len: Optional[int] = 512,  # null: the tokenizer's max_seq_len, else no limit
    packed: bool = False,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> Dataset:
    """Alpaca rows (``instruction``, ``input``, ``output``) with Alpaca's prompts.

    Offline, use a local copy: ``source="json", data_files="alpaca_data.json"`` (config
    ``dataset.source=json dataset.data_files=/path/alpaca_data.json``). ``packed=True`` returns a
    ``PackedDataset`` of ``max_seq_len``-token sequences. Other keyword arguments (``column_map``,
    ``cache_dir``, ...) go to ``instruct_dataset`` / ``datasets.load_dataset``.
    """
    return instruct_dataset(
        tokenizer,
        source,
        AlpacaInstructTemplate,
        train_on_input=train_on_input,
        max_seq_len=max_seq_len,
        packed=packed,
        split=split,
        **load_dataset_kwargs,
    )
