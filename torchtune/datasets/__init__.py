"""torchtune's datasets for finetuning (``SFTDataset`` and its builders: instruction, chat, free text),
packing, and the collate functions the recipes use.

Importing this package does not import ``datasets`` (that happens when a dataset is built).
"""

from torchtune.datasets._alpaca import alpaca_cleaned_dataset, alpaca_dataset
from torchtune.datasets._chat import chat_dataset
from torchtune.datasets._cnn_dailymail import cnn_dailymail_articles_dataset
from torchtune.datasets._collate import block_causal_mask, packed_collate, padded_collate
from torchtune.datasets._concat import ConcatDataset
from torchtune.datasets._grammar import grammar_dataset
from torchtune.datasets._instruct import instruct_dataset
from torchtune.datasets._loading import load_hf_dataset
from torchtune.datasets._packed import PackedDataset, collate_for
from torchtune.datasets._samsum import samsum_dataset
from torchtune.datasets._sft import SFTDataset
from torchtune.datasets._slimorca import slimorca_dataset
from torchtune.datasets._templates import (
    AlpacaInstructTemplate,
    FormatInstructTemplate,
    InstructTemplate,
    resolve_template,
)
from torchtune.datasets._text_completion import TextCompletionDataset, text_completion_dataset
from torchtune.datasets._wikitext import wikitext_dataset
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX  # re-exported: the label losses leave out

__all__ = [
    "AlpacaInstructTemplate",
    "CROSS_ENTROPY_IGNORE_IDX",
    "ConcatDataset",
    "FormatInstructTemplate",
    "InstructTemplate",
    "PackedDataset",
    "SFTDataset",
    "TextCompletionDataset",
    "alpaca_cleaned_dataset",
    "alpaca_dataset",
    "block_causal_mask",
    "chat_dataset",
    "cnn_dailymail_articles_dataset",
    "collate_for",
    "grammar_dataset",
    "instruct_dataset",
    "load_hf_dataset",
    "packed_collate",
    "padded_collate",
    "resolve_template",
    "samsum_dataset",
    "slimorca_dataset",
    "text_completion_dataset",
    "wikitext_dataset",
]
